package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// memory measures what a scheduled task costs: Redis used_memory delta per task
// once relayed, and pg_total_relation_size per outbox row (after VACUUM, the steady
// state once autovacuum has run).
func memory(ctx context.Context, s *session, r *Result) error {
	n := s.n(100_000)
	r.Params["tasks"], r.Params["payload_bytes"] = n, len(payload20)
	tasks := make([]outbox.Task, 0, 10_000)
	for i := 0; i < n; i += 10_000 {
		tasks = tasks[:0]
		for j := i; j < min(i+10_000, n); j++ {
			tasks = append(tasks, outbox.Task{Queue: "bench", ID: fmt.Sprintf("order-%07d", j), Payload: payload20, Delay: time.Hour})
		}
		if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
			return err
		}
	}
	// The backlog as producers leave it (pending rows), then as the relay leaves it.
	var pendingBytes int64
	if err := s.pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()).Scan(&pendingBytes); err != nil {
		return err
	}
	before, err := s.usedMemory(ctx)
	if err != nil {
		return err
	}
	// Move the rows as the relay does: read pending rows, enqueue them, mark queued.
	rows, err := s.pool.Query(ctx, "SELECT task_id, run_at, max_attempts, version FROM "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+" WHERE state = 'pending'")
	if err != nil {
		return err
	}
	var batch []dispatch.Task
	for rows.Next() {
		var t dispatch.Task
		if err := rows.Scan(&t.ID, &t.RunAt, &t.MaxAttempts, &t.Version); err != nil {
			return err
		}
		t.Payload = payload20
		batch = append(batch, t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := s.dq.Enqueue(ctx, "bench", batch...); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, "UPDATE "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+" SET state = 'queued', queued_at = now() WHERE state = 'pending'"); err != nil {
		return err
	}
	after, err := s.usedMemory(ctx)
	if err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, "VACUUM "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()); err != nil {
		return err
	}
	var pgBytes, heapBytes int64
	if err := s.pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass)", taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()).
		Scan(&pgBytes, &heapBytes); err != nil {
		return err
	}
	st, err := s.dq.Stats(ctx, "bench")
	if err != nil {
		return err
	}
	r.Checks = map[string]int64{"redis_ready": st.Ready}
	if st.Ready != int64(n) {
		return fmt.Errorf("redis holds %d ready tasks, want %d", st.Ready, n)
	}
	r.add("redis_bytes_per_task", float64(after-before)/float64(n), "B")
	r.add("postgres_bytes_per_row", float64(pgBytes)/float64(n), "B")
	r.add("postgres_heap_bytes_per_row", float64(heapBytes)/float64(n), "B")
	r.add("postgres_pending_bytes_per_row", float64(pendingBytes)/float64(n), "B")
	return nil
}

func (s *session) usedMemory(ctx context.Context) (int64, error) {
	info, err := s.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory")
}
