#!/usr/bin/env python3
"""A fixed set of requests to a running `transformer serve`, answers written as JSON for golden.sh.

    serve_requests.py URL KIND OUT.json

KIND: `lm` (a language model without a chat template), `chat` (one with a chat template), `mt`
(a translation model) or `embed` (an encoder). Every request is sent once alone, in order, and then
the whole set again at once from one thread each (continuous batching: the answers must equal the
ones alone). Fields that differ from run to run (ids, creation times) are replaced by "<v>".
Python 3 standard library only.
"""

import json
import sys
import threading
import urllib.error
import urllib.request

VOLATILE = {"id", "created", "system_fingerprint"}


def scrub(value):
    if isinstance(value, dict):
        return {k: ("<v>" if k in VOLATILE else scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def post(url, path, body):
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            status, raw = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read().decode()
    if body.get("stream"):
        # Server-sent events: the JSON of each `data:` line, `[DONE]` kept as text.
        events = []
        for line in raw.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else scrub(json.loads(payload)))
        return {"status": status, "events": events}
    try:
        return {"status": status, "body": scrub(json.loads(raw))}
    except json.JSONDecodeError:
        return {"status": status, "text": raw}


def requests_for(kind):
    prompts = ["ROMEO:", "JULIET:\nO", "First Citizen:\nBefore we proceed", "KING"]
    if kind in ("lm", "chat"):
        reqs = []
        for i, p in enumerate(prompts):
            reqs.append(("/v1/completions", {"prompt": p, "max_tokens": 20, "temperature": 0}))
            reqs.append(("/v1/completions", {"prompt": p, "max_tokens": 20, "temperature": 0.9,
                                              "top_k": 20, "top_p": 0.95, "seed": 11 + i}))
        reqs.append(("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 20, "temperature": 0,
                                          "stream": True}))
        reqs.append(("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 30, "temperature": 0,
                                          "stop": ["\n\n"]}))
        if kind == "chat":
            for q in ["What is the capital of France?", "Write a haiku about the sea."]:
                msgs = [{"role": "user", "content": q}]
                reqs.append(("/v1/chat/completions",
                             {"messages": msgs, "max_tokens": 24, "temperature": 0}))
                reqs.append(("/v1/chat/completions",
                             {"messages": msgs, "max_tokens": 24, "temperature": 0,
                              "stream": True}))
                reqs.append(("/v1/chat/completions",
                             {"messages": msgs, "max_tokens": 24, "temperature": 0.7,
                              "seed": 5}))
        return reqs
    if kind == "mt":
        sentences = ["Ich habe Hunger .", "Das Haus ist gross .", "Wo ist der Bahnhof ?",
                     "Er kommt morgen .", "Guten Morgen !"]
        reqs = [("/translate", {"q": s, "source": "src", "target": "tgt"}) for s in sentences]
        reqs.append(("/translate", {"q": sentences, "source": "src", "target": "tgt"}))
        reqs.append(("/translate", {"q": sentences[0], "source": "src", "target": "tgt",
                                    "alternatives": 2}))
        reqs.append(("/attention", {"q": sentences[1]}))
        return reqs
    if kind == "embed":
        texts = ["A man is eating food.", "A man is eating a piece of bread.", "", "東京"]
        return [("/v1/embeddings", {"input": t}) for t in texts] + [
            ("/v1/embeddings", {"input": texts})]
    raise SystemExit(f"unknown kind {kind}")


def main():
    url, kind, out = sys.argv[1:4]
    reqs = requests_for(kind)
    alone = [post(url, path, body) for path, body in reqs]
    together = [None] * len(reqs)

    def one(i):
        together[i] = post(url, reqs[i][0], reqs[i][1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = []
    for (path, body), a, b in zip(reqs, alone, together):
        entry = {"path": path, "request": body, "alone": a}
        entry["together"] = "same" if a == b else b
        result.append(entry)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
