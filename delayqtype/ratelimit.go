package delayqtype

import (
	"errors"
	"fmt"
	"time"
)

// Bounds of a queue's rate limit; the ctl script checks the same numbers.
const (
	maxRateLimit  = 1_000_000_000
	maxRateBurst  = 1_000_000_000
	maxRatePeriod = (1 << 40) * time.Millisecond
)

// ErrInvalidRateLimit reports a rate limit outside its bounds.
var ErrInvalidRateLimit = errors.New("invalid rate limit")

// RateLimit caps the starts of one queue across every worker: Limit starts per
// Period, spaced Period/Limit apart, of which up to Burst may follow one another
// without the spacing (after an idle spell, or when workers woke late to the
// start they were allowed). In any window of length L, at most
// Burst + L·Limit/Period tasks start. Limit 0 is no limit.
type RateLimit struct {
	// Limit is the number of starts per Period: 0 (no limit) .. 10^9.
	Limit int `json:"limit"`
	// Period is 1 ms .. 2^40 ms, in whole milliseconds (default 1 s).
	Period time.Duration `json:"period"`
	// Burst is 1 .. 10^9; 0 means defaultBurstWindow's worth of starts at the
	// limit, at least 1. A burst of 1 spaces every start strictly, and a worker
	// that wakes late to its start loses that time: the rate then falls short
	// of the limit by the workers' lateness (half of 200/s on a loaded 2-core
	// machine, BENCHMARKS.md).
	Burst int `json:"burst"`
}

// defaultBurstWindow sizes the default burst: the starts the limit allows in
// 100 ms, so that workers waking up to 100 ms late still start at the limit.
const defaultBurstWindow = 100 * time.Millisecond

// WithDefaults fills a zero Period (1 s) and Burst (see Burst).
func (r RateLimit) WithDefaults() RateLimit {
	if r.Period == 0 {
		r.Period = time.Second
	}
	if r.Burst == 0 {
		r.Burst = 1
		if r.Limit > 0 && r.Period > 0 {
			r.Burst = int(max(1, min(maxRateBurst, (int64(r.Limit)*int64(defaultBurstWindow)+int64(r.Period)-1)/int64(r.Period))))
		}
	}
	return r
}

// Validate checks r (defaults applied first by the caller).
func (r RateLimit) Validate() error {
	switch {
	case r.Limit < 0 || r.Limit > maxRateLimit:
		return fmt.Errorf("%w: limit %d: 0 (none) .. %d starts per period", ErrInvalidRateLimit, r.Limit, maxRateLimit)
	case r.Period < time.Millisecond || r.Period > maxRatePeriod || r.Period%time.Millisecond != 0:
		return fmt.Errorf("%w: period %v: whole milliseconds, 1ms .. 2^40ms", ErrInvalidRateLimit, r.Period)
	case r.Burst < 1 || r.Burst > maxRateBurst:
		return fmt.Errorf("%w: burst %d: 1 .. %d", ErrInvalidRateLimit, r.Burst, maxRateBurst)
	}
	return nil
}

// String is "100/1s burst 5", or "none".
func (r RateLimit) String() string {
	if r.Limit == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%v burst %d", r.Limit, r.Period, r.Burst)
}
