"""The write-ahead log of a replicated node with a local copy (-b DIR and
--replicate), with test_failover.py's harness (three nats-server nodes, two
beangate nodes on loopback).

    python3 tests/replication/test_wal_takeover.py build/beangate [-k NAME]

- takeover_does_not_compact_in_a_loop: issue 21 defect 7. A standby counted
  the bytes it applied from the stream as bytes of its directory; once it
  took over, every batch began a new snapshot (about 39,000 records
  migrated a second while idle). After the takeover records_migrated
  (GET /stats) must stay flat while idle.

Needs nats-server and a beangate built with libnats; skipped (77) without.
"""

import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
from testlib import arg_parser, check, parse_args, run, wait_until  # noqa: E402
import test_failover as harness  # noqa: E402


def records_migrated(node):
    status, body = harness.http_get(node.http, "/stats")
    check(status == 200, "GET /stats of %s: %s" % (node.name, status))
    return json.loads(body)["binlog_records_migrated"]


def test_takeover_does_not_compact_in_a_loop():
    # a long lease renewed less often: fewer renewals whose late answer
    # makes a primary depose itself (issue 21 defect 10, io/repl.c's part)
    harness.WORLD = world = harness.World(extra=["-s", "65536", "--replicate-lease-ms", "5000",
                                                 "--replicate-renew-ms", "500"])
    a, b = world.nodes
    a.extra += ["-b", os.path.join(world.tmp, "log-a")]
    b.extra += ["-b", os.path.join(world.tmp, "log-b")]
    world.start_pair()
    conn = harness.Conn(a.port)
    for _ in range(3000):  # the stream gets more than twice the live data
        check(conn.cmd(b"put 0 0 60 100", b"x" * 100).startswith(b"INSERTED"), "put")
    for jid in range(1, 2500):
        check(conn.cmd(b"delete %d" % jid) == b"DELETED", "delete %d" % jid)
    conn.close()
    a.proc.send_signal(signal.SIGTERM)
    check(a.proc.wait(timeout=15) == 0, "the primary's exit status after SIGTERM")
    wait_until(b.primary, "b to take over", timeout=15)
    # the snapshot a takeover begins with is done once the count stops moving
    last = [-1]

    def settled():
        now = records_migrated(b)
        done, last[0] = now == last[0], now
        return done
    wait_until(settled, "records_migrated to stop growing after the takeover (a loop of compactions?)", timeout=20,
               step=0.5)
    before = records_migrated(b)
    time.sleep(3)  # a measurement window while idle, not a wait for a condition
    after = records_migrated(b)
    print("  records migrated on the node that took over: %d, 3 s idle later %d" % (before, after), flush=True)
    check(after == before, "records_migrated grew from %d to %d in 3 s while idle: compaction in a loop"
          % (before, after))


TESTS = [test_takeover_does_not_compact_in_a_loop]

if __name__ == "__main__":
    harness.ARGS = ARGS = parse_args(arg_parser(__doc__), sys.argv)
    sys.exit(run("wal_takeover", TESTS, ARGS, namespace=globals(), setup=harness.setup, after=harness.after,
                 all_skipped=77))
