// Package faults is the fault suite: end-to-end scenarios on servers the tests own,
// each injecting one kind of fault while a load of tasks runs through the whole
// system (producer transactions, relay, Redis, workers with transactional
// handlers), then checking the invariants of docs/DESIGN.md against Postgres, the
// truth, and an effects table the handlers write to:
//
//   - every committed, uncancelled task has exactly one effect row (the table has
//     no unique constraint, so a duplicate would show); rolled-back enqueues and
//     cancelled tasks have none;
//   - no task started before its due time, by the Redis clock;
//   - tasks out of attempts are dead in both stores, and reconcile.Check finds
//     nothing to repair.
//
// Scenarios: worker processes SIGKILLed at random; relay processes SIGKILLed
// between the Redis write and the Postgres commit, and at random; Redis restarted
// without persistence, then reconcile; Postgres stopped, then killed (crash
// recovery), started again each time; Redis slowed down and cut off behind a TCP
// proxy; a worker whose clock is minutes off Redis's; every worker stopped while
// tasks with start deadlines fall due (each then ran once by its deadline, or went
// to the missed-deadline hook once and never ran).
//
// Each scenario prints one line to stdout (and the test log) in a stable format:
//
//	fault-suite: scenario=worker-kill tasks=1800 faults=5 lost=0 duplicated=0 early=0 ...
//
// The worker-kill scenario also runs with group commit (worker.GroupCommit), and
// DELAYQ_FAULTS_GROUP_COMMIT=8 runs every scenario's workers with groups of 8:
//
//	DELAYQ_FAULTS_GROUP_COMMIT=8 go test -race -count=1 ./internal/faults/
//
// The worker-kill and redis-restart scenarios also run with their queues split into
// 3 shards (delayq.Controls.Shards), and DELAYQ_FAULTS_SHARDS=3 splits every
// scenario's queues.
//
// Worker and relay processes are this test binary, re-executed in a child role
// (see TestMain), so that they can be killed with SIGKILL.
package faults
