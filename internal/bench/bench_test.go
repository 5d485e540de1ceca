package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestWorkloads runs every workload once at a tiny size so none can rot. It
// checks the counts each workload verifies (every task relayed, run, done),
// never speed.
func TestWorkloads(t *testing.T) {
	t.Parallel()
	// recovery runs the delayq binary as the worker process it kills.
	bin := filepath.Join(t.TempDir(), "delayq")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/delayq").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range Workloads() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name == "bounds" && os.Getenv("CI") == "" {
				// Servers from Docker come without the client tools; CI installs them.
				_, err1 := findPgbench()
				_, err2 := findRedisBenchmark()
				if err := errors.Join(err1, err2); err != nil {
					t.Skipf("no pgbench or redis-benchmark here (CI runs it): %v", err)
				}
			}
			// A Redis of its own: idle counts the server's commands, relay changes
			// its keyspace-event setting.
			env := Env{DatabaseURL: testenv.PostgresURL(t), RedisURL: testenv.OwnRedis(t).URL(), Scale: 0.001, WorkerBinary: bin}
			res, err := Run(context.Background(), env, name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(res.Figures) == 0 {
				t.Fatalf("%s: no figures", name)
			}
			for _, f := range res.Figures {
				// An overhead is a difference: at this size, noise may make it
				// negative (the keyed claims cheaper than the plain ones).
				if f.Value < 0 && !strings.HasSuffix(f.Name, "_overhead") {
					t.Errorf("%s: %s = %v", name, f.Name, f.Value)
				}
			}
		})
	}
	if _, err := Run(context.Background(), Env{}, "no-such-workload"); err == nil {
		t.Fatal("unknown workload accepted")
	}
}

// A full run is every workload but soak, prune, enqueue-tx-held-off and multi-db,
// which run only by name; bounds comes last.
func TestFullRun(t *testing.T) {
	t.Parallel()
	all, full := Workloads(), FullRun()
	byName := []string{"soak", "prune", "enqueue-tx-held-off", "multi-db"}
	for _, n := range byName {
		if !slices.Contains(all, n) || slices.Contains(full, n) {
			t.Errorf("Workloads() = %v, FullRun() = %v: want %s in the first only", all, full, n)
		}
	}
	if len(full) != len(all)-len(byName) {
		t.Errorf("Workloads() = %v, FullRun() = %v: want all but %d in the second", all, full, len(byName))
	}
	if full[0] != "enqueue-tx" || full[len(full)-1] != "bounds" {
		t.Errorf("FullRun() = %v: want enqueue-tx first, bounds last", full)
	}
}
