package migrations

import "errors"

var (
	// ErrInvalidSchema reports a schema name that is not a plain lower-case identifier:
	// 1..63 bytes of [a-z0-9_], not starting with a digit.
	ErrInvalidSchema = errors.New("invalid schema name")
	// ErrInvalidConfig reports another invalid Config field.
	ErrInvalidConfig = errors.New("invalid migrations config")
)
