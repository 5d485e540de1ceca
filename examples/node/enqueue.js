// Enqueue a delayq task from Node inside the business transaction.
//
// The order row and its reminder task commit together or not at all: the task is
// written by the outbox's SQL API (delayq_enqueue, migration 00022) on the same
// client and in the same transaction as the order. Needs `npm ci` here (the pg
// package) and DATABASE_URL pointing at a database that `delayq migrate up`
// migrated.
//
//   node enqueue.js place order-7       # the order and its reminder, in 1 h
//   node enqueue.js place order-7       # again: the reminder is a duplicate
//   node enqueue.js rollback order-8    # the transaction rolls back: nothing
//   node enqueue.js invalid             # a refused enqueue: its SQLSTATE
'use strict';

const { Client } = require('pg');

// The SQLSTATEs the SQL API raises (docs/DESIGN.md, "The SQL API"), by class QD.
const INVALID_QUEUE = 'QD001';

// placeOrder records the order and enqueues its reminder in one transaction and
// returns the enqueue's row: { duplicate, due_at }.
async function placeOrder(client, orderId, total, fail = false) {
  await client.query('BEGIN');
  try {
    await client.query('INSERT INTO orders (id, total) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [orderId, total]);
    const { rows } = await client.query(
      `SELECT duplicate, due_at FROM delayq_enqueue(
         queue => $1, task_id => $2, payload => $3, delay => $4::interval, max_attempts => $5)`,
      ['reminder', orderId, Buffer.from(JSON.stringify({ order: orderId, total })), '1 hour', 5],
    );
    if (fail) {
      throw new Error('the business step after the enqueue failed');
    }
    await client.query('COMMIT');
    return rows[0];
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

async function main() {
  const [cmd, orderId] = process.argv.slice(2);
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query('CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total integer NOT NULL)');
    if (cmd === 'place') {
      const r = await placeOrder(client, orderId, 1250);
      console.log(r.duplicate ? `duplicate ${orderId}` : `enqueued ${orderId} due ${r.due_at.toISOString()}`);
    } else if (cmd === 'rollback') {
      try {
        await placeOrder(client, orderId, 990, true);
      } catch (err) {
        console.log(`rolled back ${orderId}`);
      }
    } else if (cmd === 'invalid') {
      try {
        await client.query('SELECT * FROM delayq_enqueue(queue => $1, task_id => $2)', ['bad queue', 'x']);
      } catch (err) {
        if (err.code !== INVALID_QUEUE) {
          throw err;
        }
        console.log(`refused ${err.code}: ${err.message}`);
      }
    } else {
      console.error('usage: node enqueue.js place|rollback ORDER_ID, or node enqueue.js invalid');
      process.exitCode = 2;
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
