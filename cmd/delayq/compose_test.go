package main

import (
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type composeService struct {
	Image string `yaml:"image"`
	Build any    `yaml:"build"` // "." or {context, target}
	// Command is the container's command: for the delayq image, the arguments
	// after its /delayq entry point.
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

// buildTarget is the Dockerfile stage a service builds ("" for the last one),
// and whether it builds at all.
func (s composeService) buildTarget() (string, bool) {
	switch b := s.Build.(type) {
	case string:
		return "", b == "."
	case map[string]any:
		ctx, _ := b["context"].(string)
		target, _ := b["target"].(string)
		return target, ctx == "."
	}
	return "", false
}

// TestComposeFile checks compose.yaml against the Dockerfile and the binary: the
// delayq services build the Dockerfile's image and run commands and flags that
// exist; the relay listens on every interface on the port the image exposes and
// health-checks, and publishes it; the relay and the worker start after the
// migration succeeded; the URLs name the compose services, with the database
// credentials PostgreSQL is started with.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cf struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &cf); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"postgres", "redis", "migrate", "relay", "payment"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("compose.yaml has no service %q", name)
		}
	}
	df := readDockerfile(t)
	var exposed string
	for _, in := range df.finalStage() {
		if in.cmd == "EXPOSE" {
			exposed = in.rest
		}
	}

	for _, name := range []string{"migrate", "relay"} {
		s := cf.Services[name]
		if target, ok := s.buildTarget(); !ok || target != "" {
			t.Errorf("service %s: build %v, want the Dockerfile's default image (build: .)", name, s.Build)
		}
		if len(s.Command) == 0 {
			t.Errorf("service %s: no command", name)
			continue
		}
		if _, ok := commands()[s.Command[0]]; !ok {
			t.Errorf("service %s runs delayq %q, which does not exist", name, s.Command[0])
			continue
		}
		help := commandHelp(t, s.Command[0])
		for _, a := range s.Command[1:] {
			if n, ok := strings.CutPrefix(a, "-"); ok {
				n, _, _ = strings.Cut(strings.TrimPrefix(n, "-"), "=")
				if !hasFlag(help, n) {
					t.Errorf("service %s: delayq %s has no flag --%s", name, s.Command[0], n)
				}
			}
		}
	}
	migrateCmd := cf.Services["migrate"].Command
	if !slices.Equal(migrateCmd, []string{"migrate", "up"}) {
		t.Errorf("service migrate runs %q, want migrate up", migrateCmd)
	}

	relay := cf.Services["relay"]
	host, port, err := net.SplitHostPort(flagValue(relay.Command, "listen", ""))
	if err != nil || (host != "" && host != "0.0.0.0") || port != exposed {
		t.Errorf("service relay: --listen %q, want :%s (every interface, the image's exposed and health-checked port)", flagValue(relay.Command, "listen", ""), exposed)
	}
	if !slices.ContainsFunc(relay.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) }) {
		t.Errorf("service relay publishes %v, not the admin port %s", relay.Ports, port)
	}

	payment := cf.Services["payment"]
	target, ok := payment.buildTarget()
	stages := regexp.MustCompile(`(?i) AS (\S+)$`)
	found := false
	for _, in := range df.instructions {
		if m := stages.FindStringSubmatch(in.rest); in.cmd == "FROM" && m != nil && m[1] == target {
			found = true
		}
	}
	if !ok || target == "" || !found {
		t.Errorf("service payment: build %v: want a target stage of the Dockerfile", payment.Build)
	}
	src, err := os.ReadFile("../../examples/payment/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(payment.Command) == 0 || !strings.Contains(string(src), `case "`+payment.Command[0]+`":`) {
		t.Errorf("service payment runs %q, which examples/payment does not know", payment.Command)
	}

	for _, name := range []string{"relay", "payment"} {
		if c := cf.Services[name].DependsOn["migrate"].Condition; c != "service_completed_successfully" {
			t.Errorf("service %s: depends on migrate with %q, want service_completed_successfully", name, c)
		}
	}
	pg := cf.Services["postgres"].Environment
	for _, name := range []string{"migrate", "relay", "payment"} {
		env := cf.Services[name].Environment
		db, err := url.Parse(env["DATABASE_URL"])
		if err != nil || db.Hostname() != "postgres" {
			t.Errorf("service %s: DATABASE_URL %q does not name the postgres service", name, env["DATABASE_URL"])
		} else if pw, _ := db.User.Password(); db.User.Username() != pg["POSTGRES_USER"] || pw != pg["POSTGRES_PASSWORD"] || db.Path != "/"+pg["POSTGRES_DB"] {
			t.Errorf("service %s: DATABASE_URL's user, password or database differ from the postgres service's", name)
		}
		if r, err := url.Parse(env["REDIS_URL"]); err != nil || r.Hostname() != "redis" {
			t.Errorf("service %s: REDIS_URL %q does not name the redis service", name, env["REDIS_URL"])
		}
	}
}
