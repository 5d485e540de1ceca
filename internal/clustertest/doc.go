// Package clustertest runs delayq, the relay, the worker and reconcile against a
// real Redis Cluster (3 masters with one replica each, started from local
// redis-server binaries by internal/testenv) with 50 queues spread over its slots
// and every master. It holds tests only:
//
//   - TestCluster: enqueue, claim, complete, retry, kill and reap with concurrent
//     claimers; pipelined enqueues spanning every node; wake-ups (PUBLISH in the
//     scripts, SUBSCRIBE in the Waiter) across nodes; the relay moving 5,000
//     outbox rows; workers with transactional handlers applying each effect once;
//     a queue's slot migrating to another master (its scripts refused with
//     TRYAGAIN until the move is done, nothing lost).
//   - TestClusterFailover: a master crash with a lagging replica, a graceful
//     failover, then 5 slots resharded, under load, each followed by reconcile:
//     nothing lost, no effect applied twice.
//
// The clients are go-redis ClusterClients with a short ClusterStateReloadInterval
// (see testenv.ClusterOptions): with go-redis's default of 60s a client keeps
// dialing a dead master for up to a minute after its replica took over.
package clustertest
