#!/usr/bin/env python3
"""Cross-site state changes against the HTTP gateway, in headless Chromium
(docs/security.md, "Cross-site requests"). A page of another site can send
forms and no-cors fetches (GET and POST, text/plain bodies) to the gateway
without any CORS permission: without tokens they put, kick, pause and
reserve. The gateway refuses a state-changing request that Chromium marks
as cross-site (Sec-Fetch-Site, Origin) unless --http-cors-origins lists the
page's origin; the state is unchanged. Reads cannot be read by the page
(CORS), and the listed origin and the dashboard itself keep working.

Usage: test_cross_site.py BINARY; exits 77 (skipped) without Chromium.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browserlib import Server, run  # noqa: E402
from testlib import check, check_eq  # noqa: E402

PAGE = "<!doctype html><title>a blog</title><p>nothing to see"


def attacks(base, tube, jid):
    """(what, url, fetch options) of each state change a page tries."""
    text = {"method": "POST", "mode": "no-cors", "body": "x"}
    return [("put", "%s/tubes/%s/jobs" % (base, tube), text),
            ("kick", "%s/tubes/%s/kick?bound=10" % (base, tube), text),
            ("pause", "%s/tubes/%s/pause?delay=4294967295" % (base, tube), text),
            ("reserve", "%s/tubes/%s/reservations" % (base, tube), text),
            ("bury", "%s/jobs/%d/bury" % (base, jid), text)]


def test_cross_site_page_changes_nothing(browser, attacker):
    srv = Server().start()
    try:
        tube = "xsite"
        jid = srv.put(tube, b"job")
        base = "http://127.0.0.1:%d" % srv.http_port
        browser.open(attacker.page("/", PAGE))
        for what, url, opts in attacks(base, tube, jid):
            browser.fetch(url, opts)
            browser.submit_form(url, "field")
        st = srv.tube(tube)
        check_eq((st["total_jobs"], st["current_jobs_ready"], st["current_jobs_reserved"], st["pause"]),
                 (1, 1, 0, 0), "the tube after the page's no-cors fetches and forms (total, ready, reserved, pause)")
        # the page cannot read the answers (opaque); the gateway's counters tell
        status, _, body = srv.get("/metrics")
        check(b'status="403"' in body, "no 403 in /metrics after the page: %s" % body[-600:])
    finally:
        srv.stop()


def test_listed_origin_and_dashboard_still_work(browser, attacker):
    """With the attacker's origin in --http-cors-origins the same fetches
    work (the test can see a success), and the dashboard's own requests
    (same origin) work without it."""
    srv = Server(["--http-cors-origins", attacker.origin]).start()
    try:
        base = "http://127.0.0.1:%d" % srv.http_port
        browser.open(attacker.page("/ok", PAGE))
        got = browser.fetch(base + "/tubes/listed/jobs", {"method": "POST", "body": "from a listed page"})
        check_eq(got.get("status"), 201, "a put from a listed origin: %r" % got)
    finally:
        srv.stop()
    srv = Server().start()
    try:
        base = "http://127.0.0.1:%d" % srv.http_port
        browser.open(base + "/ui/")
        for what, url, opts in attacks(base, "own", srv.put("own", b"job")):
            got = browser.fetch(url, {"method": "POST", "body": "x"})
            # served (a bury of a ready job is a 409 of the queue, not a refusal)
            check(got.get("status") in (200, 201, 204, 409) and "ORIGIN_NOT_ALLOWED" not in got.get("body", ""),
                  "%s from the gateway's own page: %r" % (what, got))
    finally:
        srv.stop()


TESTS = [test_cross_site_page_changes_nothing, test_listed_origin_and_dashboard_still_work]

if __name__ == "__main__":
    sys.exit(run("cross_site", __doc__, TESTS, sys.argv, globals()))
