package securitytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// ctxT is a context that ends with the test, or after d.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// discard is a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// syncBuffer is a buffer safe to read while a process or a logger writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond every 20ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noSecret fails the test if out holds any of the secrets.
func noSecret(t *testing.T, what, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s shows the password %q:\n%s", what, s, out)
		}
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// delayqBinary builds cmd/delayq once per test binary.
func delayqBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		goBin, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
		if err != nil {
			binErr = err
			return
		}
		dir, err := os.MkdirTemp("", "delayq-sec-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "delayq")
		out, err := exec.Command(goBin, "build", "-o", binPath, "../../cmd/delayq").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cmdResult is what one run of the binary printed and returned.
type cmdResult struct {
	code           int
	stdout, stderr string
}

func (r cmdResult) out() string { return r.stdout + r.stderr }

// binEnv is the environment of a command: PATH and HOME, and env, nothing else.
func binEnv(env map[string]string) []string {
	out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// runBin runs the binary to the end (at most a minute).
func runBin(t *testing.T, env map[string]string, stdin string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, delayqBinary(t), args...)
	cmd.Env = binEnv(env)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return cmdResult{code: code, stdout: out.String(), stderr: errOut.String()}
}

// daemon is the binary running in the background (relay, worker).
type daemon struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

// startBin starts a long-running command; it is killed when the test ends if it
// is still running.
func startBin(t *testing.T, env map[string]string, args ...string) *daemon {
	t.Helper()
	d := &daemon{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(delayqBinary(t), args...)
	d.cmd.Env = binEnv(env)
	d.cmd.Stdout, d.cmd.Stderr = d.stdout, d.stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

func (d *daemon) out() string { return d.stdout.String() + d.stderr.String() }

// waitLog waits until the output matches re and returns the first submatch (or
// the match).
func (d *daemon) waitLog(t *testing.T, timeout time.Duration, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var m []string
	deadline := time.Now().Add(timeout)
	for {
		if m = rx.FindStringSubmatch(d.out()); m != nil {
			break
		}
		select {
		case <-d.done:
			t.Fatalf("%v exited (%v) before logging %q:\n%s", d.cmd.Args[1:], d.err, re, d.out())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v did not log %q within %v:\n%s", d.cmd.Args[1:], re, timeout, d.out())
		}
	}
	if len(m) > 1 {
		return m[1]
	}
	return m[0]
}

// stop sends SIGTERM and returns the exit code.
func (d *daemon) stop(t *testing.T) int {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(45 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Fatalf("%v did not stop within 45s of SIGTERM:\n%s", d.cmd.Args[1:], d.out())
	}
	return d.cmd.ProcessState.ExitCode()
}
