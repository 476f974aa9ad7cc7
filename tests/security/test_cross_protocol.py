#!/usr/bin/env python3
"""Cross-protocol requests from a web page to the beanstalk and Gearman
ports, in headless Chromium (docs/security.md, "Cross-protocol requests").
A page of another site posts a text/plain form or a no-cors fetch whose
body is beanstalk commands to the beanstalk port: beanstalkd answers the
request's lines UNKNOWN_COMMAND and runs the body (a put, a delete).
beangate closes the connection at the request line: no job is made or
deleted, and the closing is counted (cross_protocol_closed).

Usage: test_cross_protocol.py BINARY; exits 77 (skipped) without Chromium.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browserlib import Server, run, wait_until  # noqa: E402
from testlib import check, check_eq  # noqa: E402


def closed_count(srv):
    return srv.json("/stats").get("cross_protocol_closed", 0)


def settled(srv, closed):
    """Until `closed` connections were closed as HTTP, or the page's
    commands ran (the tube `web` exists, a job was made or deleted)."""
    def done():
        st = srv.json("/stats")
        return (st.get("cross_protocol_closed", 0) >= closed or srv.tube("web") is not None
                or st["total_jobs"] != 1 or st["current_jobs_ready"] != 1)
    wait_until(done, "the page's request to be closed or run")


def check_nothing_ran(srv, jid, what):
    check_eq(srv.tube("web"), None, "%s: the tube the page's commands use" % what)
    stats = srv.json("/stats")
    check_eq((stats["total_jobs"], stats["current_jobs_ready"], stats["cmd_delete"]), (1, 1, 0),
             "%s: total jobs, ready jobs, deletes" % what)
    check(srv.beanstalk(b"stats-job %d\r\n" % jid).startswith(b"OK "), "%s: the job was deleted" % what)


def test_fetch_and_form_to_the_beanstalk_port(browser, attacker):
    srv = Server().start()
    try:
        jid = srv.put("victim", b"keep me")
        browser.open(attacker.page("/", "<!doctype html><title>cat pictures</title><p>cats"))
        target = "http://127.0.0.1:%d/" % srv.port
        body = "use web\r\nput 0 0 60 5\r\nhello\r\ndelete %d\r\n" % jid
        got = browser.fetch(target, {"method": "POST", "mode": "no-cors", "body": body})
        check("error" in got or got.get("status") == 0, "the no-cors fetch: %r" % got)
        settled(srv, 1)
        check_nothing_ran(srv, jid, "after the no-cors fetch")
        # a form: text/plain sends "NAME=VALUE\r\n"; the name carries the commands
        browser.submit_form(target, "use web\r\nput 0 0 60 5\r\nhello\r\ndelete %d\r\nx" % jid)
        settled(srv, 2)
        check_nothing_ran(srv, jid, "after the form")
        check_eq(closed_count(srv), 2, "connections closed as HTTP")
    finally:
        srv.stop()


def test_fetch_to_the_gearman_port(browser, attacker):
    """The same to the Gearman port: its admin lines (cancel job) would run."""
    srv = Server().start()
    try:
        jid = srv.put("gm", b"keep me")
        browser.open(attacker.page("/g", "<!doctype html><title>more cats</title><p>cats"))
        body = "cancel job H:x:%d\nshutdown\n" % jid
        browser.fetch("http://127.0.0.1:%d/" % srv.gearman_port, {"method": "POST", "mode": "no-cors", "body": body})
        wait_until(lambda: closed_count(srv) >= 1 or not srv.tube("gm"),
                   "the Gearman connection to be closed as HTTP, or the job cancelled")
        check_eq((srv.tube("gm") or {}).get("current_jobs_ready"), 1, "the job on the Gearman side")
    finally:
        srv.stop()


TESTS = [test_fetch_and_form_to_the_beanstalk_port, test_fetch_to_the_gearman_port]

if __name__ == "__main__":
    sys.exit(run("cross_protocol", __doc__, TESTS, sys.argv, globals()))
