#!/usr/bin/env python3
"""One round of the long-prompt fairness test against a running `transformer serve`.

A long scoring request (`/v1/completions` with `echo` and `logprobs`, a prompt of LONG token
ids, `max_tokens` 1) is sent; DELAY seconds later a small streamed chat is sent. Printed, one
JSON line: the long request's total time, the chat's time to its first content token and its
total time (all in seconds, each measured from that request's own send), and the long
request's prompt length and first echoed log-probabilities (a check that it was scored).

    python3 benches/compare/prefill_fair.py --port 8080 [--long 3000] [--delay 1.0]
"""

import argparse
import json
import threading
import time
import urllib.request


def post(port, path, body, stream=False):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return urllib.request.urlopen(req, timeout=600)


def long_request(port, n, out):
    # Deterministic ids spread over SmolLM2's vocabulary (49,152), never a special token.
    prompt = [100 + (i * 7919) % 49000 for i in range(n)]
    start = time.perf_counter()
    with post(port, "/v1/completions", {
        "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0,
    }) as r:
        answer = json.load(r)
    out["long_s"] = time.perf_counter() - start
    lp = answer["choices"][0]["logprobs"]
    out["long_scored"] = len(lp["token_logprobs"])
    out["long_first_logprobs"] = lp["token_logprobs"][1:4]
    out["long_prompt_tokens"] = answer["usage"]["prompt_tokens"]


def small_chat(port, out):
    start = time.perf_counter()
    with post(port, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0, "stream": True,
    }) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if delta.get("content") and "chat_ttft_s" not in out:
                out["chat_ttft_s"] = time.perf_counter() - start
    out["chat_s"] = time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--long", type=int, default=3000, help="the scoring prompt's tokens")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds before the chat")
    a = ap.parse_args()
    out = {}
    t = threading.Thread(target=long_request, args=(a.port, a.long, out))
    t.start()
    time.sleep(a.delay)
    small_chat(a.port, out)
    t.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
