package securitytest

import (
	"os"
	"strings"
	"testing"
)

// TestSecurityDoc keeps docs/SECURITY.md's ACL lines equal to the ones the tests
// run with (prefix "dq") and the cluster commands, and mentions the admin
// server's defaults and the payload limit.
func TestSecurityDoc(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, u := range []struct {
		name, password string
		commands       []string
	}{
		{"delayq-relay", "RELAY_PASSWORD", relayCommands},
		{"delayq-worker", "WORKER_PASSWORD", workerCommands},
		{"delayq-operator", "OPERATOR_PASSWORD", operatorCommands},
	} {
		if line := aclLine(u.name, u.password, "dq", u.commands); !strings.Contains(doc, "\n"+line+"\n") {
			t.Errorf("docs/SECURITY.md lacks the tested ACL line:\n%s", line)
		}
	}
	for _, c := range clusterCommands {
		if !strings.Contains(doc, "`+"+c+"`") {
			t.Errorf("docs/SECURITY.md does not list the cluster command +%s", c)
		}
	}
	for _, s := range []string{"`127.0.0.1:9090`", "`127.0.0.1:9091`", "64 KiB"} {
		if !strings.Contains(doc, s) {
			t.Errorf("docs/SECURITY.md does not mention %s", s)
		}
	}
}
