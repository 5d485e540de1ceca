package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestRun runs the demo on servers it is given, small: every guarantee holds,
// the report says so, and the demo leaves no schema and no key behind.
func TestRun(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	redisURL := testenv.OwnRedis(t).URL()
	var out bytes.Buffer
	rep, err := Run(context.Background(), Config{DatabaseURL: dbURL, RedisURL: redisURL,
		Orders: 400, Spread: time.Second, Out: &out})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if rep.Enqueued != 380 || rep.RolledBack != 20 || rep.Duplicates != 16 {
		t.Errorf("enqueued %d, rolled back %d, duplicates %d; want 380, 20, 16", rep.Enqueued, rep.RolledBack, rep.Duplicates)
	}
	if rep.Dead != 3 || rep.Done != 377 || rep.Effects != 377 {
		t.Errorf("dead %d, done %d, effects %d; want 3, 377, 377", rep.Dead, rep.Done, rep.Effects)
	}
	if rep.Retried < 40 {
		t.Errorf("retried %d; flaky and doomed orders fail at least 40 runs", rep.Retried)
	}
	if !strings.Contains(out.String(), "all guarantees held") {
		t.Errorf("report does not say the guarantees held:\n%s", out.String())
	}

	pool := testenv.Pool(t, dbURL)
	var schemas int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'delayq_demo_%'`).Scan(&schemas); err != nil || schemas != 0 {
		t.Errorf("demo schemas left: %d (%v)", schemas, err)
	}
	rdb := testenv.RedisClient(t, redisURL)
	if n := rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("demo left %d Redis keys", n)
	}
}

// TestReportCheck: a report that breaks a guarantee says which.
func TestReportCheck(t *testing.T) {
	t.Parallel()
	bad := Report{Enqueued: 10, Done: 9, Dead: 1, ExpectedDead: 1, Effects: 10, Early: 1, RolledBackRun: 2}
	err := bad.Check()
	if err == nil {
		t.Fatal("broken report passed")
	}
	for _, want := range []string{"effects applied 10 != tasks done 9", "2 rolled-back tasks ran", "1 tasks started before"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check() = %v, want it to mention %q", err, want)
		}
	}
}
