package validate

import (
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// The rate limit is a public type (delayqtype); these names keep the limits'
// home in one package for the module's own code.
type RateLimit = delayqtype.RateLimit

var ErrInvalidRateLimit = delayqtype.ErrInvalidRateLimit

// The bounds of a rate limit, delayqtype.RateLimit.Validate's (unexported
// there; TestRateBoundsAgree checks these against it) and the ctl script's.
const (
	MaxRateLimit       = 1_000_000_000
	MaxRateBurst       = 1_000_000_000
	MaxRatePeriod      = (1 << 40) * time.Millisecond
	DefaultBurstWindow = 100 * time.Millisecond
)
