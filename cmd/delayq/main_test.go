package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/delayq/delayq/internal/tempserver/fakedocker"
	"github.com/delayq/delayq/internal/testenv"
)

// TestMain shares the test servers of the package's tests and checks for leaked
// goroutines at the end; it removes the command built for the tests.
func TestMain(m *testing.M) {
	fakedocker.Main() // this binary is the docker command of dev's Docker test
	testenv.Main(m, func() {
		if builtCLI.dir != "" {
			os.RemoveAll(builtCLI.dir)
		}
	})
}

// builtCLI is the command built once for the tests that run it as a process:
// each build links the whole binary again (seconds of CPU), the build cache
// notwithstanding.
var builtCLI struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// cliBinary returns the path of the command built from this package.
func cliBinary(t *testing.T) string {
	t.Helper()
	builtCLI.once.Do(func() {
		goBin, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
		if err != nil {
			builtCLI.err = err
			return
		}
		if builtCLI.dir, builtCLI.err = os.MkdirTemp("", "delayq-cmd-test-"); builtCLI.err != nil {
			return
		}
		builtCLI.path = filepath.Join(builtCLI.dir, "delayq")
		builtCLI.out, builtCLI.err = exec.Command(goBin, "build", "-o", builtCLI.path, ".").CombinedOutput()
	})
	if builtCLI.err != nil {
		t.Fatalf("go build: %v\n%s", builtCLI.err, builtCLI.out)
	}
	return builtCLI.path
}
