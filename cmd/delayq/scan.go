package main

import "github.com/delayq/delayq/internal/reconcile"

// scanFlags are the flags of the commands that walk the outbox and Redis
// (stats, check, reconcile, dead): where, which queues, and how many rows or
// Redis ids one step takes (batch 0: the command has no --batch).
type scanFlags struct {
	conn     connFlags
	queues   queueList
	batch    int
	hasBatch bool
}

func (s *scanFlags) register(fs *flagSet, m *Main, needRedis bool, queueUsage string) {
	s.conn.register(fs, m, true, needRedis)
	fs.Var(&s.queues, "queue", queueUsage)
}

func (s *scanFlags) registerBatch(fs *flagSet, usage string) {
	fs.IntVar(&s.batch, "batch", 500, usage)
	s.hasBatch = true
}

// options is the library's options for the flags (its defaults where a flag
// has none).
func (s *scanFlags) options() reconcile.Options {
	return reconcile.Options{Queues: s.queues.list, Schema: s.conn.schema, BatchSize: s.batch}
}

// validate checks opts, the command's options built on s, by the library's
// rules; a mistake is a usage error in the library's words (the --batch range
// in the flag's).
func (s *scanFlags) validate(opts reconcile.Options) error {
	if s.hasBatch && (opts.BatchSize < 1 || opts.BatchSize > 1000) {
		return usagef("--batch %d: 1..1000", opts.BatchSize)
	}
	if err := opts.Validate(); err != nil {
		return usagef("%s", libraryMessage(err, reconcile.ErrInvalidOptions))
	}
	return nil
}
