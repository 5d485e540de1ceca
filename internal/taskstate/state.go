// Package taskstate owns the outbox table and the states of a task: the typed
// state, the table of every transition (who triggers it, its Postgres statement,
// its Redis script, the order of the two writes, what happens to the version), and
// every SQL statement on the outbox table. Package internal/transition runs the
// statements that write a task's state, each as part of one operation (the
// transition's Op), and the producer's insert runs in package outbox; the others
// read. None writes SQL on the outbox table of its own.
//
// The one write-order rule, for every transition (docs/DESIGN.md, "Write order"):
// Postgres commits first; every Redis write that follows is keyed by the task's
// version, idempotent, and repairable from Postgres. The relay's move is the one
// write Redis gets before the commit, and it is made while the relay holds the
// pending row locked, so the write is of a state Postgres has committed.
package taskstate

import (
	"fmt"
	"strings"

	"github.com/delayq/delayq/delayqtype"
)

// State is the state of a task in the outbox, the column state: the public type
// delayqtype.State, which users name too. The owner keeps short names for it.
type State = delayqtype.State

// The states (delayqtype's). pending and queued are live (the task still has to
// run); done, dead and cancelled are finished.
const (
	Pending   = delayqtype.StatePending
	Queued    = delayqtype.StateQueued
	Done      = delayqtype.StateDone
	Dead      = delayqtype.StateDead
	Cancelled = delayqtype.StateCancelled
	Waiting   = delayqtype.StateWaiting
)

// States lists every state, live ones first.
var States = delayqtype.States()

// Parse reads a state from the database.
func Parse(s string) (State, error) { return delayqtype.ParseState(s) }

// Kept, as a transition's To, means the row's state is left as it was.
const Kept State = "(kept)"

// Actor is who triggers a transition.
type Actor string

// The actors.
const (
	Producer  Actor = "producer"  // the application, in its own transaction
	Relay     Actor = "relay"     // the relay's round
	Worker    Actor = "worker"    // a run's bookkeeping
	Reaper    Actor = "reaper"    // the relay's reaper, on expired leases
	Operator  Actor = "operator"  // a person, through the CLI or the dead-letter API
	Retention Actor = "retention" // the relay's pruning of old finished rows
	Reconcile Actor = "reconcile" // the repair of Redis from Postgres (reconcile, the relay's healing)
	Test      Actor = "test"      // package delayqtest, running a task now in a user's test
	// Dependency: the transition that finishes a task's last dependency (any
	// of complete, fail-dead, run-cancel, miss-deadline, reap-dead,
	// relay-invalid, cancel), in its transaction, through the trigger of
	// migration 00021.
	Dependency Actor = "dependency"
)

// Transition is one edge of the state machine.
type Transition struct {
	// Name is the transition's name, as docs/DESIGN.md and the model test use it.
	Name string
	From []State
	// To is the state after it: Kept leaves it as it was; "" deletes the row.
	To State
	By Actor
	// Postgres names the statement (a field of Statements) that makes it.
	Postgres string
	// Redis says what Redis gets ("" for nothing: Redis learns of it from the
	// relay, or from a worker whose guard refuses the older copy).
	Redis string
	// Order is how the two writes are ordered: one of the Write orders.
	Order string
	// Version says what happens to the row's version.
	Version string
	// Op names the operations of package internal/transition (methods of
	// transition.Ops, or its functions) that make the transition, comma
	// separated; a name with a dot is another package's (the producer's insert).
	// TestOpsNamed checks both ways.
	Op string
}

// The write orders. The rule: Postgres commits first, and every Redis write that
// follows is keyed by version, idempotent and repairable; the relay's move is made
// while it holds the pending row locked, so it writes a state Postgres committed.
const (
	PostgresOnly      = "Postgres only"
	PostgresThenRedis = "Postgres commits, then Redis"
	RedisUnderRowLock = "Redis while the row is locked, then the commit"
	// RedisFollowsRow: Postgres is read, not written; Redis is made to agree.
	RedisFollowsRow = "Redis follows the row as read"
	RedisOnly       = "Redis only"
)

// Transitions is the whole state machine: every change of a row. docs/DESIGN.md
// shows it (TestTransitionsDocumented), and the model test follows it.
var Transitions = []Transition{
	{Name: "enqueue", To: Pending, By: Producer,
		Postgres: "Enqueue, EnqueueMany", Order: PostgresOnly, Version: "1",
		Op: "outbox.Client.Enqueue, outbox.Client.EnqueueMany"},
	{Name: "relay", From: []State{Pending}, To: Queued, By: Relay,
		Postgres: "TakeDue", Redis: "enqueue: adds, or replaces an older version or a finished record",
		Order: RedisUnderRowLock, Version: "kept", Op: "TakeDue, Move"},
	{Name: "relay-invalid", From: []State{Pending}, To: Dead, By: Relay,
		Postgres: "MarkInvalid (marked for the queue's OnDead hook: dead-hook)", Order: PostgresOnly, Version: "kept", Op: "MarkInvalid"},
	{Name: "complete", From: []State{Pending, Queued}, To: Done, By: Worker,
		Postgres: "Guard, GuardAbort, GuardMany, GuardGroup; delayq_complete (migration 00027: an exec command's own transaction; the worker reads the row and acks: DoneByHandler)", Redis: "complete (token)", Order: PostgresThenRedis, Version: "kept",
		Op: "MarkDone, CommitDone, CommitDoneSQL, MarkDoneMany, CommitGroup, DoneWithoutRow, DoneByHandler, AckDone"},
	{Name: "fail-retry", From: []State{Pending, Queued}, To: Kept, By: Worker,
		Postgres: "RecordFailure (attempt, error, next run_at)", Redis: "retry (token)", Order: PostgresThenRedis, Version: "kept", Op: "Retry"},
	{Name: "fail-dead", From: []State{Pending, Queued}, To: Dead, By: Worker,
		Postgres: "RecordFailure, with the queue's OnDead hook in its transaction (marked for it instead when Redis counted the attempts out)", Redis: "kill (token)", Order: PostgresThenRedis, Version: "kept", Op: "Kill, KillTx"},
	{Name: "snooze", From: []State{Pending, Queued}, To: Kept, By: Worker,
		Postgres: "Snooze (next run_at; the attempt is not counted): a handler's Snooze, or an OnDead hook that failed",
		Redis:    "release (token, delay)", Order: PostgresThenRedis, Version: "kept", Op: "Snooze"},
	{Name: "run-cancel", From: []State{Pending, Queued}, To: Cancelled, By: Worker,
		Postgres: "CancelRun (a handler's Cancel; its effect rolled back)", Redis: "complete (token)", Order: PostgresThenRedis, Version: "kept",
		Op: "CancelRun"},
	{Name: "miss-deadline", From: []State{Pending, Queued}, To: Dead, By: Worker,
		Postgres: "MissDeadline (claimed after its start_by: never run), with the queue's OnMissedDeadline (or OnDead) hook in its transaction",
		Redis:    "kill (token)", Order: PostgresThenRedis, Version: "kept", Op: "MissDeadline, MissDeadlineTx"},
	{Name: "stale", From: States, To: Kept, By: Worker,
		Postgres: "Row (read after the guard refused the run)", Redis: "complete, or kill when dead at this version (token); retry when live at it",
		Order: RedisFollowsRow, Version: "kept", Op: "Suppress, GiveBack"},
	{Name: "release", From: []State{Pending, Queued}, To: Kept, By: Worker,
		Postgres: "none (a run a shutdown interrupted: the row is unchanged)", Redis: "release (token)",
		Order: RedisOnly, Version: "kept", Op: "Release"},
	{Name: "lease-lost", From: States, To: Kept, By: Worker,
		Postgres: "NoteLost (a run that failed after its lease was lost, in the attempt history alone)",
		Order:    PostgresOnly, Version: "kept", Op: "NoteLost"},
	{Name: "reap-dead", From: []State{Pending, Queued}, To: Dead, By: Reaper,
		Postgres: "MarkDead (marked for the queue's OnDead hook: dead-hook)", Redis: "reap holds it; then repair kill, or remove if the row finished",
		Order: PostgresThenRedis, Version: "kept", Op: "Reap, SettleExhausted"},
	{Name: "dead-hook", From: []State{Dead}, To: Kept, By: Worker,
		Postgres: "TakeDeadHook (clears the mark), with the queue's OnDead hook in its transaction; DelayDeadHook marks it again after a hook that failed",
		Order:    PostgresOnly, Version: "kept", Op: "TakeDeadHook, DelayDeadHook"},
	{Name: "cancel", From: []State{Pending, Queued, Waiting}, To: Cancelled, By: Producer,
		Postgres: "Cancel", Order: PostgresOnly, Version: "kept", Op: "Cancel"},
	{Name: "cancel-remove", From: []State{Done, Dead, Cancelled}, To: Kept, By: Operator,
		Postgres: "Row (read: finished or gone)", Redis: "repair remove (that version or older)", Order: RedisFollowsRow, Version: "kept",
		Op: "RemoveFinished"},
	{Name: "reschedule", From: []State{Pending, Queued}, To: Pending, By: Producer,
		Postgres: "Reschedule", Order: PostgresOnly, Version: "+1", Op: "Reschedule"},
	{Name: "reschedule-waiting", From: []State{Waiting}, To: Kept, By: Producer,
		Postgres: "Reschedule (the run time alone: it still waits)", Order: PostgresOnly, Version: "+1", Op: "Reschedule"},
	{Name: "enqueue-replace", From: []State{Pending, Queued}, To: Pending, By: Producer,
		Postgres: "EnqueueReplace (Task.Replace or Task.Debounce on an existing key: payload and due time; a queued row only while not yet due, keeping queued_at as a reschedule does)",
		Order:    PostgresOnly, Version: "+1", Op: "outbox.Client.Enqueue"},
	{Name: "enqueue-replace-waiting", From: []State{Waiting}, To: Kept, By: Producer,
		Postgres: "EnqueueReplace (payload and due time: it still waits)", Order: PostgresOnly, Version: "+1", Op: "outbox.Client.Enqueue"},
	{Name: "dead-retry", From: []State{Dead}, To: Pending, By: Operator,
		Postgres: "RetryDead (drops a mark whose hook has not run)", Order: PostgresOnly, Version: "+1", Op: "RetryDead"},
	{Name: "dead-edit-retry", From: []State{Dead}, To: Pending, By: Operator,
		Postgres: "RetryDeadEdited (payload replaced, only from the version edited)", Order: PostgresOnly, Version: "+1",
		Op: "RetryDeadEdited"},
	{Name: "dead-purge", From: []State{Dead}, By: Operator,
		Postgres: "PurgeDead", Redis: "repair remove (that version or older)", Order: PostgresThenRedis, Version: "-", Op: "PurgeDead"},
	{Name: "prune", From: []State{Done, Cancelled}, By: Retention,
		Postgres: "Prune", Order: PostgresOnly, Version: "-", Op: "Prune"},
	{Name: "expedite", From: []State{Pending, Queued}, To: Kept, By: Test,
		Postgres: "Lookup (read: the live row)", Redis: "repair restore, due now, whatever Redis holds (compare-and-set on the probe)",
		Order: RedisFollowsRow, Version: "kept", Op: "Expedite"},
	{Name: "repair", From: States, To: Kept, By: Reconcile,
		Postgres: "Lock (the rows read and held locked)", Redis: "repair restore, kill or remove (compare-and-set on the probe)",
		Order: RedisUnderRowLock, Version: "kept", Op: "Repair"},
	{Name: "enqueue-waiting", To: Waiting, By: Producer,
		Postgres: "EnqueueWaiting (the dependencies locked and flagged, an edge each in delayq_deps; pending at once when every one is done, dead or cancelled when one failed as its policy says)",
		Order:    PostgresOnly, Version: "1", Op: "workflow.Client.Enqueue, workflow.Client.Chain"},
	{Name: "set-result", From: []State{Pending, Queued}, To: Kept, By: Worker,
		Postgres: "SetResult (a transactional handler's result, in its run's transaction: it commits with the completion or not at all)",
		Order:    PostgresOnly, Version: "kept", Op: "workflow.Client.SetResult"},
	{Name: "dep-release", From: []State{Waiting}, To: Pending, By: Dependency,
		Postgres: "trigger delayq_outbox_release: the last dependency finished (done, or dead or cancelled with the policy run); the relay notified at commit",
		Order:    PostgresOnly, Version: "kept", Op: "trigger delayq_outbox_release"},
	{Name: "dep-fail", From: []State{Waiting}, To: Dead, By: Dependency,
		Postgres: "trigger delayq_outbox_release: a dependency with the policy fail ended dead or cancelled (the reason in last_error; marked for the queue's OnDead hook: dead-hook); its own dependents settle in the same statement",
		Order:    PostgresOnly, Version: "kept", Op: "trigger delayq_outbox_release"},
	{Name: "dep-skip", From: []State{Waiting}, To: Cancelled, By: Dependency,
		Postgres: "trigger delayq_outbox_release: a dependency with the policy skip ended dead or cancelled (the reason in last_error); its own dependents settle in the same statement",
		Order:    PostgresOnly, Version: "kept", Op: "trigger delayq_outbox_release"},
	{Name: "enqueue-batch", To: Waiting, By: Producer,
		Postgres: "EnqueueBatch (the callback waiting with a new batch id, its children pending with it, each with a shard, the batch's row in delayq_batches and a counter row per shard in delayq_batch_shards; one statement); ReleaseBatch when no child was inserted (the callback pending at once)",
		Order:    PostgresOnly, Version: "1", Op: "workflow.Client.Batch"},
	{Name: "batch-release", From: []State{Waiting}, To: Pending, By: Dependency,
		Postgres: "trigger delayq_outbox_batch: a child's finish (done, dead or cancelled, by any transition) counted in its shard's counter row (a batch from before migration 00030: its batch's row), its batch_id cleared in the same row version; the finish that takes a shard to 0 counts it in the batch's row, and the one that takes the last shard to 0 makes the callback pending; the relay notified at commit",
		Order:    PostgresOnly, Version: "kept", Op: "trigger delayq_outbox_batch"},
	{Name: "workflow-cancel", From: []State{Pending, Queued, Waiting}, To: Cancelled, By: Producer,
		Postgres: "CancelBatch (a batch's children not finished, locked in key order, counted in one update of their shards and the batch's row), then Cancel (its callback); CancelTasks (the tasks connected by dependencies still waiting, locked in dependency order)",
		Order:    PostgresOnly, Version: "kept", Op: "workflow.Client.Cancel"},
}

// Table renders Transitions as the Markdown table docs/DESIGN.md shows.
func Table() string {
	var b strings.Builder
	b.WriteString("| transition | from | to | by | Postgres | Redis | write order | version | operation |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range Transitions {
		from := "–"
		if len(t.From) > 0 {
			parts := make([]string, len(t.From))
			for i, f := range t.From {
				parts[i] = string(f)
			}
			from = strings.Join(parts, ", ")
		}
		to := string(t.To)
		if to == "" {
			to = "(deleted)"
		}
		redis := t.Redis
		if redis == "" {
			redis = "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			t.Name, from, to, t.By, t.Postgres, redis, t.Order, t.Version, t.Op)
	}
	return b.String()
}
