package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// forbiddenInBinary are packages the relay and CLI binary must not link: the
// Docker client and the test environment belong to the development build
// (-tags delayqdev: make demo, make bench) and the dev module only. (The
// release binary links internal/tempserver for `delayq dev`: local binaries,
// nothing beyond pgx and go-redis.)
var forbiddenInBinary = []string{
	"github.com/ory/dockertest/v3",
	"github.com/delayq/delayq/internal/testenv",
	"testing",
}

// goListDeps lists the packages the command depends on, built with tags.
func goListDeps(t *testing.T, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, ".")...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	return strings.Fields(string(out))
}

// TestLeanBinary: the binary built as it is (go build ./cmd/delayq, the
// Dockerfile) depends on none of forbiddenInBinary, and the development build
// does link the test servers (so this test would notice the tag stopped
// mattering).
func TestLeanBinary(t *testing.T) {
	t.Parallel()
	deps := goListDeps(t, "")
	for _, p := range forbiddenInBinary {
		for _, d := range deps {
			if d == p || strings.HasPrefix(d, p+"/") {
				t.Errorf("cmd/delayq depends on %s: the release binary must not link it (move its user behind -tags %s)", d, devTag)
			}
		}
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/docker/") || strings.HasPrefix(d, "github.com/moby/") {
			t.Errorf("cmd/delayq depends on %s (a Docker client package)", d)
		}
	}
	if dev := goListDeps(t, devTag); !slices.Contains(dev, "github.com/delayq/delayq/internal/tempserver") {
		t.Errorf("-tags %s: cmd/delayq does not depend on internal/tempserver; demo's throwaway servers and bench are gone?", devTag)
	}
}

// TestLeanLibraries: the packages applications import (every package of the module
// outside cmd/, internal/ and examples/: outbox, delayq, worker, relay, reconcile,
// migrations, schedule, the test kit, the OpenTelemetry adapter (its own module,
// listed through go.work), and any added later) depend on no throwaway test
// server, no dockertest and no Docker client, and only the adapter on
// OpenTelemetry.
// The test kit alone may link internal/tempserver, which starts local server
// binaries and needs nothing beyond pgx and go-redis (it adds no module to a
// user's go.sum): delayqtest starts servers when no URL is set.
func TestLeanLibraries(t *testing.T) {
	t.Parallel()
	list := exec.Command("go", "list", "github.com/delayq/delayq/...")
	list.Dir = "../.."
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var libs []string
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(p, "github.com/delayq/delayq/")
		if strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "internal/") || strings.HasPrefix(rel, "examples/") {
			continue
		}
		libs = append(libs, p)
	}
	for _, want := range []string{"outbox", "delayq", "relay", "migrations"} {
		if !slices.Contains(libs, "github.com/delayq/delayq/"+want) {
			t.Fatalf("go list found no package %s among %v", want, libs)
		}
	}
	for _, lib := range libs {
		deps := exec.Command("go", "list", "-deps", lib)
		deps.Dir = "../.."
		out, err := deps.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", lib, err)
		}
		for _, d := range strings.Fields(string(out)) {
			switch {
			case d == "github.com/ory/dockertest/v3" || strings.HasPrefix(d, "github.com/ory/dockertest/v3/"),
				strings.HasPrefix(d, "github.com/docker/"), strings.HasPrefix(d, "github.com/moby/"),
				d == "github.com/delayq/delayq/internal/tempserver" && lib != "github.com/delayq/delayq/delayqtest",
				d == "github.com/delayq/delayq/internal/testenv":
				t.Errorf("%s depends on %s: a library package must not (applications would link it)", lib, d)
			}
			if strings.HasPrefix(d, "go.opentelemetry.io/") && lib != "github.com/delayq/delayq/delayqotel" {
				t.Errorf("%s depends on %s: only the delayqotel adapter imports OpenTelemetry", lib, d)
			}
		}
	}
}

// forbiddenModules are modules the root module's go.mod must not require, even
// indirectly: with module graph pruning every module it lists lands in the go.sum
// of a service that imports any of our packages. They belong in the dev module
// (internal/dev: Docker fallback, browser tests) or, for OpenTelemetry, in
// delayqotel's own module, which requires the API alone.
var forbiddenModules = []string{
	"github.com/ory/dockertest",
	"github.com/docker/",
	"github.com/moby/",
	"github.com/containerd/",
	"github.com/opencontainers/",
	"github.com/chromedp/",
	"go.opentelemetry.io/", // the root has no OpenTelemetry at all: delayqotel is a module of its own
}

func forbiddenModule(path string) bool {
	for _, f := range forbiddenModules {
		if path == strings.TrimSuffix(f, "/") || strings.HasPrefix(path, f) ||
			(!strings.HasSuffix(f, "/") && strings.HasPrefix(path, f+"/")) {
			return true
		}
	}
	return false
}

// goModule runs the go command on the root module alone (GOWORK=off: the
// workspace would mix in the dev module's requirements).
func goModule(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return out
}

// TestModuleRequiresNoTestTools: the root module's go.mod requires none of
// forbiddenModules; for one it does, the error shows the import chain that pulls
// it in (go mod why -m). scripts/consumer-gosum.sh (make lint) checks the go.sum a
// consumer module really gets.
func TestModuleRequiresNoTestTools(t *testing.T) {
	t.Parallel()
	var mod struct {
		Require []struct {
			Path, Version string
			Indirect      bool
		}
	}
	if err := json.Unmarshal(goModule(t, "mod", "edit", "-json"), &mod); err != nil {
		t.Fatal(err)
	}
	if len(mod.Require) == 0 {
		t.Fatal("go mod edit -json: go.mod requires nothing?")
	}
	for _, r := range mod.Require {
		if !forbiddenModule(r.Path) {
			continue
		}
		how := "directly"
		if r.Indirect {
			how = "indirectly"
		}
		why := goModule(t, "mod", "why", "-m", r.Path)
		t.Errorf("go.mod requires %s %s (%s): every user of the library would get it in go.sum; "+
			"move its importer to internal/dev or delayqotel's module. Pulled in by:\n%s", r.Path, r.Version, how, why)
	}
}

// TestForbiddenModule: the prefix rules catch the modules they name and no other.
func TestForbiddenModule(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]bool{
		"github.com/ory/dockertest/v3":     true,
		"github.com/docker/docker":         true,
		"github.com/moby/term":             true,
		"github.com/chromedp/chromedp":     true,
		"go.opentelemetry.io/otel/sdk":     true,
		"github.com/dockerx/tool":          false,
		"github.com/jackc/pgx/v5":          false,
		"github.com/redis/go-redis/v9":     false,
		"go.uber.org/goleak":               false,
		"github.com/opencontainers/runc":   true,
		"github.com/containerd/continuity": true,
	} {
		if got := forbiddenModule(path); got != want {
			t.Errorf("forbiddenModule(%q) = %v, want %v", path, got, want)
		}
	}
}
