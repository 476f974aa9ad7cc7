"""Small helpers shared by the Python test suites under tests/.

Python 3 standard library only. A suite finds this module with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from testlib import ...
so every suite stays runnable on its own (`python3 tests/X/Y.py build/beangate`).
Only helpers whose behaviour is the same in every suite live here; where
suites differ (the exception raised, how two byte strings are described) the
difference is a parameter, given explicitly by the suite.
"""

import os
import socket
import subprocess
import sys
import time

# Substrings of stderr that mean an ASan/UBSan/LSan report (suites may add more, e.g. TSan).
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error", "LeakSanitizer")


# A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, close).
def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


# Raise exc(msg) unless cond is true (exc: AssertionError, or a suite's own failure class).
def check(cond, msg, exc=AssertionError):
    if not cond:
        raise exc(msg)


# Raise exc("what: got %r, want %r") if got != want; for two byte strings bytes_diff(got, want, what) words it.
def check_eq(got, want, what, exc=AssertionError, bytes_diff=None):
    if got != want:
        if (bytes_diff is not None and isinstance(got, (bytes, bytearray))
                and isinstance(want, (bytes, bytearray))):
            raise exc(bytes_diff(got, want, what))
        raise exc("%s: got %r, want %r" % (what, got, want))


# Poll fn() every `step` seconds until it returns a true value, which is
# returned; raise exc("timed out waiting for WHAT (last: ...)") after timeout.
def wait_until(fn, what, timeout=5.0, exc=AssertionError, step=0.05):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(step)
    raise exc("timed out after %.1f s waiting for %s (last: %r)" % (timeout, what, last))


# Index of the first byte where got and want differ (the shorter length if one is a prefix of the other).
def first_difference(got, want):
    n = min(len(got), len(want))
    return next((k for k in range(n) if got[k] != want[k]), n)


# repr of bytes (or "None"); past limit bytes: the first limit bytes, the total length and the last 40.
def show(data, limit):
    if data is None:
        return "None"
    data = bytes(data)
    if len(data) <= limit:
        return repr(data)
    return "%r...(%d bytes in all, last: %r)" % (data[:limit], len(data), data[-40:])


# Send sig to proc if it still runs, wait up to timeout: its exit status, or None if it hung (then SIGKILLed).
def signal_and_wait(proc, sig, timeout):
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return None


# main()'s check of `prog PATH/TO/beangate`: the absolute path, or None after a message on stderr.
def binary_arg(argv):
    if len(argv) != 2:
        print("usage: %s PATH/TO/beangate" % argv[0], file=sys.stderr)
        return None
    binary = os.path.abspath(argv[1])
    if not os.access(binary, os.X_OK):
        print("not an executable: %s" % binary, file=sys.stderr)
        return None
    return binary


# The output (stdout and stderr) of `binary -h`, b"" if it takes over 10 s: which flags it has.
def binary_usage(binary):
    try:
        return subprocess.run([binary, "-h"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=10).stdout
    except subprocess.TimeoutExpired:
        return b""


# Run binary args to its end: (status, stdout, stderr) as text; AssertionError on a timeout or a sanitizer report.
def run_binary(binary, args, timeout, env=None, err_limit=1500):
    try:
        p = subprocess.run([binary] + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("%r did not exit within %d s (killed)" % (args, timeout)) from None
    err = p.stderr.decode("utf-8", "replace")
    bad = [m for m in SANITIZER_MARKERS if m in err]
    check(not bad, "%r: sanitizer report on stderr: %s" % (args, err[:err_limit]))
    return p.returncode, p.stdout.decode("utf-8", "replace"), err
