#!/usr/bin/env python3
"""Prefix caching and fair admission against a running `transformer serve` (stdlib only).

chat  ADDR: a 10-turn chat, each turn re-sending the whole history plus a new user message (as a
      chat client does), streamed, temperature 0; per turn: prompt tokens, cached tokens
      (usage.prompt_tokens_details), time to first token (first content chunk).
mixed ADDR: a mixed-size load: SMALL_CLIENTS clients each sending SMALL_REQUESTS short requests
      one after another, while one client sends LARGE_REQUESTS long prompts (the first after
      a short delay); per class: latency p50 / p99 / max and the wall time.

Usage: prefix_chat.py chat 127.0.0.1:8080 [TURNS] [MAX_TOKENS]
       prefix_chat.py mixed 127.0.0.1:8080 [SMALL_CLIENTS] [SMALL_REQUESTS] [LARGE_REQUESTS]
"""

import http.client
import json
import statistics
import sys
import threading
import time

TOPICS = [
    "the moon", "bread", "rivers", "chess", "bees", "glass", "winter", "maps", "tea", "bridges",
    "owls", "clocks", "salt", "kites", "copper",
]


def post(addr, path, body, stream=False):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def chat_turn(addr, messages, max_tokens):
    """(reply text, time to first content, usage) of one streamed chat turn."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    conn, resp = post(addr, "/v1/chat/completions", body, stream=True)
    assert resp.status == 200, resp.read()
    text, first, usage = "", None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter() - start
                text += piece
    conn.close()
    return text, first, usage


def chat(addr, turns=10, max_tokens=32):
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    print("| turn | prompt tokens | cached tokens | TTFT (ms) |")
    print("|---:|---:|---:|---:|")
    rows = []
    for t in range(turns):
        messages.append({"role": "user",
                         "content": f"Tell me one short fact about {TOPICS[t % len(TOPICS)]}."})
        text, ttft, usage = chat_turn(addr, messages, max_tokens)
        messages.append({"role": "assistant", "content": text})
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        rows.append((usage["prompt_tokens"], cached, ttft))
        print(f"| {t + 1} | {usage['prompt_tokens']} | {cached} | {ttft * 1e3:.0f} |", flush=True)
    prompt = sum(r[0] for r in rows)
    cached = sum(r[1] for r in rows)
    print(f"\nturn {turns} / turn 1 TTFT: {rows[-1][2] / rows[0][2]:.2f}; "
          f"prompt tokens from the cache: {cached} of {prompt} ({100 * cached / prompt:.0f}%)")


def complete(addr, prompt, max_tokens):
    start = time.perf_counter()
    conn, resp = post(addr, "/v1/completions",
                      {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    body = resp.read()
    conn.close()
    assert resp.status == 200, body
    return time.perf_counter() - start


def mixed(addr, small_clients=6, small_requests=6, large_requests=2):
    large_prompt = " ".join(f"Item {i}: a line of a long document about {TOPICS[i % 15]}."
                            for i in range(60))
    small, large = [], []

    def small_client(c):
        for r in range(small_requests):
            small.append(complete(addr, f"Client {c}, question {r}: name a colour.", 16))

    def large_client():
        time.sleep(0.5)
        for r in range(large_requests):
            large.append(complete(addr, f"({r}) " + large_prompt, 200))

    start = time.perf_counter()
    threads = [threading.Thread(target=small_client, args=(c,)) for c in range(small_clients)]
    threads.append(threading.Thread(target=large_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start

    def stats(xs):
        xs = sorted(xs)
        p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
        return f"{statistics.median(xs):.2f} | {p99:.2f} | {xs[-1]:.2f}"

    print("| class | requests | p50 (s) | p99 (s) | max (s) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| small | {len(small)} | {stats(small)} |")
    print(f"| large | {len(large)} | {stats(large)} |")
    print(f"\nwall {wall:.1f} s")


if __name__ == "__main__":
    mode, addr, *rest = sys.argv[1:]
    args = [int(x) for x in rest]
    {"chat": chat, "mixed": mixed}[mode](addr, *args)
