#!/usr/bin/env python3
"""What the dashboard costs: the page's weight, and what one open page
costs the server (requests/s, bytes/s each way, CPU) in each view, the
server's time for a page of GET /stats/tubes, and the server's memory while
a page polls fast for minutes. Not a test: it prints the figures of
docs/performance.md section 10.

Usage:
  python3 tests/ui/measure_cost.py build/beangate [--tubes 10000] [--seconds 60] [--rss-seconds 180]
                                   [--big 1000000] [--views tubes,jobs]

Starts beangate on free ports with --tubes tubes (one ready job each, plus a
few jobs in the tube and job views, 1,000 ready jobs in the tube whose jobs
are browsed, and 20 beanstalk clients for the Clients view), opens each view in headless Chromium
through a counting TCP proxy for --seconds at the default poll interval
(1 s), and counts what crossed the proxy; then opens the tubes view polled
every 100 ms for --rss-seconds and samples the server's RSS. With --big N,
last: a tube of N buried jobs (bench/browse's filler) in the page: the time
to its first page of buried jobs, in the browser and on the server, then
"Delete all buried" through the page with bench/browse's probe (beanstalk
puts one at a time) measuring how long other clients wait meanwhile.
"""

import argparse
import gzip
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import test_ui  # noqa: E402  (the suite's server, browser and selenium loading)


class CountingProxy:
    """127.0.0.1:port -> upstream; counts bytes each way and requests (a
    request line per GET/POST/DELETE at the start of a client chunk)."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.lock = threading.Lock()
        self.up = self.down = self.requests = 0
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def reset(self):
        with self.lock:
            self.up = self.down = self.requests = 0

    def read(self):
        with self.lock:
            return self.up, self.down, self.requests

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self.pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, False), daemon=True).start()

    def pipe(self, src, dst, upward):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self.lock:
                    if upward:
                        self.up += len(data)
                        self.requests += sum(data.count(m) for m in (b"GET /", b"POST /", b"DELETE /"))
                    else:
                        self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def route_seconds(server, route):
    """(count, sum of seconds) of beangate_http_request_duration_seconds for route."""
    _, data = server.request("GET", "/metrics")
    count = total = 0.0
    for line in data.decode().splitlines():
        if line.startswith('beangate_http_request_duration_seconds_count{route="%s"}' % route):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith('beangate_http_request_duration_seconds_sum{route="%s"}' % route):
            total = float(line.rsplit(" ", 1)[1])
    return count, total


def page_costs(server, n=200):
    """The server's own time (its request-duration histogram) and the bytes
    of one page of GET /stats/tubes, for a few kinds of page."""
    import http.client
    print("## GET /stats/tubes, server time per request (mean of %d, keep-alive)\n" % n)
    print("| query | server time | bytes |\n|---|---:|---:|")
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port)
    for query in ("limit=100", "limit=100&sort=name", "limit=100&sort=current_jobs_ready&order=desc",
                  "limit=100&filter=tube-00", "limit=100&sort=name&offset=4950", "limit=100&sort=name&offset=9900",
                  "limit=500&sort=name"):
        c0, s0 = route_seconds(server, "/stats/tubes")
        size = 0
        for _ in range(n):
            conn.request("GET", "/stats/tubes?" + query)
            size = len(conn.getresponse().read())
        c1, s1 = route_seconds(server, "/stats/tubes")
        print("| `%s` | %.3f ms | %d |" % (query, (s1 - s0) / (c1 - c0) * 1000, size))
    conn.close()
    print()


def page_weight():
    folder = os.path.join(REPO, "ui")
    rows, total, total_gz = [], 0, 0
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        gz = len(gzip.compress(data, 9))
        rows.append((name, len(data), gz))
        total += len(data)
        total_gz += gz
    return rows, total, total_gz


class ProxiedServer:
    """The suite's Server, seen through the proxy (the browser's address)."""

    def __init__(self, server, proxy):
        self.server, self.proxy = server, proxy

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.proxy.port


def memory(server, browser, seconds):
    """The server's RSS every 10 s while the tubes view polls every 100 ms."""
    print("## server memory, tubes view polled every 100 ms for %.0f s\n" % seconds)
    browser.open(server, "/tubes", poll=100)
    browser.heading("Tubes")
    samples = []
    t0 = time.monotonic()
    n0 = server.requests_served()
    while time.monotonic() - t0 < seconds:
        samples.append((time.monotonic() - t0, server.rss_kib(), server.requests_served() - n0))
        time.sleep(10)   # a sample every 10 s
    samples.append((time.monotonic() - t0, server.rss_kib(), server.requests_served() - n0))
    print("| seconds | requests | RSS KiB |\n|---:|---:|---:|")
    for t, rss, n in samples:
        print("| %.0f | %d | %d |" % (t, n, rss))


def load_bench_browse():
    """bench/browse as a module: its filler and its probe."""
    import importlib.machinery
    import importlib.util
    path = os.path.join(REPO, "bench", "browse")
    loader = importlib.machinery.SourceFileLoader("bench_browse", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_browse", loader))
    loader.exec_module(module)
    return module


def big_tube(server, browser, n):
    """A tube of n buried jobs in the page: its first page, then Delete all
    buried with a beanstalk client putting one job at a time meanwhile."""
    import subprocess
    bench = load_bench_browse()
    print("\n## a tube of %d buried jobs in the page\n" % n)
    print("(filled in %.1f s over beanstalk)\n" % bench.fill(server.tcp_port, n))
    route = "/tubes/{tube}/jobs"
    browser.open(server, "/overview")
    browser.heading("Overview")
    c0, s0 = route_seconds(server, route)
    t0 = time.monotonic()
    browser.open(server, "/tubes/%s/jobs?state=buried" % bench.TUBE)
    browser.wait(lambda: len(browser.all("table.jobs tbody tr[data-id]")) == 50, "the first page", timeout=60)
    shown = time.monotonic() - t0
    c1, s1 = route_seconds(server, route)
    print("first page of 50 buried jobs: %.0f ms from the page's load to the rows shown in the browser; "
          "the server's time per GET %s: %.2f ms (mean of %d)" % (shown * 1000, route, (s1 - s0) / max(1, c1 - c0) * 1000,
                                                                  c1 - c0))
    probe = subprocess.Popen([sys.executable, "-c", bench.PROBE, str(server.tcp_port), "3600"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(1)   # the probe's reference second, nothing else going on
    started = time.perf_counter()
    browser.css('.bulk button[data-bulk="delete"]').click()
    browser.wait(lambda: browser.css("#confirm-dialog").get_attribute("open") is not None, "the confirmation")
    question = browser.css("#confirm-msg").text
    browser.button("Delete %s jobs" % format(n, ","), "#confirm-dialog").click()
    clicked = time.perf_counter()
    browser.wait(lambda: "Deleted" in browser.notice(), "the bulk delete's answer", timeout=600)
    done = time.perf_counter()
    probe.stdin.close()
    times = [tuple(map(float, x.split(":"))) for x in probe.stdout.read().split()]
    probe.wait()
    during = sorted(ms for t, ms in times if clicked <= t <= done)
    before = sorted(ms for t, ms in times if t < started)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    print("asked: %r" % question)
    print("answered: %r, %.2f s after the click" % (browser.notice(), done - clicked))
    print("a beanstalk client's put round trips: during the delete median %.3f ms, 99th %.3f ms, worst %.3f ms (%d puts); "
          "the second before it median %.3f ms, worst %.3f ms" % (pct(during, 0.5), pct(during, 0.99), during[-1] if during else 0,
                                                                  len(during), pct(before, 0.5), before[-1] if before else 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--tubes", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rss-seconds", type=float, default=180)
    ap.add_argument("--views", default="", help="only these views, comma-separated: overview,tubes,tube,job,jobs,clients")
    ap.add_argument("--big", type=int, default=0, help="buried jobs in one tube for the last stage (0: none)")
    args = ap.parse_args()
    sel, why = test_ui.load_selenium()
    paths, why2 = test_ui.find_browser()
    if not sel or not paths:
        sys.exit("cannot measure: %s" % (why or why2))

    rows, total, total_gz = page_weight()
    print("## page weight\n\n| file | bytes | gzip -9 |\n|---|---:|---:|")
    for name, n, gz in rows:
        print("| %s | %d | %d |" % (name, n, gz))
    print("| **all** | **%d** | **%d** |\n" % (total, total_gz))

    server = test_ui.Server(os.path.abspath(args.binary)).start()
    browser = test_ui.Browser(sel, *paths)
    try:
        t0 = time.monotonic()
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port)
        for i in range(args.tubes):
            conn.request("POST", "/tubes/tube-%05d/jobs" % i, body=b"x")
            conn.getresponse().read()
        conn.close()
        jid = server.put("emails", b'{"to": "a@example.com", "template": "welcome"}')
        server.put("emails", b"later", delay=3600)
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port)
        for i in range(1000):
            conn.request("POST", "/tubes/backlog/jobs", body=b'{"n": %d}' % i)
            conn.getresponse().read()
        conn.close()
        clients = [test_ui.Beanstalk(server.tcp_port) for _ in range(20)]
        for i, c in enumerate(clients):
            c.cmd("use tube-%05d\r\nwatch emails\r\n" % i)
            c.line()   # the second answer
        print("(%d tubes made in %.1f s)\n" % (args.tubes, time.monotonic() - t0))
        _, history = server.request("GET", "/stats/history")
        print("GET /stats/history (asked once when the overview opens): %d bytes\n" % len(history))
        proxy = CountingProxy(server.http_port)
        via = ProxiedServer(server, proxy)

        # the first load and a reload, as the browser fetches them
        proxy.reset()
        browser.open(via, "/overview")
        browser.heading("Overview")
        browser.wait(lambda: "Connecting" not in browser.css("#live").text, "the first poll")
        first = proxy.read()
        proxy.reset()
        browser.d.refresh()
        browser.heading("Overview")
        browser.wait(lambda: "Connecting" not in browser.css("#live").text, "the first poll")
        again = proxy.read()
        print("first load (page + first poll): %d requests, %d bytes down, %d up" % (first[2], first[1], first[0]))
        print("reload (304s + first poll): %d requests, %d bytes down, %d up\n" % (again[2], again[1], again[0]))

        print("## one open page, polling every 1 s, for %.0f s per view\n" % args.seconds)
        print("| view | requests/s | bytes/s down | bytes/s up | server CPU |")
        print("|---|---:|---:|---:|---:|")
        views = (("overview", "overview", "/overview", "Overview"), ("tubes", "tubes (100 rows)", "/tubes", "Tubes"),
                 ("tube", "tube", "/tubes/emails", "Tube emails"), ("job", "job", "/jobs/%d" % jid, "Job %d" % jid),
                 ("jobs", "a tube's jobs (50 rows)", "/tubes/backlog/jobs?state=ready", "Jobs of tube backlog"),
                 ("clients", "clients (20 rows)", "/clients", "Clients"))
        wanted = set(filter(None, args.views.split(",")))
        for key, name, path, heading in views:
            if wanted and key not in wanted:
                continue
            browser.open(via, path)
            browser.heading(heading)
            browser.wait(lambda: "Connecting" not in browser.css("#live").text, "the first poll")
            proxy.reset()
            cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
            time.sleep(args.seconds)   # measuring a duration: the page polls on its own meanwhile
            up, down, n = proxy.read()
            dt = time.monotonic() - t0
            cpu = cpu_seconds(server.proc.pid) - cpu0
            print("| %s | %.2f | %.0f | %.0f | %.2f %% |" % (name, n / dt, down / dt, up / dt, 100 * cpu / dt))

        print()
        page_costs(server)
        if args.rss_seconds > 0:
            memory(server, browser, args.rss_seconds)
        if args.big:
            big_tube(server, browser, args.big)
    finally:
        browser.quit()
        server.stop()


if __name__ == "__main__":
    main()
