#!/usr/bin/env python3
"""A transactional delayq worker in Python: its effect happens exactly once.

`delayq worker --transactional` runs this script once per task (the worker
protocol: docs/worker-protocol.md). The payload comes on stdin, the task in the
environment. The script records the reminder it sends and completes the task
with delayq_complete (migration 00027) in one transaction: both commit or
neither. When another run of the task committed first (a worker killed with
SIGKILL, a lease that expired under a slow run), delayq_complete refuses this
one, the transaction rolls back, and the effect is not written twice.

    delayq worker --queue reminder --transactional --exec 'python3 worker.py'

The effect is a row of reminders_sent, a table without a unique key on purpose:
the guard alone keeps the rows to one per order.

    CREATE TABLE reminders_sent (order_id text NOT NULL, total integer NOT NULL,
        attempt integer NOT NULL, sent_at timestamptz NOT NULL DEFAULT now());

Needs psycopg 3 (Debian: apt-get install python3-psycopg). --hold SECONDS
keeps the run's transaction open that long before completing, to watch the
guard at work: kill the worker meanwhile, and another takes the task over once
the lease expires.
"""

import argparse
import json
import os
import sys
import time

import psycopg
from psycopg import sql

# delayq_complete's refusals (docs/worker-protocol.md): the task finished
# already (another run completed it) or holds another version (rescheduled).
FINISHED, STALE = "QD021", "QD022"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold", type=float, default=0, metavar="SECONDS")
    args = parser.parse_args()

    queue, task_id = os.environ["DELAYQ_QUEUE"], os.environ["DELAYQ_TASK_ID"]
    version, attempt = int(os.environ["DELAYQ_VERSION"]), int(os.environ["DELAYQ_ATTEMPT"])
    order = json.loads(sys.stdin.buffer.read())
    complete = sql.SQL("SELECT {}.delayq_complete(%s, %s, %s)").format(
        sql.Identifier(os.environ.get("DELAYQ_SCHEMA") or "public")
    )

    with psycopg.connect(os.environ["DELAYQ_DATABASE_URL"]) as conn:
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO reminders_sent (order_id, total, attempt) VALUES (%s, %s, %s)",
                    (order["order"], order["total"], attempt),
                )
                if args.hold > 0:
                    print(f"holding {task_id} pid {os.getpid()}", flush=True)
                    time.sleep(args.hold)
                # Last, so the task's row is locked only for the commit.
                conn.execute(complete, (queue, task_id, version))
        except psycopg.Error as e:
            if e.sqlstate not in (FINISHED, STALE):
                raise  # exit 1: the task is retried after the backoff
            # Exit 0: the worker reads the task's row and acknowledges it.
            print(f"refused {task_id} attempt {attempt} {e.sqlstate}: {e.diag.message_primary}", flush=True)
            return
    print(f"sent {task_id} attempt {attempt}", flush=True)


if __name__ == "__main__":
    main()
