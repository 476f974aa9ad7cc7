"""A TCP proxy on loopback that injects network faults between a client and
one server: answers delayed, or the link cut. Python 3 standard library
only; used by the replication tests (a beangate node reaches each NATS
server through one).

    p = FaultProxy(target_port)      # listens on 127.0.0.1:p.port
    p.delay(0.3)                     # what the server sends arrives 300 ms later
    p.cut()                          # nothing passes either way, new links too
    p.heal()                         # links made from now on pass again
    p.close()

A cut is a partition, not a reset: established connections stay open and
carry nothing (the client notices only by its own timeouts, as when a
network drops packets), and a connection made during the cut is accepted
and carries nothing. heal() closes what the cut held, so the client
connects again through a proxy that passes. Order is kept: a byte never
overtakes one sent before it, so a delay that ends lets the queued answers
arrive in order, then the rest at once.
"""

import collections
import socket
import threading
import time

CHUNK = 65536


class _Pipe:
    """One direction of one connection: bytes read from src are written to
    dst, each chunk no earlier than its due time (read time + the delay then
    in force), in order; nothing while the proxy is cut."""

    def __init__(self, proxy, src, dst, delayed):
        self.proxy, self.src, self.dst, self.delayed = proxy, src, dst, delayed
        self.queue = collections.deque()
        self.cond = threading.Condition()
        self.done = False
        threading.Thread(target=self.read, daemon=True).start()
        threading.Thread(target=self.write, daemon=True).start()

    def read(self):
        last_due = 0.0
        try:
            while True:
                data = self.src.recv(CHUNK)
                if not data:
                    break
                if self.proxy.is_cut():
                    continue  # dropped, as a partitioned network drops it
                due = time.monotonic() + (self.proxy.delay_s if self.delayed else 0.0)
                last_due = due = max(due, last_due)
                with self.cond:
                    self.queue.append((due, data))
                    self.cond.notify()
        except OSError:
            pass
        with self.cond:
            self.done = True
            self.cond.notify()

    def write(self):
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.done:
                        self.cond.wait()
                    if not self.queue:
                        break
                    due, data = self.queue.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # the injected delay itself
                if not self.proxy.is_cut():
                    self.dst.sendall(data)
        except OSError:
            pass
        for s in (self.src, self.dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FaultProxy:
    """Listens on a free loopback port and forwards each connection to
    127.0.0.1:target. delay_s applies to what the server sends (answers);
    requests pass at once."""

    def __init__(self, target):
        self.target = target
        self.delay_s = 0.0
        self._cut = False
        self._lock = threading.Lock()
        self._held = []   # (client, upstream) sockets of every connection
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def is_cut(self):
        return self._cut

    def delay(self, seconds):
        """From now on, what the server sends is held `seconds` (0: none)."""
        self.delay_s = float(seconds)

    def cut(self):
        """Nothing passes, either way, on any connection, until heal()."""
        self._cut = True

    def heal(self):
        """Close every connection (those the cut held carry nothing any more)
        and let new ones pass."""
        with self._lock:
            held, self._held = self._held, []
        self._cut = False
        for pair in held:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._held.append((client, upstream))
            _Pipe(self, client, upstream, delayed=False)
            _Pipe(self, upstream, client, delayed=True)

    def close(self):
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        self.heal()
