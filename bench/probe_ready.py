import socket, sys, time
# probe_ready.py PORT T0 [TUBE [JOBS]] - connect until a stats-tube TUBE
# (default rec) command is answered, and until it counts JOBS ready jobs if
# JOBS is given; print the seconds since T0 (a time.time() value) and the
# ready-job count.
port = int(sys.argv[1]); t0 = float(sys.argv[2])
tube = sys.argv[3] if len(sys.argv) > 3 else "rec"
want = int(sys.argv[4]) if len(sys.argv) > 4 else None
def ready_count(data):
    return [l for l in data.decode().split("\n") if l.startswith("current-jobs-ready")]
while True:
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=600)
        c.sendall(b"stats-tube %s\r\n" % tube.encode()); data = b""
        while b"\n\r\n" not in data and not data.startswith(b"NOT_FOUND"):
            chunk = c.recv(65536)
            if not chunk: break
            data += chunk
        c.close()
        if data and (want is None or ready_count(data) == ["current-jobs-ready: %d" % want]): break
    except OSError:
        pass
    time.sleep(0.002)
t1 = time.time()
print("%.3f s %s" % (t1 - t0, ready_count(data)))
