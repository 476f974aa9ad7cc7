#!/usr/bin/env python3
"""The dashboard's pictures in the documentation (docs/images/dashboard-*.png):
a server with a little traffic (puts, reserves, deletes over TCP and HTTP
for a minute, buried and delayed jobs, a paused tube, a worker holding a
job and one waiting, two push subscriptions: one to a service that answers
204, one to a service that fails now and then), shot in headless Chromium. Not a test; run it again
when the page changes:

  python3 tests/ui/doc_images.py build/beangate [docs/images]
"""

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import test_ui  # noqa: E402

TUBES = ["emails", "sms", "thumbnails", "webhooks", "reports", "billing/invoices", "search-index", "push"]


def traffic(server, stop):
    """Puts into every tube, workers that reserve and delete most of them."""
    rnd = random.Random(1)
    bs = test_ui.Beanstalk(server.tcp_port)
    bs.cmd("watch emails\r\n")
    n = 0
    while not stop.is_set():
        n += 1
        tube = rnd.choice(TUBES)
        body = json.dumps({"id": n, "to": "user%d@example.com" % n, "kind": tube}).encode()
        if n % 2:
            bs.put(tube, body)
        else:
            server.put(tube, body)
        if n % 3:
            bs.cmd("watch %s\r\n" % tube)
            reply = bs.cmd("reserve-with-timeout 0\r\n")
            if reply.startswith(b"RESERVED"):
                bs.line()
                bs.cmd("delete %s\r\n" % reply.split()[1].decode())
        if n % 5 == 0:
            status, data = server.request("POST", "/tubes/%s/reservations" % test_ui.quote(tube))
            if status == 200:
                job = json.loads(data)
                server.request("DELETE", "/jobs/%d?reservation=%s" % (job["id"], job["reservation"]))
        stop.wait(0.02 + 0.1 * (1 + (n // 200) % 3) * rnd.random())   # an uneven rate
    bs.close()


def service_answer(rx, path, n):
    """The push subscribers: /ok answers 204 after a little work, /flaky 503
    to one request in three and 204 to the others."""
    time.sleep(0.05 + 0.2 * random.random())   # the work
    return 503 if path == "/flaky" and n % 3 == 0 else 204


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: %s PATH/TO/beangate [OUTDIR]" % sys.argv[0])
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(REPO, "docs", "images")
    sel, why = test_ui.load_selenium()
    paths, why2 = test_ui.find_browser()
    if not sel or not paths:
        sys.exit("cannot shoot: %s" % (why or why2))
    os.makedirs(out, exist_ok=True)
    logdir = tempfile.mkdtemp(prefix="beangate-doc-images-")
    service = test_ui.Receiver(service_answer)
    server = test_ui.Server(os.path.abspath(sys.argv[1]), [
        "-b", logdir, "-f", "200",
        "--push", "tube=push url=%s concurrency=4" % service.url("/ok"),
        "--push", "tube=search-index url=%s concurrency=2 rate=5/s attempts=5 backoff=20..300" % service.url("/flaky"),
    ]).start()
    b = test_ui.Browser(sel, *paths)
    stop = threading.Event()
    worker = threading.Thread(target=traffic, args=(server, stop))
    clients = []   # beanstalk connections to close at the end
    try:
        bs = test_ui.Beanstalk(server.tcp_port)
        buried = []
        for i in range(12):
            bs.put("webhooks", json.dumps({"url": "https://example.com/hook/%d" % i, "attempt": 3,
                                           "event": "invoice.paid", "last_error": "503 from the receiver"}).encode())
            buried.append(bs.reserve_and_bury("webhooks"))
        bs.close()
        # a worker that holds a job of sms, and one waiting for video
        holder, waiter = test_ui.Beanstalk(server.tcp_port), test_ui.Beanstalk(server.tcp_port)
        clients += [holder, waiter]
        sms = json.dumps({"to": "+15550100", "text": "Your code is 4711"}).encode()
        holder.cmd("use sms\r\n")
        holder.cmd(b"put 0 0 3600 %d\r\n%s\r\n" % (len(sms), sms))   # a TTR that outlasts the shots
        holder.cmd("watch sms\r\n")
        if holder.cmd("reserve-with-timeout 0\r\n").startswith(b"RESERVED"):
            holder.line()   # the body
        waiter.cmd("watch video\r\n")
        waiter.s.sendall(b"reserve-with-timeout 600\r\n")
        sample = buried[0]   # the job view shows a buried job: no worker takes it meanwhile
        server.put("emails", b"weekly digest for ada@example.com", delay=3600)
        server.put("reports", b"monthly report", delay=7200)   # the tube must exist to be paused
        server.api("POST", "/tubes/reports/pause?delay=900")
        worker.start()
        b.d.set_window_size(1280, 900)
        b.open(server, "/overview")
        b.heading("Overview")
        time.sleep(75)   # a minute and more of the server's history for the charts
        shots = [("overview", "/overview", "Overview", 1280), ("overview-phone", "/overview", "Overview", 390),
                 ("tubes", "/tubes", "Tubes", 1280), ("tube", "/tubes/emails", "Tube emails", 1280),
                 ("job", "/jobs/%d" % sample, "Job %d" % sample, 1280),
                 ("tube-jobs", "/tubes/webhooks/jobs?state=buried", "Jobs of tube webhooks", 1280),
                 ("tube-jobs-phone", "/tubes/webhooks/jobs?state=buried", "Jobs of tube webhooks", 390),
                 ("clients", "/clients", "Clients", 1280),
                 ("subscriptions", "/subscriptions", "Subscriptions", 1280)]
        # a job of the flaky service waiting for its retry shows its last delivery error
        subs = {x["tube"]: x for x in server.api("GET", "/subscriptions")["subscriptions"]}
        failed = (subs["search-index"]["last_error"] or {}).get("job_id")
        if failed and server.request("GET", "/jobs/%d" % failed)[0] == 200:
            shots.append(("job-delivery-error", "/jobs/%d" % failed, "Job %d" % failed, 1280))
        for name, path, heading, width in shots:
            b.d.set_window_size(width, 900)
            if path != "/overview":
                b.open(server, path)
            b.heading(heading)
            b.wait(lambda: "…" not in b.css("main").text, "%s filled in" % name)
            if name == "tube-jobs":   # the first job's body open under its row
                b.button("Body", "table.jobs tbody tr[data-id]").click()
                b.wait(lambda: b.css("tr.body-row pre.body").text, "the body shown")
            file = os.path.join(out, "dashboard-%s.png" % name)
            b.screenshot(file, width)
            print(file, os.path.getsize(file))
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
        b.quit()
        for c in clients:
            c.close()
        server.stop()
        service.close()
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
