package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
)

// execTx is --transactional: the command completes its task itself, with
// delayq_complete (migration 00027) in the transaction of its own writes, and
// the worker reads the row after the command exits 0.
type execTx struct {
	databaseURL, schema string
	pool                *pgxpool.Pool
	store               *taskstate.Store
}

// completed checks the row after the command exited 0. Still to do at the run's
// version: the command did not complete it, and the run fails (a retry). Else
// the handler says the task is completed by itself
// (transition.ErrCompletedByHandler): the worker reads the row instead of
// running its guard, counts the run succeeded when the row is done at the run's
// version, and Redis follows the row (done: acknowledged; rescheduled,
// cancelled: as the row says, the run counted suppressed).
func (x *execTx) completed(ctx context.Context, t *delayq.Task) error {
	// Read even if the run's context ends now (a shutdown, a lost lease): the
	// command may have committed, and the answer decides what Redis gets.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rowReadTimeout)
	defer cancel()
	st, err := x.store.Row(rctx, x.pool, t.Queue, t.ID)
	switch {
	case err != nil:
		return fmt.Errorf("command exited 0; its completion not read: %w", err)
	case !st.Exists:
		return errors.New("command exited 0, but the task has no outbox row: --transactional needs the outbox")
	case st.State.Live() && st.Version == t.Version:
		return fmt.Errorf("command exited 0 without completing the task: call delayq_complete('%s', '%s', %d) in the transaction of its writes",
			t.Queue, t.ID, t.Version)
	}
	return transition.ErrCompletedByHandler
}

// rowReadTimeout bounds the read of the row after a command exited 0.
const rowReadTimeout = 10 * time.Second

// maxRetryAfter bounds the delay a command asks for (as --backoff-max's default).
const maxRetryAfter = 24 * time.Hour

// readRetryAfter reads the delay a failed command wrote to its
// DELAYQ_RETRY_AFTER_FILE: seconds ("30", "0.5") or a Go duration ("1m30s").
// It returns 0 when the file was not written, and bad (why) when it cannot be
// read as a delay of 1ms..24h.
func readRetryAfter(path string) (d time.Duration, bad string) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, ""
	}
	if err != nil {
		return 0, err.Error()
	}
	s := strings.TrimSpace(string(b))
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		d = time.Duration(secs * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		d = 0
	}
	if d < time.Millisecond || d > maxRetryAfter {
		if len(s) > 40 {
			s = s[:40] + "…"
		}
		return 0, fmt.Sprintf("%q is not a delay of 1ms..24h", s)
	}
	return d, ""
}
