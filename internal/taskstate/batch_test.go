package taskstate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// A batch's counter is read on its callback's key, and the cancel of a batch
// reads its children on delayq_outbox_batch_idx, not the outbox whole (50,000
// rows, 1,000 of them in the batch; 5,000 batches).
func TestBatchQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, batch_id, state)
SELECT 'q', 't' || i, now(), '', 3, CASE WHEN i <= 1000 THEN 1 END, CASE WHEN i <= 1000 THEN 'pending' ELSE 'done' END
FROM generate_series(1, 50000) AS i;
INSERT INTO delayq_batches (id, queue, task_id, total, remaining, channel)
SELECT i, 'cb', CASE WHEN i = 1 THEN 'c' ELSE 'c' || i END, 1000, 1000, 'delayq_outbox' FROM generate_series(1, 5000) AS i;
ANALYZE delayq_outbox; ANALYZE delayq_batches`)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStatements(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	for _, tc := range []struct {
		name, sql, index string
		args             []any
	}{
		{"counter", s.BatchRow, "delayq_batches_callback_key", []any{"cb", "c"}},
		{"cancel", s.CancelBatch, "delayq_outbox_batch_idx", []any{int64(1), "cb", "c"}},
	} {
		p := explain(t, ctx, pool, tc.sql, tc.args...)
		if !strings.Contains(p, tc.index) || strings.Contains(p, "Seq Scan on delayq_outbox") {
			t.Errorf("%s: plan does not use %s alone:\n%s", tc.name, tc.index, p)
		}
	}
}
