// A transactional delayq worker in Node: its effect happens exactly once.
//
// `delayq worker --transactional` runs this script once per task (the worker
// protocol: docs/worker-protocol.md). The payload comes on stdin, the task in the
// environment. The script records the reminder it sends and completes the task
// with delayq_complete (migration 00027) in one transaction: both commit or
// neither. When another run of the task committed first (a worker killed with
// SIGKILL, a lease that expired under a slow run), delayq_complete refuses this
// one, the transaction rolls back, and the effect is not written twice.
//
//   delayq worker --queue reminder --transactional --exec 'node worker.js'
//
// The effect is a row of reminders_sent, a table without a unique key on purpose:
// the guard alone keeps the rows to one per order (worker.py's table). Needs
// `npm ci` here (the pg package). --hold SECONDS keeps the run's transaction open
// that long before completing, to watch the guard at work: kill the worker
// meanwhile, and another takes the task over once the lease expires.
'use strict';

const fs = require('fs');
const { Client } = require('pg');

// delayq_complete's refusals (docs/worker-protocol.md): the task finished
// already (another run completed it) or holds another version (rescheduled).
const FINISHED = 'QD021';
const STALE = 'QD022';

async function main() {
  const args = process.argv.slice(2);
  const i = args.indexOf('--hold');
  const hold = i >= 0 ? Number(args[i + 1]) : 0;
  const env = process.env;
  const queue = env.DELAYQ_QUEUE;
  const taskId = env.DELAYQ_TASK_ID;
  const version = Number(env.DELAYQ_VERSION);
  const attempt = Number(env.DELAYQ_ATTEMPT);
  const order = JSON.parse(fs.readFileSync(0));
  const schema = (env.DELAYQ_SCHEMA || 'public').replace(/"/g, '""');

  const client = new Client({ connectionString: env.DELAYQ_DATABASE_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    try {
      await client.query('INSERT INTO reminders_sent (order_id, total, attempt) VALUES ($1, $2, $3)',
        [order.order, order.total, attempt]);
      if (hold > 0) {
        console.log(`holding ${taskId} pid ${process.pid}`);
        await new Promise((resolve) => setTimeout(resolve, hold * 1000));
      }
      // Last, so the task's row is locked only for the commit.
      await client.query(`SELECT "${schema}".delayq_complete($1, $2, $3)`, [queue, taskId, version]);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      if (err.code !== FINISHED && err.code !== STALE) {
        throw err; // exit 1: the task is retried after the backoff
      }
      // Exit 0: the worker reads the task's row and acknowledges it.
      console.log(`refused ${taskId} attempt ${attempt} ${err.code}: ${err.message}`);
      return;
    }
  } finally {
    await client.end();
  }
  console.log(`sent ${taskId} attempt ${attempt}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
