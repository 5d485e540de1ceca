//go:build unix

package delayqtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/tempserver"
)

// Without URLs and binaries, New's one message names both ways out.
func TestNoServersMessage(t *testing.T) {
	t.Parallel()
	msg := noServers(fmt.Errorf("%w: PostgreSQL: no local initdb", tempserver.ErrNoServer))
	for _, want := range []string{EnvPostgresURL, EnvRedisURL, "apt-get install postgresql redis-server", "brew install", "/usr/lib/postgresql/*/bin"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "make") || strings.Contains(msg, "DATABASE_URL") {
		t.Errorf("message %q speaks of delayq's own checkout", msg)
	}
}

// The files of a test process that ended without Main go with the next start;
// those of a process that runs stay.
func TestRemoveOrphans(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dirs := map[int]string{ended.Process.Pid: "", os.Getppid(): ""}
	for pid := range dirs {
		d, err := os.MkdirTemp("", "delayqtest-")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, pidFile), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[pid] = d
	}
	removeOrphans()
	if _, err := os.Stat(dirs[ended.Process.Pid]); !os.IsNotExist(err) {
		t.Errorf("the ended process's directory: %v", err)
	}
	if _, err := os.Stat(dirs[os.Getppid()]); err != nil {
		t.Errorf("the running process's directory: %v", err)
	}
}
