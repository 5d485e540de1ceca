package reconcile

import (
	"fmt"
	"strings"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
)

// The kinds are public types (delayqtype); these names keep reconcile's code short.
type Kind = delayqtype.Kind

const (
	MissingInRedis     = delayqtype.MissingInRedis
	MemberWithoutHash  = delayqtype.MemberWithoutHash
	HashWithoutMember  = delayqtype.HashWithoutMember
	StatusMismatch     = delayqtype.StatusMismatch
	VersionMismatch    = delayqtype.VersionMismatch
	DoneInRedis        = delayqtype.DoneInRedis
	DeadInRedis        = delayqtype.DeadInRedis
	DeadInPostgres     = delayqtype.DeadInPostgres
	FinishedInPostgres = delayqtype.FinishedInPostgres
	UnknownInPostgres  = delayqtype.UnknownInPostgres
)

// AllKinds lists every kind, in the order reports show them.
// (The list lives here, not in delayqtype: the public surface keeps the kinds
// and their Describe; issue 34 spent the name on delayq.Client.SetKeyLimits.)
func AllKinds() []Kind {
	return []Kind{
		delayqtype.MissingInRedis, delayqtype.MemberWithoutHash, delayqtype.HashWithoutMember,
		delayqtype.StatusMismatch, delayqtype.VersionMismatch, delayqtype.DoneInRedis,
		delayqtype.DeadInRedis, delayqtype.DeadInPostgres, delayqtype.FinishedInPostgres,
		delayqtype.UnknownInPostgres,
	}
}

// row is an outbox row as reconcile reads it (Page and PageQueued fill the id,
// the state and the version alone).
type row = taskstate.RedisRow

// verdict is what classify decides for one task.
type verdict struct {
	kind Kind              // "" when consistent
	op   dispatch.RepairOp // 0: leave alone (pending rows, recent deaths)
	// expired marks a consistent active task past its lease (the reaper's).
	expired bool
	// why tells, when op is 0 for an inconsistency, why it is left alone.
	why string
}

// internalKind tells how the task hash and the ZSET memberships disagree, or "".
func internalKind(p dispatch.Probe) Kind {
	if p.Consistent() {
		return ""
	}
	if p.State == dispatch.StateMissing {
		return MemberWithoutHash
	}
	own, others := false, 0
	for _, m := range []struct {
		in bool
		s  dispatch.State
	}{{p.InReady, dispatch.StateReady}, {p.InActive, dispatch.StateActive}, {p.InDead, dispatch.StateDead}} {
		switch {
		case m.in && m.s == p.State:
			own = true
		case m.in:
			others++
		}
	}
	if !own && others == 0 {
		return HashWithoutMember
	}
	return StatusMismatch
}

func live(p dispatch.Probe) bool {
	return p.State == dispatch.StateReady || p.State == dispatch.StateActive || p.State == dispatch.StateDead
}

// classify compares an outbox row (nil: none) with a Redis probe read at now.
func classify(r *row, p dispatch.Probe, now time.Time, grace time.Duration) verdict {
	internal := internalKind(p)
	anyMember := p.InReady || p.InActive || p.InDead
	if r == nil {
		if live(p) || anyMember {
			return verdict{kind: UnknownInPostgres, op: dispatch.RepairRemove}
		}
		return verdict{}
	}
	switch r.State {
	case delayqtype.StatePending:
		// The relay's: it enqueues the row, replacing an older version.
		if internal != "" {
			return verdict{kind: internal, why: "pending: left to the relay"}
		}
		return verdict{}
	case delayqtype.StateQueued:
		switch p.State {
		case dispatch.StateMissing:
			if anyMember {
				return verdict{kind: MemberWithoutHash, op: dispatch.RepairRestore}
			}
			return verdict{kind: MissingInRedis, op: dispatch.RepairRestore}
		case dispatch.StateDone:
			return verdict{kind: DoneInRedis, op: dispatch.RepairRestore}
		case dispatch.StateDead:
			if p.InDead && grace > 0 && now.Sub(p.DeadScore) < grace {
				return verdict{kind: DeadInRedis, why: "died less than the grace period ago"}
			}
			return verdict{kind: DeadInRedis, op: dispatch.RepairRestore}
		}
		if p.Version != r.Version {
			return verdict{kind: VersionMismatch, op: dispatch.RepairRestore}
		}
		if internal != "" {
			if p.State == dispatch.StateActive {
				// A worker may hold the lease: the reaper decides, not us.
				return verdict{kind: internal, op: dispatch.RepairExpire}
			}
			return verdict{kind: internal, op: dispatch.RepairRestore}
		}
		if p.State == dispatch.StateActive && p.ActiveScore.Before(now) {
			return verdict{expired: true}
		}
		return verdict{}
	case delayqtype.StateDead:
		if p.State == dispatch.StateReady || p.State == dispatch.StateActive {
			return verdict{kind: DeadInPostgres, op: dispatch.RepairRemove}
		}
		if internal != "" {
			return verdict{kind: internal, op: dispatch.RepairRemove}
		}
		return verdict{}
	default: // done, cancelled
		if live(p) {
			return verdict{kind: FinishedInPostgres, op: dispatch.RepairRemove}
		}
		if internal != "" {
			return verdict{kind: internal, op: dispatch.RepairRemove}
		}
		return verdict{}
	}
}

// restoreTask is the task a restore writes: the outbox row's as the relay writes it
// (RedisRow.Task, the one encoder), with its attempts (the
// larger count of the two stores, so that runs are never given back, but at most
// max_attempts-1, since Postgres says the task is not dead).
func restoreTask(r *row, p dispatch.Probe) dispatch.Task {
	t := r.Task()
	if p.Version == r.Version && p.Attempt > t.Attempt {
		t.Attempt = p.Attempt
	}
	t.Attempt = max(0, min(t.Attempt, r.MaxAttempts-1))
	return t
}

// describeRow and describeProbe say in a few words what each store holds.
func describeRow(r *row) string {
	if r == nil {
		return "no row"
	}
	return fmt.Sprintf("%s v%d", r.State, r.Version)
}

func describeProbe(p dispatch.Probe) string {
	var sets []string
	if p.InReady {
		sets = append(sets, "ready")
	}
	if p.InActive {
		sets = append(sets, "active")
	}
	if p.InDead {
		sets = append(sets, "dead")
	}
	in := "in no ZSET"
	if len(sets) > 0 {
		in = "in " + strings.Join(sets, "+")
	}
	switch p.State {
	case dispatch.StateMissing:
		return "no hash, " + in
	case dispatch.StateDone:
		return "done, " + in
	}
	return fmt.Sprintf("%s v%d, %s", p.State, p.Version, in)
}
