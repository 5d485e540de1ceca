package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/outbox"
)

// MaxResultBytes bounds a stored result.
const MaxResultBytes = 4 << 10

// ErrResultTooLarge: a result above MaxResultBytes.
var ErrResultTooLarge = errors.New("workflow: result too large")

// SetResult stores result as the outcome of t's run, in tx, the transaction of
// a transactional handler (delayq.Client.HandleTx, delayq.RegisterTx): it
// commits with the run's completion, or not at all (a failure, a retry, a
// cancel, a run whose guard is refused roll it back). Its dependents, and
// anyone, read it with Client.Result; it is kept and deleted with the task's
// row. A later call in the same run replaces it; nil stores none.
//
// Errors: ErrResultTooLarge; outbox.ErrStale when the row is not this run's
// any more (another version, or finished): the completion will be refused too.
func (c *Client) SetResult(ctx context.Context, tx pgx.Tx, t *delayq.Task, result []byte) error {
	if len(result) > MaxResultBytes {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrResultTooLarge, len(result), MaxResultBytes)
	}
	tag, err := tx.Exec(ctx, c.sql.SetResult, t.Queue, t.ID, t.Version, result)
	if err != nil {
		return notmigrated.Classify(fmt.Errorf("workflow: set the result of %s/%s: %w", t.Queue, t.ID, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("workflow: set the result of %s/%s: %w: version %d is not running", t.Queue, t.ID, outbox.ErrStale, t.Version)
	}
	return nil
}

// Result reads the result queue/id stored (nil: none) and the task's state;
// a result is final once the state is done. A dependent's handler reads its
// dependencies' results so, in its own transaction. outbox.ErrNotFound when
// there is no row.
func (c *Client) Result(ctx context.Context, q outbox.Querier, queue, id string) ([]byte, delayqtype.State, error) {
	var (
		st     string
		result []byte
	)
	err := q.QueryRow(ctx, c.sql.ReadResult, queue, id).Scan(&st, &result)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, "", fmt.Errorf("workflow: result of %s/%s: %w", queue, id, outbox.ErrNotFound)
	case err != nil:
		return nil, "", notmigrated.Classify(fmt.Errorf("workflow: result of %s/%s: %w", queue, id, err))
	}
	state, err := delayqtype.ParseState(st)
	if err != nil {
		return nil, "", err
	}
	return result, state, nil
}
