package reconcile

import "errors"

var (
	// ErrInvalidOptions reports Options that do not validate.
	ErrInvalidOptions = errors.New("reconcile: invalid options")
	// ErrNotFound reports a task that has no outbox row.
	ErrNotFound = errors.New("reconcile: task not found")
	// ErrNotDead reports a task RetryDead was asked to retry that is not dead.
	ErrNotDead = errors.New("reconcile: task is not dead")
)
