import socket, sys, time
# probe_ready.py PORT T0 - connect until a stats-tube command is answered;
# print the seconds since T0 (a time.time() value) and the ready-job count.
port = int(sys.argv[1]); t0 = float(sys.argv[2])
while True:
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(b"stats-tube rec\r\n"); data = b""
        while b"\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk: break
            data += chunk
        c.close()
        if data: break
    except OSError:
        time.sleep(0.002)
t1 = time.time()
ready = [l for l in data.decode().split("\n") if l.startswith("current-jobs-ready")]
print("%.3f s %s" % (t1 - t0, ready))
