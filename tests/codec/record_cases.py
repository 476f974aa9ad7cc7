#!/usr/bin/env python3
"""Record expected beanstalk protocol replies from the reference server.

For every directory tests/codec/cases/<name>/ that holds an `input` file:
  * start a fresh `beanstalkd -l 127.0.0.1 -p PORT [flags...]` (extra flags
    are read from an optional `flags` file, whitespace separated),
  * open one TCP connection, send all of `input` at once,
  * read until the socket is quiet for QUIET seconds or the server closes it,
  * write the raw reply bytes to `expected`, and create an empty `closed`
    file iff the server closed the connection within that window (or, with
    --check, compare both with what is stored and report differences).

Usage:
  record_cases.py [--check] [--jobs N] [--server PATH] [CASE...]

Only ports 21000-21099 on 127.0.0.1 are used.  Python 3 stdlib only.
"""
import argparse
import concurrent.futures
import os
import queue
import shlex
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "cases")
PORTS = range(21000, 21100)
QUIET = 0.3          # seconds of silence that end a recording
MAX_TOTAL = 10.0     # hard cap on one recording, seconds

_ports = queue.Queue()
for _p in PORTS:
    _ports.put(_p)


def read_flags(case_dir):
    path = os.path.join(case_dir, "flags")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return shlex.split(f.read())


def start_server(server, flags):
    """Start a fresh server on a free port; return (proc, sock, port)."""
    for _attempt in range(20):
        port = _ports.get()
        proc = subprocess.Popen(
            [server, "-l", "127.0.0.1", "-p", str(port)] + flags,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break                      # could not bind: try another port
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.connect(("127.0.0.1", port))
                return proc, s, port
            except OSError:
                s.close()
                time.sleep(0.01)
        stop_server(proc)
        _ports.put(port)
    raise RuntimeError("could not start %s" % server)


def stop_server(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def converse(sock, data):
    """Send data at once, collect replies until quiet or closed.

    Returns (reply_bytes, closed) where closed tells whether the server
    closed (or reset) the connection within the window."""
    out = bytearray()
    closed = False
    try:
        sock.sendall(data)
    except OSError:
        pass                               # server may already have closed
    sock.settimeout(QUIET)
    start = time.monotonic()
    while time.monotonic() - start < MAX_TOTAL:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed = True                  # reset by peer
            break
        if not chunk:
            closed = True
            break
        out += chunk
    return bytes(out), closed


def record_one(server, case_dir):
    with open(os.path.join(case_dir, "input"), "rb") as f:
        data = f.read()
    flags = read_flags(case_dir)
    proc, sock, port = start_server(server, flags)
    try:
        reply, closed = converse(sock, data)
    finally:
        sock.close()
        stop_server(proc)
        _ports.put(port)
    return reply, closed


def list_cases(names):
    if names:
        dirs = [os.path.join(CASES, n.rstrip("/").split("/")[-1]) for n in names]
    else:
        dirs = [os.path.join(CASES, d) for d in sorted(os.listdir(CASES))]
    return [d for d in dirs if os.path.isfile(os.path.join(d, "input"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="re-record in memory and compare with stored expected")
    ap.add_argument("--jobs", type=int, default=16,
                    help="servers run in parallel (default 16)")
    ap.add_argument("--server", default="/usr/bin/beanstalkd")
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    args = ap.parse_args()

    dirs = list_cases(args.cases)
    if not dirs:
        print("no cases found", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    bad = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        futs = {ex.submit(record_one, args.server, d): d for d in dirs}
        for fut in concurrent.futures.as_completed(futs):
            d = futs[fut]
            name = os.path.basename(d)
            reply, closed = fut.result()
            exp_path = os.path.join(d, "expected")
            closed_path = os.path.join(d, "closed")
            if args.check:
                try:
                    with open(exp_path, "rb") as f:
                        stored = f.read()
                except FileNotFoundError:
                    stored = None
                stored_closed = os.path.exists(closed_path)
                if stored != reply or stored_closed != closed:
                    bad.append(name)
                    print("DIFF %s\n  stored:   %r closed=%s\n"
                          "  recorded: %r closed=%s"
                          % (name, stored, stored_closed, reply, closed))
            else:
                with open(exp_path, "wb") as f:
                    f.write(reply)
                if closed:
                    with open(closed_path, "wb"):
                        pass
                elif os.path.exists(closed_path):
                    os.remove(closed_path)
    dt = time.monotonic() - t0
    if args.check:
        print("checked %d cases in %.1fs: %d differ"
              % (len(dirs), dt, len(bad)))
        return 1 if bad else 0
    print("recorded %d cases in %.1fs" % (len(dirs), dt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
