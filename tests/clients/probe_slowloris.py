"""Slowloris probe: opens N half-open connections to `transformer serve` on PORT (a request head never finished), then times 20 GET /health. Usage: python3 probe_slowloris.py PORT N (N under the open-file limit)."""
import socket, sys, time, urllib.request
port = int(sys.argv[1]); n = int(sys.argv[2])
socks = []
t0 = time.time()
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
    socks.append(s)
print(f"{n} half-open connections in {time.time()-t0:.1f} s")
worst = 0
for i in range(20):
    t = time.time()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read()
    worst = max(worst, time.time() - t)
    assert body.strip() == b"ok"
print(f"/health 20/20 ok while they are open; slowest {worst*1000:.1f} ms")
