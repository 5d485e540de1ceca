package validate

import "github.com/delayq/delayq/delayqtype"

// The rate limit is a public type (delayqtype); these names keep the limits'
// home in one package for the module's own code.
type RateLimit = delayqtype.RateLimit

var ErrInvalidRateLimit = delayqtype.ErrInvalidRateLimit

const (
	MaxRateLimit       = delayqtype.MaxRateLimit
	MaxRateBurst       = delayqtype.MaxRateBurst
	MaxRatePeriod      = delayqtype.MaxRatePeriod
	DefaultBurstWindow = delayqtype.DefaultBurstWindow
)
