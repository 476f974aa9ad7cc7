"""The write-ahead log of a replicated node with a local copy (-b DIR and
--replicate), with test_failover.py's harness (three nats-server nodes, two
beangate nodes on loopback).

    python3 tests/replication/test_wal_takeover.py build/beangate [-k NAME]

- takeover_does_not_compact_in_a_loop: issue 21 defect 7. A standby counted
  the bytes it applied from the stream as bytes of its directory; once it
  took over, every batch began a new snapshot (about 39,000 records
  migrated a second while idle). After the takeover records_migrated
  (GET /stats) must stay flat while idle.
- local_disk_failure_does_not_stop_the_stream: issue 21 defect 6. With -b
  and --replicate the stream is the log of record and the directory a local
  copy; a failing local disk (BEANGATE_TEST_DISK_FAULTS 'write EIO') made
  puts answer OUT_OF_MEMORY (flush_batch returned before repl_append). Now
  puts are acknowledged (-f 0: once the stream has them), the copy is
  dropped (wal_copy_failed) and started again with a snapshot when the disk
  works, and the standby that takes over has every job.

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
from testlib import DiskFaults, arg_parser, check, parse_args, run, wait_until  # noqa: E402
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


def test_local_disk_failure_does_not_stop_the_stream():
    harness.WORLD = world = harness.World(extra=["--replicate-lease-ms", "5000", "--replicate-renew-ms", "500"])
    a, b = world.nodes
    a.extra += ["-b", os.path.join(world.tmp, "log-a")]
    b.extra += ["-b", os.path.join(world.tmp, "log-b")]
    faults = DiskFaults(os.path.join(world.tmp, "a.faults"))
    plain_env = harness.clean_env
    harness.clean_env = lambda extra=None: plain_env(dict(faults.env(), **(extra or {})))
    try:
        a.start()  # node a alone has the disk-fault hook
    finally:
        harness.clean_env = plain_env
    wait_until(a.primary, "node a to become primary", timeout=30)
    b.start()
    wait_until(b.standby, "node b to be a standby", timeout=30)
    conn = harness.Conn(a.port)
    bodies = {}
    for i in range(20):
        reply = conn.cmd(b"put 0 0 60 6", b"ok-%03d" % i)
        check(reply.startswith(b"INSERTED"), "put before the disk fails: %r" % reply)
        bodies[int(reply.split()[1])] = b"ok-%03d" % i
    faults.set(["write EIO"])
    for i in range(50):
        reply = conn.cmd(b"put 0 0 60 6", b"ko-%03d" % i)
        check(reply.startswith(b"INSERTED"), "put %d while the local disk fails: %r (stderr: %s)"
              % (i, reply, a.stderr()[-600:]))
        bodies[int(reply.split()[1])] = b"ko-%03d" % i
    check("event=wal_copy_failed" in a.stderr(), "no wal_copy_failed on a: %s" % a.stderr()[-600:])
    faults.clear()
    for i in range(10):  # the copy starts again (a snapshot) once the disk works
        reply = conn.cmd(b"put 0 0 60 6", b"ag-%03d" % i)
        check(reply.startswith(b"INSERTED"), "put after the disk works again: %r" % reply)
        bodies[int(reply.split()[1])] = b"ag-%03d" % i
    # the copy's new snapshot writes every job again (records_migrated)
    wait_until(lambda: records_migrated(a) >= len(bodies) - 10, "the local copy started again (a snapshot)",
               timeout=20, step=0.2)
    conn.close()
    a.proc.send_signal(signal.SIGTERM)
    code = a.proc.wait(timeout=15)
    check(code == 0, "a's exit status after SIGTERM: %s (stderr: %s)" % (code, a.stderr()[-600:]))
    wait_until(b.primary, "b to take over", timeout=15)
    found = harness.Conn(b.port).peek_many(sorted(bodies))
    missing = [j for j, body in bodies.items() if found.get(j) != body]
    check(not missing, "%d acknowledged jobs missing on the new primary: %s" % (len(missing), missing[:10]))
    print("  %d puts acknowledged, 50 of them while a's disk failed; all on b after the takeover"
          % len(bodies), flush=True)


TESTS = [test_takeover_does_not_compact_in_a_loop, test_local_disk_failure_does_not_stop_the_stream]

if __name__ == "__main__":
    harness.ARGS = ARGS = parse_args(arg_parser(__doc__), sys.argv)
    sys.exit(run("wal_takeover", TESTS, ARGS, namespace=globals(), setup=harness.setup, after=harness.after,
                 all_skipped=77))
