#!/usr/bin/env python3
"""Enqueue a delayq task from Python inside the business transaction.

The order row and its reminder task commit together or not at all: the task is
written by the outbox's SQL API (delayq_enqueue, migration 00022) on the same
connection and in the same transaction as the order. Needs psycopg 3 (Debian:
apt-get install python3-psycopg) and DATABASE_URL pointing at a database that
`delayq migrate up` migrated.

    python3 enqueue.py place order-7       # the order and its reminder, in 1 h
    python3 enqueue.py place order-7       # again: the reminder is a duplicate
    python3 enqueue.py rollback order-8    # the transaction rolls back: nothing
    python3 enqueue.py invalid             # a refused enqueue: its SQLSTATE
"""

import json
import os
import sys
from datetime import timedelta

import psycopg

# The SQLSTATEs the SQL API raises (docs/DESIGN.md, "The SQL API"), by class QD.
INVALID_QUEUE = "QD001"


def place_order(conn, order_id, total, fail=False):
    """Records the order and enqueues its reminder in one transaction.

    Returns True when the reminder was a duplicate (the order was placed before).
    """
    with conn.transaction():
        conn.execute(
            "INSERT INTO orders (id, total) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
            (order_id, total),
        )
        duplicate, due_at = conn.execute(
            "SELECT duplicate, due_at FROM delayq_enqueue("
            "queue => %s, task_id => %s, payload => %s, delay => %s, max_attempts => %s)",
            (
                "reminder",
                order_id,
                json.dumps({"order": order_id, "total": total}).encode(),
                timedelta(hours=1),
                5,
            ),
        ).fetchone()
        if fail:
            raise RuntimeError("the business step after the enqueue failed")
    return duplicate, due_at


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total integer NOT NULL)")
        conn.commit()
        if cmd == "place":
            duplicate, due_at = place_order(conn, sys.argv[2], 1250)
            if duplicate:
                print(f"duplicate {sys.argv[2]}")
            else:
                print(f"enqueued {sys.argv[2]} due {due_at.isoformat()}")
        elif cmd == "rollback":
            try:
                place_order(conn, sys.argv[2], 990, fail=True)
            except RuntimeError:
                print(f"rolled back {sys.argv[2]}")
        elif cmd == "invalid":
            try:
                with conn.transaction():
                    conn.execute("SELECT * FROM delayq_enqueue(queue => %s, task_id => %s)", ("bad queue", "x"))
            except psycopg.Error as e:
                if e.sqlstate == INVALID_QUEUE:
                    print(f"refused {e.sqlstate}: {e.diag.message_primary}")
                else:
                    raise
        else:
            sys.exit("usage: enqueue.py place|rollback ORDER_ID, or enqueue.py invalid")


if __name__ == "__main__":
    main()
