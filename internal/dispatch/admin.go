package dispatch

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

// This file holds what reconcile and the consistency check need beyond the worker's
// calls: an atomic read of hashes and memberships (Probe), compare-and-set repairs
// (RepairIf) and iteration over everything Redis holds for a queue (ScanIDs, Queues).

// Probe is an atomic read of one task: its hash and its membership of each ZSET.
type Probe struct {
	ID string
	// State is the status in the hash; StateMissing when there is no hash.
	State       State
	Version     int // 0 when absent (a done hash keeps no version)
	Attempt     int
	MaxAttempts int
	// InReady, InActive and InDead tell which ZSETs hold the id, with its score there
	// (due time, lease deadline, time of death).
	InReady, InActive, InDead          bool
	ReadyScore, ActiveScore, DeadScore time.Time
	// Fingerprint changes with any of the above and with the lease token. Pass it to
	// RepairIf, which acts only while it is unchanged.
	Fingerprint string
}

// Consistent reports whether the hash and the memberships agree: a ready, active or
// dead task is a member of exactly its own ZSET; a done or missing one of none.
func (p Probe) Consistent() bool {
	r, a, d := p.InReady, p.InActive, p.InDead
	switch p.State {
	case StateReady:
		return r && !a && !d
	case StateActive:
		return a && !r && !d
	case StateDead:
		return d && !r && !a
	default:
		return !r && !a && !d
	}
}

const (
	probeGroup = 8
	maxRepair  = 1000
)

// adminScript loads an admin script. The admin calls are rare (reconcile, check),
// so the script is built per call rather than kept in Client.
func adminScript(name string) (*redis.Script, error) {
	src, err := scriptSource(name)
	if err != nil {
		return nil, err
	}
	return redis.NewScript(src), nil
}

// Probe reads up to 1000 tasks of queue in one atomic step (one a shard, in one
// round trip), in the order of ids, with the Redis clock at that moment (the
// earliest of the shards' clocks).
func (c *Client) Probe(ctx context.Context, queue string, ids ...string) (now time.Time, probes []Probe, err error) {
	return c.ProbeRouted(ctx, queue, 0, ids...)
}

// ProbeRouted is Probe routed by shards, queue's shard count as the caller holds
// it (reconcile and the relay's repairs: Postgres's), whatever count Redis holds
// or has lost; 0 is Probe. Pass the same count to RepairIfRouted.
func (c *Client) ProbeRouted(ctx context.Context, queue string, shards int, ids ...string) (now time.Time, probes []Probe, err error) {
	if err := validate.Queue(queue); err != nil {
		return time.Time{}, nil, err
	}
	if len(ids) == 0 || len(ids) > maxInspect {
		return time.Time{}, nil, fmt.Errorf("%w: probe %d ids: 1..%d", ErrInvalidArgument, len(ids), maxInspect)
	}
	for _, id := range ids {
		if err := validate.TaskID(id); err != nil {
			return time.Time{}, nil, err
		}
	}
	s, err := adminScript("probe")
	if err != nil {
		return time.Time{}, nil, err
	}
	l, err := c.routed(ctx, queue, shards)
	if err != nil {
		return time.Time{}, nil, err
	}
	out := make([]Probe, len(ids))
	err = c.perShard(ctx, s, l, ids,
		func(k Keys) []string { return []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.KeyPrefix} },
		func(v any, ids []string, pos []int) error {
			t, ps, err := parseProbe(v, ids)
			if err != nil {
				return err
			}
			if now.IsZero() || t.Before(now) {
				now = t
			}
			for j, p := range pos {
				out[p] = ps[j]
			}
			return nil
		})
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("delayq: probe %s: %w", queue, err)
	}
	return now, out, nil
}

func parseProbe(v any, ids []string) (time.Time, []Probe, error) {
	a, err := asArray(v, "probe")
	if err != nil {
		return time.Time{}, nil, err
	}
	if len(a) != 1+len(ids)*probeGroup {
		return time.Time{}, nil, replyErr("probe: %d fields for %d ids", len(a), len(ids))
	}
	now, err := scoreField(a[0], "probe now")
	if err != nil {
		return time.Time{}, nil, err
	}
	out := make([]Probe, len(ids))
	for i, id := range ids {
		g := a[1+i*probeGroup : 1+(i+1)*probeGroup]
		p := Probe{ID: id}
		s, err := asString(g[0], "probe status")
		if err != nil {
			return time.Time{}, nil, err
		}
		if p.State, err = stateOf(s); err != nil {
			return time.Time{}, nil, err
		}
		var n [3]int64
		for j := range n {
			if n[j], err = asNumber(g[1+j], "probe number"); err != nil {
				return time.Time{}, nil, err
			}
		}
		p.Version, p.Attempt, p.MaxAttempts = int(n[0]), int(n[1]), int(n[2])
		for j, dst := range []struct {
			in *bool
			at *time.Time
		}{{&p.InReady, &p.ReadyScore}, {&p.InActive, &p.ActiveScore}, {&p.InDead, &p.DeadScore}} {
			sc, err := asString(g[4+j], "probe score")
			if err != nil {
				return time.Time{}, nil, err
			}
			if sc == "" {
				continue
			}
			*dst.in = true
			if *dst.at, err = parseScore(sc); err != nil {
				return time.Time{}, nil, err
			}
		}
		if p.Fingerprint, err = asString(g[7], "probe fingerprint"); err != nil {
			return time.Time{}, nil, err
		}
		out[i] = p
	}
	return now, out, nil
}

func stateOf(s string) (State, error) {
	switch s {
	case "":
		return StateMissing, nil
	case "r":
		return StateReady, nil
	case "a":
		return StateActive, nil
	case "d":
		return StateDone, nil
	case "x":
		return StateDead, nil
	}
	return "", replyErr("status %q", s)
}

// RepairOp is what RepairIf does to one task.
type RepairOp int

const (
	// RepairRemove deletes the task hash and the id from every ZSET.
	RepairRemove RepairOp = iota + 1
	// RepairRestore replaces whatever Redis holds for the id with Repair.Task, ready
	// at its RunAt (zero: now), with its Attempt, MaxAttempts and Version.
	RepairRestore
	// RepairExpire takes an active task that lost its place in the active ZSET (or
	// is in another ZSET too): it leaves ready and dead and enters active with an
	// expired lease, unless it is there already, so that the reaper takes it back.
	// Applied only to an active task.
	RepairExpire
	// RepairKill makes a task that Postgres holds dead dead in Redis too, with
	// Repair.Error as its last error: its lease revoked, in the dead ZSET only,
	// its payload kept. Not applied to a task without a hash.
	RepairKill
)

func (o RepairOp) String() string {
	switch o {
	case RepairRemove:
		return "remove"
	case RepairRestore:
		return "restore"
	case RepairExpire:
		return "expire"
	case RepairKill:
		return "kill"
	}
	return fmt.Sprintf("RepairOp(%d)", int(o))
}

// Repair is one compare-and-set repair for RepairIf.
type Repair struct {
	Op RepairOp
	ID string
	// Fingerprint is Probe.Fingerprint of the task: the repair is applied only if
	// the task has not changed since that probe.
	Fingerprint string
	// Task is what RepairRestore writes (its ID is ignored; Repair.ID counts).
	Task Task
	// Error is the last error RepairKill records (at most 4096 bytes).
	Error string
}

// RepairIf applies repairs to tasks of queue, each only if its task is unchanged
// since the probe that produced its fingerprint, and reports which were applied.
// One script call runs up to 1000 repairs of one shard atomically; longer lists,
// or repairs in several shards, take several.
// Every repair is validated before anything is written.
func (c *Client) RepairIf(ctx context.Context, queue string, repairs ...Repair) ([]bool, error) {
	return c.RepairIfRouted(ctx, queue, 0, repairs...)
}

// RepairIfRouted is RepairIf routed by shards, queue's shard count as the caller
// holds it (as for ProbeRouted); 0 is RepairIf. A restore routed by the count
// Postgres holds puts a task into its own shard even while Redis has lost the
// count.
func (c *Client) RepairIfRouted(ctx context.Context, queue string, shards int, repairs ...Repair) ([]bool, error) {
	if err := validate.Queue(queue); err != nil {
		return nil, err
	}
	for i, r := range repairs {
		if err := validate.TaskID(r.ID); err != nil {
			return nil, fmt.Errorf("delayq: repair %s: %d: %w", queue, i, err)
		}
		switch r.Op {
		case RepairRemove, RepairExpire:
		case RepairKill:
			if len(r.Error) > 4096 {
				return nil, fmt.Errorf("%w: repair %s: %d: error of %d bytes, at most 4096", ErrInvalidArgument, queue, i, len(r.Error))
			}
		case RepairRestore:
			t := r.Task
			t.ID = r.ID
			if err := c.checkTask(t, validate.MaxPayloadBytes); err != nil {
				return nil, fmt.Errorf("delayq: repair %s: %d: %w", queue, i, err)
			}
		default:
			return nil, fmt.Errorf("%w: repair %s: %d: op %v", ErrInvalidArgument, queue, i, r.Op)
		}
	}
	s, err := adminScript("repair")
	if err != nil {
		return nil, err
	}
	l, err := c.routed(ctx, queue, shards)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(repairs))
	for k, pos := range byShard(l, len(repairs), func(i int) string { return repairs[i].ID }) {
		part := make([]Repair, len(pos))
		for j, p := range pos {
			part[j] = repairs[p]
		}
		applied, err := c.repairShard(ctx, s, queue, l[k], part)
		if err != nil {
			return nil, err
		}
		for j, p := range pos {
			out[p] = applied[j]
		}
	}
	return out, nil
}

// repairShard runs the repairs of one shard, maxRepair a script call.
func (c *Client) repairShard(ctx context.Context, s *redis.Script, queue string, k Keys, repairs []Repair) ([]bool, error) {
	out := make([]bool, 0, len(repairs))
	for start := 0; start < len(repairs); start += maxRepair {
		batch := repairs[start:min(start+maxRepair, len(repairs))]
		args := make([]any, 0, 2+(3+taskFields)*len(batch))
		args = append(args, k.Wake, len(batch))
		for _, r := range batch {
			args = append(args, r.Op.String(), r.ID, r.Fingerprint)
			switch r.Op {
			case RepairKill:
				args = append(args, "", r.Error, "", "", "", "", "", "", "")
			case RepairRemove, RepairExpire:
				args = append(args, "", "", "", "", "", "", "", "", "")
			default:
				args = c.appendTask(args, r.Task)
			}
		}
		v, err := c.run(ctx, s, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix}, args...)
		if err != nil {
			return out, fmt.Errorf("delayq: repair %s: %w", queue, err)
		}
		if out, err = appendApplied(out, v, "repair", len(batch)); err != nil {
			return out, err
		}
	}
	return out, nil
}

// ScanCursor walks everything Redis holds for one queue with ScanIDs: the members of
// ready, active and dead, then the task hash keys. The zero value starts a walk.
type ScanCursor struct {
	shard  int // of a sharded queue, walked one after the other
	phase  int // 0 ready, 1 active, 2 dead, 3 task keys, 4 done
	cursor uint64
	deep   bool
}

// DeepScanCursor starts a walk that, after the three ZSETs, also SCANs the keyspace
// of the queue's node for task hashes outside every ZSET (a done record, a hash
// left by a lost write). The zero ScanCursor walks the ZSETs alone: its cost
// follows the queue, not the keyspace.
func DeepScanCursor() ScanCursor { return ScanCursor{deep: true} }

// Done reports whether the walk is over.
func (s ScanCursor) Done() bool { return s.phase >= 4 }

// ScanIDs returns the next ids of queue, about count at a time (ZSCAN and SCAN
// semantics: an id present for the whole walk is returned at least once; an id can
// come more than once, in several ZSETs or as a key too; a batch can be empty before
// the walk is over). The task keys come from a SCAN of the node holding the queue:
// it visits the whole keyspace of that node, with MATCH on the queue's key prefix.
// A sharded queue's shards are walked one after the other.
func (c *Client) ScanIDs(ctx context.Context, queue string, cur ScanCursor, count int) ([]string, ScanCursor, error) {
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return nil, cur, err
	}
	if count < 1 {
		return nil, cur, fmt.Errorf("%w: scan count %d: at least 1", ErrInvalidArgument, count)
	}
	if cur.Done() || cur.shard >= len(l) {
		return nil, ScanCursor{phase: 4}, nil
	}
	k := l[cur.shard]
	next := cur
	var ids []string
	if cur.phase < 3 {
		key := []string{k.Ready, k.Active, k.Dead}[cur.phase]
		kv, c2, err := c.rdb.ZScan(ctx, key, cur.cursor, "", int64(count)).Result()
		if err != nil {
			return nil, cur, fmt.Errorf("delayq: scan %s: %w", key, err)
		}
		for i := 0; i < len(kv); i += 2 {
			ids = append(ids, kv[i])
		}
		next.cursor = c2
	} else {
		node, err := c.nodeFor(ctx, k.Ready)
		if err != nil {
			return nil, cur, err
		}
		keys, c2, err := node.Scan(ctx, cur.cursor, k.TaskPrefix+"*", int64(count)).Result()
		if err != nil {
			return nil, cur, fmt.Errorf("delayq: scan %s*: %w", k.TaskPrefix, err)
		}
		for _, key := range keys {
			if id, ok := strings.CutPrefix(key, k.TaskPrefix); ok && id != "" {
				ids = append(ids, id)
			}
		}
		next.cursor = c2
	}
	if next.cursor == 0 {
		next.phase++
		if next.phase == 3 && !next.deep {
			next.phase = 4
		}
		if next.phase == 4 && next.shard+1 < len(l) {
			next.shard, next.phase = next.shard+1, 0
		}
	}
	return ids, next, nil
}

// nodeFor returns the client of the node holding key: on a Cluster its master, else
// the client itself.
func (c *Client) nodeFor(ctx context.Context, key string) (redis.Cmdable, error) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("delayq: cluster node of %s: %w", key, err)
		}
		return n, nil
	}
	return c.rdb, nil
}

// Queues lists, sorted, the queues with any key under the prefix. It SCANs the whole
// keyspace (every master of a Cluster): an operator's call, not one for a hot path.
func (c *Client) Queues(ctx context.Context) ([]string, error) {
	pattern := c.cfg.Prefix + ":{*}:*"
	var mu sync.Mutex
	seen := map[string]bool{}
	scan := func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return fmt.Errorf("delayq: scan %s: %w", pattern, err)
			}
			mu.Lock()
			for _, key := range keys {
				if q, ok := c.queueOf(key); ok {
					seen[q] = true
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(ctx, c.rdb)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(seen))
	for q := range seen {
		out = append(out, q)
	}
	sort.Strings(out)
	return out, nil
}

// queueOf returns the queue of a key laid out by KeysFor or ShardKeys.
func (c *Client) queueOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, c.cfg.Prefix+":{")
	if !ok {
		return "", false
	}
	q, _, ok := strings.Cut(rest, "}:")
	q, _, _ = strings.Cut(q, "#") // a shard's hash tag: "<queue>#<k>.<s>"
	if !ok || validate.Queue(q) != nil {
		return "", false
	}
	return q, true
}
