package reconcile

import (
	"errors"

	"github.com/delayq/delayq/outbox"
)

var (
	// ErrInvalidOptions reports Options that do not validate.
	ErrInvalidOptions = errors.New("reconcile: invalid options")
	// ErrNotFound reports a task that has no outbox row: outbox.ErrNotFound, the
	// one value every package reports.
	ErrNotFound = outbox.ErrNotFound
	// ErrNotDead reports a task RetryDead was asked to retry that is not dead.
	ErrNotDead = errors.New("reconcile: task is not dead")
)
