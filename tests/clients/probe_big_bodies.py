"""Big-body probe: four concurrent 1.9 MB chat bodies to `transformer serve` on PORT (start it with --max-body-mib 4), timing GET /health meanwhile. Usage: python3 probe_big_bodies.py PORT."""
import json, threading, time, urllib.request, sys
port = int(sys.argv[1])
body = json.dumps({"messages": [{"role": "user", "content": "word " * 380000}], "max_tokens": 4}).encode()
print(f"body {len(body)/1e6:.2f} MB")
res = []
def big():
    t = time.time()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=120).read()
    except urllib.error.HTTPError as e:
        res.append((e.code, time.time() - t))
ths = [threading.Thread(target=big) for _ in range(4)]
for th in ths: th.start()
worst = 0; n = 0
while any(th.is_alive() for th in ths):
    t = time.time()
    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60).read()
    worst = max(worst, time.time() - t); n += 1
    time.sleep(0.02)
print(f"4 big bodies: {res}; /health {n} times meanwhile, slowest {worst*1000:.1f} ms")
