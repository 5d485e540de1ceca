package tempserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file lets tests fail a master of a RedisCluster over: kill it (its replica
// is promoted by the cluster after the node timeout) or ask its replica to take
// over (CLUSTER FAILOVER), and wait until every live node agrees on the new layout.

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// ClusterNode is one node of a cluster as a live node sees it (CLUSTER NODES).
type ClusterNode struct {
	ID   string
	Addr string // host:port
	// Master is true for a master; MasterID names the master of a replica.
	Master   bool
	MasterID string
	// Failing is true when the node is flagged fail or fail? (unreachable).
	Failing bool
	// Slots are the slot ranges it serves, as [first, last] pairs.
	Slots [][2]int
}

// slotCount is how many slots n serves.
func (n ClusterNode) slotCount() int {
	c := 0
	for _, r := range n.Slots {
		c += r[1] - r[0] + 1
	}
	return c
}

// serves reports whether n serves slot.
func (n ClusterNode) serves(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// parseClusterNodes parses the reply of CLUSTER NODES.
func parseClusterNodes(s string) ([]ClusterNode, error) {
	var out []ClusterNode
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("tempserver: CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@") // ip:port@cport[,hostname]
		n := ClusterNode{ID: f[0], Addr: addr}
		for flag := range strings.SplitSeq(f[2], ",") {
			switch flag {
			case "master":
				n.Master = true
			case "fail", "fail?":
				n.Failing = true
			}
		}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being imported or migrated
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("tempserver: CLUSTER NODES slots %q", r)
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		out = append(out, n)
	}
	return out, nil
}

// running reports whether the server process is up (not stopped or killed by us).
func (r *Redis) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil
}

// nodeClient opens a client on one node.
func nodeClient(n *Redis) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
}

// Node returns the node of c listening on addr (host:port), or nil.
func (c *RedisCluster) Node(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Topology returns the cluster as the first live node sees it.
func (c *RedisCluster) Topology(ctx context.Context) ([]ClusterNode, error) {
	var lastErr error
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		view, err := nodeView(ctx, n)
		if err == nil {
			return view, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errors.New("no node running")
	}
	return nil, fmt.Errorf("tempserver: cluster topology: %w", lastErr)
}

func nodeView(ctx context.Context, n *Redis) ([]ClusterNode, error) {
	rdb := nodeClient(n)
	defer rdb.Close()
	s, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(s)
}

// Masters returns the nodes that are masters serving slots now, in the order of
// c.Nodes.
func (c *RedisCluster) Masters(ctx context.Context) ([]*Redis, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Redis
	for _, n := range c.Nodes {
		i := slices.IndexFunc(view, func(v ClusterNode) bool { return v.Addr == n.Addr() })
		if i >= 0 && view[i].Master && !view[i].Failing && len(view[i].Slots) > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// MasterFor returns the node serving the slot of key now.
func (c *RedisCluster) MasterFor(ctx context.Context, key string) (*Redis, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	slot := Slot(key)
	for _, v := range view {
		if v.Master && !v.Failing && v.serves(slot) {
			if n := c.Node(v.Addr); n != nil {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("tempserver: no live master serves slot %d of %q", slot, key)
}

// WaitReplicas waits until every master serving slots has a replica whose link to
// it is up (initial sync done), in the view of every live node. A replica that
// never synced cannot be promoted, so call it before failing a master over;
// testenv does after starting a cluster. It first sets repl-diskless-sync-delay
// to 0 on every live node, so that pending initial syncs start at once instead of
// after Redis's default 5s delay.
func (c *RedisCluster) WaitReplicas(ctx context.Context) error {
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		rdb := nodeClient(n)
		err := rdb.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("tempserver: %s: CONFIG SET: %w", n.Addr(), err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		why := c.replicated(ctx)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tempserver: replicas not in sync: %w (%s)", ctx.Err(), why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// replicated returns why not every master has a replica in sync, or "".
func (c *RedisCluster) replicated(ctx context.Context) string {
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		view, err := nodeView(ctx, n)
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER NODES: %v", n.Addr(), err)
		}
		for _, m := range view {
			if !m.Master || len(m.Slots) == 0 {
				continue
			}
			ok := false
			for _, r := range view {
				if r.MasterID != m.ID || r.Failing {
					continue
				}
				node := c.Node(r.Addr)
				if node == nil || !node.running() {
					continue
				}
				rdb := nodeClient(node)
				info, err := rdb.Info(ctx, "replication").Result()
				rdb.Close()
				if err == nil && strings.Contains(info, "master_link_status:up") {
					ok = true
				}
			}
			if !ok {
				return fmt.Sprintf("%s sees master %s without a replica in sync", n.Addr(), m.Addr)
			}
		}
	}
	return ""
}

// KillMaster kills master m (SIGKILL, as in a crash) and waits until the cluster
// has promoted a replica of it and every live node agrees that live masters serve
// every slot. It returns the promoted node. m stays down; m.Start brings it back
// (it rejoins as a replica).
//
// With lag > 0 the replicas of m fall behind first: they are frozen (SIGSTOP) and
// m drops its links to them (CLIENT KILL TYPE replica), so what m acknowledges in
// the lag before it dies never reaches the node that takes over — the writes an
// asynchronous replica loses when its master crashes. Keep lag well below the
// cluster node timeout (2s), or the frozen replicas are taken for failed too.
func (c *RedisCluster) KillMaster(ctx context.Context, m *Redis, lag time.Duration) (promoted *Redis, err error) {
	id, replicas, err := c.masterID(ctx, m)
	if err != nil {
		return nil, err
	}
	if len(replicas) == 0 {
		return nil, fmt.Errorf("tempserver: master %s has no replica to promote", m.Addr())
	}
	if lag > 0 {
		view, err := c.Topology(ctx)
		if err != nil {
			return nil, err
		}
		var frozen []*Redis
		defer func() {
			for _, r := range frozen {
				_ = r.signal(syscall.SIGCONT)
			}
		}()
		for _, v := range view {
			if v.MasterID != id {
				continue
			}
			r := c.Node(v.Addr)
			if r == nil {
				continue
			}
			if err := r.signal(syscall.SIGSTOP); err != nil {
				return nil, fmt.Errorf("tempserver: freeze replica %s: %w", r.Addr(), err)
			}
			frozen = append(frozen, r)
		}
		rdb := nodeClient(m)
		err = rdb.ClientKillByFilter(ctx, "TYPE", "replica").Err()
		rdb.Close()
		if err != nil {
			return nil, fmt.Errorf("tempserver: drop the replica links of %s: %w", m.Addr(), err)
		}
		select {
		case <-time.After(lag):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		m.Kill()
		for _, r := range frozen {
			if err := r.signal(syscall.SIGCONT); err != nil {
				return nil, fmt.Errorf("tempserver: thaw replica %s: %w", r.Addr(), err)
			}
		}
		frozen = nil
	} else {
		m.Kill()
	}
	return c.waitPromoted(ctx, id, replicas)
}

// signal sends sig to the server process.
func (r *Redis) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return errors.New("not running")
	}
	return r.proc.cmd.Process.Signal(sig)
}

// Failover asks a replica of master m to take over (CLUSTER FAILOVER: the replica
// catches up with m first, so no acknowledged write is lost), then waits as
// KillMaster does. m stays up, as a replica of the promoted node.
func (c *RedisCluster) Failover(ctx context.Context, m *Redis) (promoted *Redis, err error) {
	id, replicas, err := c.masterID(ctx, m)
	if err != nil {
		return nil, err
	}
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(view, func(v ClusterNode) bool { return v.MasterID == id && !v.Failing })
	if i < 0 {
		return nil, fmt.Errorf("tempserver: master %s has no live replica", m.Addr())
	}
	replica := c.Node(view[i].Addr)
	if replica == nil {
		return nil, fmt.Errorf("tempserver: replica %s is not a node of this cluster", view[i].Addr)
	}
	rdb := nodeClient(replica)
	err = rdb.ClusterFailover(ctx).Err()
	rdb.Close()
	if err != nil {
		return nil, fmt.Errorf("tempserver: CLUSTER FAILOVER on %s: %w", replica.Addr(), err)
	}
	return c.waitPromoted(ctx, id, replicas)
}

// masterID checks that m is a master serving slots and returns its node id and
// the ids of its replicas.
func (c *RedisCluster) masterID(ctx context.Context, m *Redis) (id string, replicas []string, err error) {
	view, err := nodeView(ctx, m)
	if err != nil {
		return "", nil, fmt.Errorf("tempserver: %s: %w", m.Addr(), err)
	}
	for _, v := range view {
		if v.Addr == m.Addr() {
			if !v.Master || len(v.Slots) == 0 {
				return "", nil, fmt.Errorf("tempserver: %s is not a master serving slots", m.Addr())
			}
			id = v.ID
		}
	}
	if id == "" {
		return "", nil, fmt.Errorf("tempserver: %s not in its own CLUSTER NODES", m.Addr())
	}
	for _, v := range view {
		if v.MasterID == id {
			replicas = append(replicas, v.ID)
		}
	}
	return id, replicas, nil
}

// waitPromoted waits until one of the replicas of the master with node id old
// serves slots in the view of every live node, the old master serves none, and
// every live node reports cluster_state:ok with every slot served by a master it
// does not flag as failing.
func (c *RedisCluster) waitPromoted(ctx context.Context, old string, replicas []string) (*Redis, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var why string
	for {
		promoted, reason := c.settled(ctx, old, replicas)
		if promoted != nil {
			return promoted, nil
		}
		why = reason
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("tempserver: failover of %s not done: %w (%s)", old, ctx.Err(), why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// settled returns the promoted node once every live node agrees, else why not.
func (c *RedisCluster) settled(ctx context.Context, old string, replicas []string) (*Redis, string) {
	var promotedAddr string
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		rdb := nodeClient(n)
		info, err := rdb.ClusterInfo(ctx).Result()
		rdb.Close()
		if err != nil {
			return nil, fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return nil, n.Addr() + ": cluster_state not ok"
		}
		view, err := nodeView(ctx, n)
		if err != nil {
			return nil, fmt.Sprintf("%s: CLUSTER NODES: %v", n.Addr(), err)
		}
		served, addr := 0, ""
		for _, v := range view {
			if v.ID == old && v.Master && len(v.Slots) > 0 {
				return nil, n.Addr() + ": the old master still serves slots"
			}
			if v.Master && !v.Failing {
				served += v.slotCount()
			}
		}
		if served != clusterSlots {
			return nil, fmt.Sprintf("%s: %d of %d slots served by live masters", n.Addr(), served, clusterSlots)
		}
		for _, v := range view {
			if v.Master && !v.Failing && len(v.Slots) > 0 && slices.Contains(replicas, v.ID) {
				addr = v.Addr
			}
		}
		if addr == "" {
			return nil, n.Addr() + ": no former replica of the old master is master"
		}
		if promotedAddr != "" && promotedAddr != addr {
			return nil, fmt.Sprintf("views disagree: %s and %s", promotedAddr, addr)
		}
		promotedAddr = addr
	}
	if promotedAddr == "" {
		return nil, "no node running"
	}
	p := c.Node(promotedAddr)
	if p == nil {
		return nil, promotedAddr + " is not a node of this cluster"
	}
	return p, ""
}

// Slot returns the Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (the
// content of the first non-empty {...}) or of the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// MoveSlot moves a hash slot, with its keys, to master to, as redis-cli --cluster
// reshard does: BeginSlotMove, MigrateKeys (100 at a time) until none is left,
// Finish.
func (c *RedisCluster) MoveSlot(ctx context.Context, slot int, to *Redis) error {
	m, err := c.BeginSlotMove(ctx, slot, to)
	if err != nil || m == nil {
		return err
	}
	defer m.Close()
	for {
		n, err := m.MigrateKeys(ctx, 100)
		if err != nil {
			return err
		}
		if n == 0 {
			return m.Finish(ctx)
		}
	}
}

// SlotMove is a slot on its way from one master to another (BeginSlotMove).
type SlotMove struct {
	c        *RedisCluster
	slot     int
	from, to ClusterNode
	src, dst *redis.Client
	view     []ClusterNode
}

// BeginSlotMove starts moving slot to master to: the target imports it, the
// source migrates it. Until Finish, a command on keys of the slot gets ASK for a
// key that has moved, and a command on several keys of which some are missing
// gets TRYAGAIN. It returns nil (and no error) when to serves the slot already.
func (c *RedisCluster) BeginSlotMove(ctx context.Context, slot int, to *Redis) (*SlotMove, error) {
	view, err := c.Topology(ctx)
	if err != nil {
		return nil, err
	}
	m := &SlotMove{c: c, slot: slot, view: view}
	var haveFrom, haveTo bool
	for _, v := range view {
		if v.Master && !v.Failing && v.serves(slot) {
			m.from, haveFrom = v, true
		}
		if v.Addr == to.Addr() {
			m.to, haveTo = v, true
		}
	}
	switch {
	case !haveFrom:
		return nil, fmt.Errorf("tempserver: no live master serves slot %d", slot)
	case !haveTo || !m.to.Master || m.to.Failing:
		return nil, fmt.Errorf("tempserver: %s is not a live master", to.Addr())
	case m.from.ID == m.to.ID:
		return nil, nil
	}
	src := c.Node(m.from.Addr)
	if src == nil {
		return nil, fmt.Errorf("tempserver: %s is not a node of this cluster", m.from.Addr)
	}
	m.src, m.dst = nodeClient(src), nodeClient(to)
	if err := m.dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.from.ID).Err(); err != nil {
		m.Close()
		return nil, fmt.Errorf("tempserver: SETSLOT %d IMPORTING on %s: %w", slot, to.Addr(), err)
	}
	if err := m.src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.to.ID).Err(); err != nil {
		m.Close()
		return nil, fmt.Errorf("tempserver: SETSLOT %d MIGRATING on %s: %w", slot, src.Addr(), err)
	}
	return m, nil
}

// MigrateKeys moves up to n keys of the slot to the target (MIGRATE) and returns
// how many it moved: 0 when none is left on the source.
func (m *SlotMove) MigrateKeys(ctx context.Context, n int) (int, error) {
	keys, err := m.src.ClusterGetKeysInSlot(ctx, m.slot, n).Result()
	if err != nil {
		return 0, fmt.Errorf("tempserver: GETKEYSINSLOT %d on %s: %w", m.slot, m.from.Addr, err)
	}
	if len(keys) == 0 {
		return 0, nil
	}
	host, port, _ := strings.Cut(m.to.Addr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 10000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := m.src.Do(ctx, args...).Err(); err != nil {
		return 0, fmt.Errorf("tempserver: MIGRATE %d keys of slot %d to %s: %w", len(keys), m.slot, m.to.Addr, err)
	}
	return len(keys), nil
}

// Finish gives the slot to the target on every master, once no key is left on the
// source, and waits until every live node agrees.
func (m *SlotMove) Finish(ctx context.Context) error {
	if n, err := m.src.ClusterCountKeysInSlot(ctx, m.slot).Result(); err != nil || n > 0 {
		return fmt.Errorf("tempserver: slot %d: %d keys left on %s (%v)", m.slot, n, m.from.Addr, err)
	}
	// The target first, so that it owns the slot before the source stops
	// redirecting to it; then the source and the other masters (as redis-cli).
	for _, v := range append([]ClusterNode{m.to, m.from}, m.view...) {
		n := m.c.Node(v.Addr)
		if !v.Master || v.Failing || n == nil || !n.running() {
			continue
		}
		rdb := nodeClient(n)
		err := rdb.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.to.ID).Err()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("tempserver: SETSLOT %d NODE on %s: %w", m.slot, v.Addr, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		why := ""
		for _, n := range m.c.Nodes {
			if !n.running() {
				continue
			}
			view, err := nodeView(ctx, n)
			if err != nil {
				why = err.Error()
				break
			}
			i := slices.IndexFunc(view, func(v ClusterNode) bool { return v.Master && v.serves(m.slot) })
			if i < 0 || view[i].ID != m.to.ID {
				why = fmt.Sprintf("%s does not see slot %d on %s yet", n.Addr(), m.slot, m.to.Addr)
				break
			}
		}
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tempserver: move slot %d: %w (%s)", m.slot, ctx.Err(), why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close releases the connections of m (it does not undo the move).
func (m *SlotMove) Close() {
	if m.src != nil {
		m.src.Close()
	}
	if m.dst != nil {
		m.dst.Close()
	}
}
