package delayq

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// RedisLogger returns a logger for go-redis's own messages, which go-redis
// otherwise writes to stderr, several a second while Redis is down ("failed
// to dial after 5 attempts"). go-redis has one logger per process, so install
// it once in main, before making clients (delayq itself sets no globals):
//
//	redis.SetLogger(delayq.RedisLogger(logger))
//
// Its lines go to logger at DEBUG, except a failed dial at the start of an
// outage, which goes at WARN once; the outage is taken as over after a minute
// without a failed dial (go-redis says nothing when a dial succeeds). The
// workers and the relay say themselves, once each, when they lose a store and
// when they reach it again.
func RedisLogger(logger *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return &redisLogger{log: logger}
}

// redisQuiet is how long without a failed dial ends an outage for redisLogger.
const redisQuiet = time.Minute

type redisLogger struct {
	log *slog.Logger

	mu       sync.Mutex
	lastDial time.Time // the last failed dial's time
}

func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if strings.Contains(format, "failed to dial") {
		l.mu.Lock()
		now := time.Now()
		first := now.Sub(l.lastDial) > redisQuiet
		l.lastDial = now
		l.mu.Unlock()
		if first {
			l.log.WarnContext(ctx, "go-redis: "+msg+" (its further failed dials at DEBUG)")
			return
		}
	}
	l.log.DebugContext(ctx, "go-redis: "+msg)
}
