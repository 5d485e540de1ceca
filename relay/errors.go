package relay

import "errors"

var (
	// ErrInvalidConfig reports a Config that does not validate, or a nil pool or
	// Redis client given to New.
	ErrInvalidConfig = errors.New("relay: invalid config")
	// ErrRunning reports a second call of Run on a Relay that is running or has run.
	ErrRunning = errors.New("relay: Run called twice")
)
