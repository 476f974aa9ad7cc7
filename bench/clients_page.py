#!/usr/bin/env python3
"""The cost of a page of GET /clients with N beanstalk connections open
(issue 26, docs/performance.md "Who is connected"): medians of 15 requests
for the first page, a page deep into the list (a cursor near the end), a
page of 500, and a protocol filter that matches none.

Usage: python3 bench/clients_page.py build/beangate [N ...]   (default 1000 10000)
"""
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "http"))
import test_ops  # noqa: E402  (its Server)
import testlib  # noqa: E402


def median_ms(srv, query, runs=15):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        status, _, _ = srv.get("/clients" + query)
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise SystemExit("GET /clients%s: %d" % (query, status))
    return statistics.median(times) * 1000


def measure(n):
    with test_ops.Server() as srv:
        conns = [socket.create_connection(("127.0.0.1", srv.tcp_port)) for _ in range(n)]
        try:
            count = lambda: json.loads(srv.get("/clients?limit=1")[2])["count"]  # noqa: E731
            testlib.wait_until(lambda: count() >= n, "%d clients listed" % n, 60)
            first = json.loads(srv.get("/clients?limit=1")[2])["clients"][0]["id"]
            print("N=%5d  first page of 100: %.2f ms  deep page of 100: %.2f ms  page of 500: %.2f ms  "
                  "filter with no match: %.2f ms" % (
                      n, median_ms(srv, "?limit=100"), median_ms(srv, "?limit=100&cursor=%d" % (first + n - 150)),
                      median_ms(srv, "?limit=500"), median_ms(srv, "?protocol=gearman")))
        finally:
            for c in conns:
                c.close()


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    test_ops.BINARY = argv[1]
    for n in [int(x) for x in argv[2:]] or [1000, 10000]:
        measure(n)


if __name__ == "__main__":
    main(sys.argv)
