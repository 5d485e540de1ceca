package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/relayobs"
)

// Self-healing (docs/DESIGN.md, "Self-healing"). One relay of those sharing an
// outbox, the leader (it holds a Postgres advisory lock for as long as its
// connection lives), runs two things:
//
//   - loss detection: every LossCheckInterval it reads the epoch mark of every
//     Redis master (delayq.Client.Epochs). A mark that is gone or changed means
//     that master restarted without persistence, was flushed or failed over to a
//     replica without the mark: a full repair starts at once, at full speed.
//   - anti-entropy: a continuous pass over the queued rows of every queue, compared
//     with Redis and repaired through reconcile's compare-and-set path, paced to
//     RepairRate rows a second, RepairPause between passes.
//
// A leader and not a split of the work: a pass is cheap (one probe per page) and
// its pace is the budget; one leader keeps that budget whatever the number of
// replicas, needs no shared cursor, and a replica takes over within
// LeaderRetry when the leader's connection ends.

// healState is what /readyz and the metrics say of the healing.
type healState struct {
	mu        sync.Mutex
	repairing string    // why a full repair runs ("" when none does)
	since     time.Time // when it started

	// lastMarks are the marks the last term of this relay knew when it ended
	// (only the heal loop touches them): the next term compares the marks it reads
	// with them, so that a failover while no term watched — a term ended by a
	// Redis or Postgres error — still counts as a loss.
	lastMarks []dispatch.Epoch
}

// Repairing reports whether this relay is repairing Redis after a detected loss,
// and why, for /readyz.
func (r *Relay) Repairing() (reason string, ok bool) {
	r.heal.mu.Lock()
	defer r.heal.mu.Unlock()
	if r.heal.repairing == "" {
		return "", false
	}
	return fmt.Sprintf("%s (repairing for %v)", r.heal.repairing, time.Since(r.heal.since).Round(time.Second)), true
}

// advisoryKey is the lock the leader holds: one per outbox table and queue set.
// Relays split by Config.Queues each heal their own queues: with one lock per
// table, the leader would heal only its queues and the others' never. Relays
// whose sets overlap may then repair the shared queues at once, which the
// compare-and-set repair allows.
func (r *Relay) advisoryKey() string {
	if len(r.cfg.Queues) == 0 {
		return "delayq heal " + r.table
	}
	qs := slices.Clone(r.cfg.Queues)
	slices.Sort(qs)
	return "delayq heal " + r.table + " queues " + strings.Join(slices.Compact(qs), ",")
}

// healLoop tries to lead; while it leads, it heals.
func (r *Relay) healLoop(ctx context.Context) {
	for ctx.Err() == nil {
		conn, err := r.lead(ctx)
		if err != nil && ctx.Err() == nil {
			r.pgErr(errHeal, "try the leader lock", err) //nolint:errcheck // counted and logged
		}
		if conn != nil {
			r.setLeader(true)
			h, err := r.healAsLeader(ctx, conn)
			if h != nil && h.marks != nil {
				r.heal.lastMarks = h.marks
			}
			r.setLeader(false)
			// The lock lives as long as the session: close it, not back to the pool
			// still holding the lock.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			conn.Release()
			if err != nil && ctx.Err() == nil {
				r.warnStore("relay: self-healing paused", err)
			}
		}
		// Another relay leads, or ours failed: try again later (jittered).
		if !sleep(ctx, r.cfg.LeaderRetry/2+rand.N(r.cfg.LeaderRetry/2+1)) {
			return
		}
	}
}

func (r *Relay) setLeader(on bool) {
	if !on {
		r.heal.mu.Lock()
		r.heal.repairing = ""
		r.heal.mu.Unlock()
	}
	r.observe(context.Background(), relayobs.LeaderEvent{Leading: on})
}

// lead returns a connection holding the leader's advisory lock, or nil when
// another relay holds it. The lock lasts as long as the connection. In PollOnly
// mode (a pooler in transaction mode, which hands a session's server connection
// to other clients between transactions) it is a transaction's lock, held by a
// transaction left open for the term: the pooler keeps one server connection for
// it, and closing the connection ends both.
func (r *Relay) lead(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	lock := `SELECT pg_try_advisory_lock(hashtext($1))`
	if r.cfg.PollOnly {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			conn.Release()
			return nil, err
		}
		lock = `SELECT pg_try_advisory_xact_lock(hashtext($1))`
	}
	var got bool
	if err := conn.QueryRow(ctx, lock, r.advisoryKey()).Scan(&got); err != nil {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, err
	}
	if !got {
		if r.cfg.PollOnly {
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
		conn.Release()
		return nil, nil
	}
	return conn, nil
}

// nodeCheckEvery: one loss check in this many also reads which node serves each
// shard.
const nodeCheckEvery = 5

// errLeadership ends a leader's term: its lock connection failed.
var errLeadership = errors.New("relay: the leader's lock connection failed")

// healAsLeader runs passes until ctx ends or the lock connection fails. It
// returns the term, whose marks the next term starts from, once it read them.
func (r *Relay) healAsLeader(ctx context.Context, conn *pgxpool.Conn) (*healer, error) {
	pass, err := reconcile.NewPass(r.pool, r.dq, reconcile.Options{
		Schema: r.cfg.Schema, NotifyChannel: r.cfg.NotifyChannel, BatchSize: r.cfg.RepairBatch, Logger: r.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	h := &healer{r: r, conn: conn, pass: pass}
	marks, err := h.firstMarks(ctx)
	if err != nil {
		return nil, err
	}
	h.marks = marks
	r.cfg.Logger.Info("relay: leading self-healing", "epochs", len(marks))
	// Marks that differ from those this relay's last term knew: a loss or a
	// failover while no term watched.
	if known := r.heal.lastMarks; known != nil {
		lost, changed := marksDiffer(known, marks, true)
		if len(lost) > 0 || len(changed) > 0 || len(known) != len(marks) {
			h.noteLoss(marks, lost, changed)
		}
	}
	// A master without a mark when the term starts lost data while no relay
	// watched, or a leader died repairing it (marks are written again only when a
	// repair completes), or this is a first start. The first pass runs at full
	// speed; it is cheap when nothing is missing.
	var unmarked []string
	for _, m := range marks {
		if m.Value == "" {
			unmarked = append(unmarked, m.Shard)
		}
	}
	if len(unmarked) > 0 && !h.urgent {
		// Usually a first start on this Redis, or a leader that died mid-pass:
		// nothing says data was lost, so the line says what is done, not why.
		h.lossDetected("checking every task of shards "+strings.Join(unmarked, ",")+
			" against PostgreSQL (this Redis has no mark of a completed check: a first start, or an interrupted check)", unmarked, false)
	}
	for ctx.Err() == nil {
		if err := h.runPass(ctx); err != nil {
			return h, err
		}
		if !h.wait(ctx, r.cfg.RepairPause) {
			return h, nil
		}
	}
	return h, nil
}

// firstMarks reads the marks a term starts from, retrying with backoff while
// Redis is unreachable (a failover in progress): the term keeps its lock rather
// than ending and leaving the failover unwatched. It fails when ctx ends or the
// lock connection does.
func (h *healer) firstMarks(ctx context.Context) ([]dispatch.Epoch, error) {
	b := newBackoff(h.r.cfg.BackoffMin, h.r.cfg.BackoffMax)
	for {
		marks, err := h.r.dq.Epochs(ctx)
		if err == nil {
			h.r.rd.OK()
			return marks, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		h.r.redisErr(errHeal, "epochs", err) //nolint:errcheck // counted and logged; read again
		if !sleep(ctx, b.next()) {
			return nil, ctx.Err()
		}
		if err := h.conn.Ping(ctx); err != nil {
			return nil, fmt.Errorf("%w: %w", errLeadership, err)
		}
	}
}

// healer is one leader's term.
type healer struct {
	r         *Relay
	conn      *pgxpool.Conn
	pass      *reconcile.Pass
	marks     []dispatch.Epoch
	lastCheck time.Time
	checks    int  // loss checks made in this term
	urgent    bool // a loss was detected: the current pass runs at full speed
	restart   bool // a loss was detected during a pass: start it over
}

// check reads the epoch marks when LossCheckInterval has passed, and the leader's
// lock connection. A loss makes the pass urgent and restarts it.
func (h *healer) check(ctx context.Context) error {
	if time.Since(h.lastCheck) < h.r.cfg.LossCheckInterval {
		return nil
	}
	h.lastCheck = time.Now()
	if err := h.conn.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %w", errLeadership, err)
	}
	// The marks every check (one GET a master); the topology and the masters'
	// identity every nodeCheckEvery checks (a topology read, INFO on a single
	// server): a flush or a restart without persistence shows within one check, a
	// failover or a restart with persistence within a few.
	var now []dispatch.Epoch
	var err error
	h.checks++
	if h.checks%nodeCheckEvery == 0 {
		now, err = h.r.dq.Epochs(ctx)
	} else {
		now, err = h.r.dq.RereadEpochs(ctx, h.marks)
	}
	if err != nil {
		if ctx.Err() == nil {
			h.r.redisErr(errHeal, "epochs", err) //nolint:errcheck // counted and logged; checked again
		}
		return nil
	}
	h.r.rd.OK()
	// A mark that differs from the one this term knows: gone (restart without
	// persistence, flush, failover to a replica without it) or another (a replica
	// with an older mark). A known-missing mark that is still missing is the
	// repair in hand, not a new loss. A new master with the mark (a failover, a
	// restart with persistence) may still have lost the last writes: repaired as
	// well.
	lost, changed := marksDiffer(h.marks, now, false)
	if len(lost) == 0 && len(changed) == 0 && len(now) == len(h.marks) {
		return nil
	}
	h.noteLoss(now, lost, changed)
	return nil
}

// marksDiffer compares the marks a term knows with marks read now. Lost are the
// shards whose mark is gone or another, and shards the term did not know;
// changed, those another node serves now. With written, a mark the term knew as
// missing and now finds is not lost: a repair wrote it (this term's, or another
// leader's between two terms).
func marksDiffer(known, now []dispatch.Epoch, written bool) (lost, changed []string) {
	for _, e := range now {
		i := slices.IndexFunc(known, func(m dispatch.Epoch) bool { return m.Shard == e.Shard })
		switch {
		case i < 0:
			lost = append(lost, e.Shard)
		case e.Value != known[i].Value && !(written && known[i].Value == ""):
			lost = append(lost, e.Shard)
		case e.Node != known[i].Node:
			changed = append(changed, e.Shard)
		}
	}
	return lost, changed
}

// noteLoss takes now as the term's marks, the lost shards' as missing (written
// again when the repair completes), and starts a full repair.
func (h *healer) noteLoss(now []dispatch.Epoch, lost, changed []string) {
	for i := range now {
		if slices.Contains(lost, now[i].Shard) {
			now[i].Value = ""
		}
	}
	h.marks = now
	switch {
	case len(lost) > 0:
		h.lossDetected("Redis lost data (shards "+strings.Join(lost, ",")+")", lost, true)
	case len(changed) > 0:
		h.lossDetected("a Redis master changed (shards "+strings.Join(changed, ",")+": failover or restart)", changed, true)
	default:
		h.lossDetected("the Redis Cluster's shards changed", nil, true)
	}
}

// lossDetected starts a full repair at full speed; counted as a loss when it is
// one (not at a term's start).
func (h *healer) lossDetected(reason string, shards []string, loss bool) {
	if loss {
		h.r.observe(context.Background(), relayobs.RedisLossEvent{Reason: reason, Shards: shards})
		h.r.cfg.Logger.Warn("relay: "+reason+"; repairing from PostgreSQL at once", "shards", shards)
	} else {
		h.r.cfg.Logger.Info("relay: "+reason, "shards", shards)
	}
	h.r.heal.mu.Lock()
	h.r.heal.repairing, h.r.heal.since = reason, time.Now()
	h.r.heal.mu.Unlock()
	h.urgent, h.restart = true, true
}

// wait waits d (the pause between passes), checking the marks meanwhile. It
// returns early, true, when a loss is detected, and false when ctx ends.
func (h *healer) wait(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := h.check(ctx); err != nil {
			return ctx.Err() == nil && !errors.Is(err, errLeadership)
		}
		if h.urgent {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		if !sleep(ctx, min(left, h.r.cfg.LossCheckInterval)) {
			return false
		}
	}
}

// runPass compares every queue's queued rows with Redis once, repairing as it
// goes, paced to RepairRate unless urgent. A loss detected on the way starts it
// over.
func (h *healer) runPass(ctx context.Context) error {
	r := h.r
	for start := true; start; {
		start = false
		h.restart = false
		h.pass.Reset()
		begun := time.Now()
		if h.urgent {
			// The controls went with the data: mirror them back first, so that the
			// workers claim from every shard of a sharded queue, and a paused queue
			// stays paused, without waiting for the control loop.
			if err := r.syncControls(ctx); err != nil && ctx.Err() == nil {
				r.warnStore("relay: mirror queue controls after a loss", err)
			}
		}
		for _, q := range r.healQueues(ctx) {
			for after := ""; ; {
				if err := h.check(ctx); err != nil {
					return err
				}
				if h.restart {
					break
				}
				stepStart := time.Now()
				before := h.pass.Report()
				last, n, err := h.pass.Step(ctx, q, after)
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					r.storeErr(errHeal, "anti-entropy "+q, err) //nolint:errcheck // counted and logged
					if !sleep(ctx, r.cfg.BackoffMax) {
						return ctx.Err()
					}
					continue
				}
				r.countDivergences(q, before, h.pass.Report())
				if last == "" {
					break
				}
				after = last
				if !h.urgent && r.cfg.RepairRate > 0 {
					// Pace: n rows at RepairRate rows a second.
					if d := time.Duration(float64(n)/float64(r.cfg.RepairRate)*float64(time.Second)) - time.Since(stepStart); d > 0 {
						if !h.wait(ctx, d) {
							return ctx.Err()
						}
					}
				}
			}
			if h.restart || ctx.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if h.restart {
			start = true
			continue
		}
		rep := h.pass.Report()
		if h.urgent {
			// Repaired: mark the masters again, so that a later loss shows.
			marks, err := r.dq.EnsureEpochs(ctx)
			if err != nil {
				if ctx.Err() == nil {
					r.redisErr(errHeal, "epochs", err) //nolint:errcheck // counted and logged
				}
				return err
			}
			// A failover or a loss after the pass's last check: the pass may
			// have compared pages before it, and the marks, written on the new
			// master, would hide it. Start over instead.
			if lost, changed := marksDiffer(h.marks, marks, true); len(lost) > 0 || len(changed) > 0 || len(marks) != len(h.marks) {
				h.noteLoss(marks, lost, changed)
				start = true
				continue
			}
			h.marks = marks
		}
		r.observe(ctx, relayobs.PassEvent{Rows: rep.Rows, Found: rep.Found, Repaired: rep.Repaired, Duration: time.Since(begun)})
		r.heal.mu.Lock()
		wasRepairing := r.heal.repairing
		r.heal.repairing = ""
		r.heal.mu.Unlock()
		if wasRepairing != "" || rep.Found > 0 {
			r.cfg.Logger.Info("relay: anti-entropy pass complete", "rows", rep.Rows, "found", rep.Found,
				"repaired", rep.Repaired, "skipped", rep.Skipped, "took", time.Since(begun).Round(time.Millisecond).String(),
				"after_loss", wasRepairing != "")
		}
		h.urgent = false
	}
	return nil
}

// healQueues are the queues a pass visits: those with queued rows in Postgres,
// read afresh (a queue Redis lost has no registry entry any more).
func (r *Relay) healQueues(ctx context.Context) []string {
	if len(r.cfg.Queues) > 0 {
		return r.cfg.Queues
	}
	qs, err := r.queuedQueues(ctx)
	if err != nil {
		if ctx.Err() == nil { // a shutdown is no outage
			r.pgErr(errHeal, "queues with queued rows", err) //nolint:errcheck // counted and logged
		}
		return nil
	}
	return qs
}

// countDivergences reports what one step found and repaired.
func (r *Relay) countDivergences(q string, before, after reconcile.Report) {
	for k, b := range after.Kinds {
		was := before.Kinds[k]
		found, repaired := b.Found-was.Found, b.Repaired-was.Repaired
		if found > 0 || repaired > 0 {
			r.observe(context.Background(), relayobs.DivergenceEvent{Queue: q, Kind: k, Found: found, Repaired: repaired,
				Sample: b.Samples[len(was.Samples):]})
		}
		if found > 0 {
			r.cfg.Logger.Info("relay: divergence between PostgreSQL and Redis", "queue", q, "kind", string(k),
				"found", found, "repaired", repaired, "sample", strings.Join(b.Samples[len(was.Samples):], ","))
		}
	}
}
