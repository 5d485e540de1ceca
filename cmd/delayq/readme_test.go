package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// readmeCommands returns the `delayq …` command lines of the README's sh blocks,
// with leading VAR=value assignments split off.
func readmeCommands(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var cmds [][]string
	inSh := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		if !inSh {
			continue
		}
		if i := strings.Index(line, "  #"); i >= 0 {
			line = line[:i]
		}
		fields := shellFields(line)
		for len(fields) > 0 && strings.Contains(fields[0], "=") {
			fields = fields[1:] // the environment, set by the test instead
		}
		if len(fields) > 1 && fields[0] == "delayq" {
			cmds = append(cmds, fields[1:])
		}
	}
	return cmds
}

// shellFields splits a command line on spaces, honouring single quotes.
func shellFields(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, has := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			inQuote, has = !inQuote, true
		case r == ' ' && !inQuote:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteRune(r)
			has = true
		}
	}
	if has {
		out = append(out, cur.String())
	}
	return out
}

// TestREADMECommands runs every `delayq` command the README shows, in order,
// against real servers, so the README stays true. Long-running commands (relay)
// run for a moment and must stop cleanly. `delayq check` exits 1 when the stores
// disagree; after the README's reconcile they agree, so every command must exit 0.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	cmds := readmeCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("found %d delayq commands in README.md; the parser or the README changed", len(cmds))
	}
	env := map[string]string{"DATABASE_URL": testenv.EmptyPostgresURL(t), "REDIS_URL": testenv.RedisURL(t)}
	_, prefix := testenv.Redis(t)
	getenv := func(k string) string { return env[k] }
	for _, args := range cmds {
		switch args[0] {
		case "migrate", "reconcile", "check", "stats", "dead", "enqueue", "reschedule", "cancel", "relay", "dev", "workers", "task", "queue":
		default:
			t.Fatalf("README shows `delayq %s`, which this test does not know how to run", strings.Join(args, " "))
		}
		// The test's own key prefix, so it cannot touch other tests' keys (after
		// the action word for `dead`).
		at := 1
		if args[0] == "dead" {
			at = 2
		}
		if takesPrefix(args[:at]) {
			args = append(append(append([]string{}, args[:at]...), "--prefix", prefix), args[at:]...)
		}
		if args[0] == "relay" {
			args = append([]string{args[0], "--listen", ""}, args[1:]...)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr lockedBuffer
		done := make(chan int, 1)
		go func() { done <- NewMain(&stdout, &stderr, getenv).Run(ctx, args) }()
		var code int
		switch args[0] {
		case "relay": // a long-running sidecar: once it says it started, stop it
			code = waitStarted(t, done, &stderr, "relay: started")
			cancel()
		case "dev": // its servers, until Ctrl-C
			code = waitStarted(t, done, &stderr, "are running")
			cancel()
		}
		if args[0] != "relay" && args[0] != "dev" || code == -1 {
			code = <-done
		}
		cancel()
		if code != 0 {
			t.Fatalf("delayq %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout.String(), stderr.String())
		}
		if args[0] == "migrate" {
			// The README's dead-letter commands act on order-1001: make it dead.
			pool := testenv.Pool(t, env["DATABASE_URL"])
			_, err := pool.Exec(context.Background(), `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, state, attempt, max_attempts, last_error)
				VALUES ('payment', 'order-1001', now(), '', 'dead', 3, 3, 'card declined')`)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// waitStarted waits until stderr holds the line that says the command started
// and returns -1, or returns the command's exit code if it ended first.
func waitStarted(t *testing.T, done <-chan int, stderr *lockedBuffer, started string) int {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for !strings.Contains(stderr.String(), started) {
		select {
		case code := <-done:
			return code
		case <-deadline:
			t.Fatalf("no %q in a minute; stderr: %s", started, stderr.String())
		case <-tick.C:
		}
	}
	return -1
}

// takesPrefix reports whether the (sub)command has a --prefix flag, from its help.
func takesPrefix(cmd []string) bool {
	var out bytes.Buffer
	NewMain(&out, &out, func(string) string { return "" }).Run(context.Background(), append(slices.Clone(cmd), "--help"))
	return strings.Contains(out.String(), "-prefix")
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader in two goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHelpHidesPasswords: --help shows the environment's URLs as defaults, with
// their passwords redacted.
func TestHelpHidesPasswords(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://app:hunter2@db/app", "REDIS_URL": "redis://u:hunter2@cache:6379"}
	for name := range commands() {
		var out bytes.Buffer
		NewMain(&out, &out, func(k string) string { return env[k] }).Run(context.Background(), []string{name, "--help"})
		if strings.Contains(out.String(), "hunter2") {
			t.Errorf("delayq %s --help prints a password:\n%s", name, out.String())
		}
	}
}

// TestTaskEnvironWithoutURLs: a task command run by `delayq worker --exec` does
// not get the servers' URLs (or their passwords).
func TestTaskEnvironWithoutURLs(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:hunter2@db/app")
	t.Setenv("REDIS_URL", "redis://u:hunter2@cache:6379")
	t.Setenv("DELAYQ_KEEP_ME", "yes")
	env := strings.Join(taskEnviron(), "\n")
	if strings.Contains(env, "hunter2") || !strings.Contains(env, "DELAYQ_KEEP_ME=yes") {
		t.Fatalf("task environment:\n%s", env)
	}
}

// TestREADMEInstall runs the README's install lines against this checkout: the
// module path of `go get` is this module's, and the package of `go install` builds
// into a GOBIN of its own and runs. (The @version is the one thing not tried: no
// network is needed, and the checkout is what a release would tag.) Under -short the
// package is only listed: TestBinary builds and runs it.
func TestREADMEInstall(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-m", "-f", "{{.Path}}")
	list.Env = append(os.Environ(), "GOWORK=off") // this module, not the workspace's
	mod, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	module := strings.TrimSpace(string(mod))
	var got, installed bool
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) != 3 || fields[0] != "go" {
			continue
		}
		path, version, ok := strings.Cut(fields[2], "@")
		if !ok || version == "" {
			t.Errorf("README: %q: no @version", line)
			continue
		}
		switch fields[1] {
		case "get":
			got = true
			if path != module {
				t.Errorf("README: %q: module %s, want %s", line, path, module)
			}
		case "install":
			installed = true
			rel, ok := strings.CutPrefix(path, module+"/")
			if !ok {
				t.Errorf("README: %q: %s is not a package of %s", line, path, module)
				continue
			}
			if testing.Short() {
				// TestBinary builds and runs the same package: here the package
				// only has to exist (a second link of the binary costs seconds).
				list := exec.Command("go", "list", "./"+rel)
				list.Dir = "../.."
				if out, err := list.CombinedOutput(); err != nil {
					t.Errorf("%s (as go list ./%s): %v\n%s", line, rel, err, out)
				}
				continue
			}
			bin := t.TempDir()
			cmd := exec.Command("go", "install", "./"+rel)
			cmd.Dir = "../.."
			cmd.Env = append(os.Environ(), "GOBIN="+bin)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s (as go install ./%s): %v\n%s", line, rel, err, out)
			}
			out, err := exec.Command(filepath.Join(bin, filepath.Base(rel)), "version").CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), "delayq ") {
				t.Errorf("the installed binary's version: %q, %v", out, err)
			}
		}
	}
	if !got || !installed {
		t.Errorf("README: go get line %v, go install line %v: want both", got, installed)
	}
}
