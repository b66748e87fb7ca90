#!/usr/bin/env python3
"""The page of `transformer serve` in headless Chromium, driven through chromedriver's
WebDriver protocol (plain HTTP + JSON, no client library): the page finds the model ready,
a message typed and sent gets a streamed reply, and the reply shown is exactly the text the
API returns for the same conversation (greedy, as the page's default temperature 0).

Usage: page_test.py SERVER_URL CHROMEDRIVER_URL CHROMIUM_BINARY
"""
import json
import sys
import time
import urllib.request

server, driver, chromium = sys.argv[1:4]


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")


caps = {"capabilities": {"alwaysMatch": {
    "browserName": "chrome",
    "goog:chromeOptions": {"binary": chromium, "args": [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]},
}}}
session = call("POST", driver + "/session", caps)["value"]["sessionId"]
base = f"{driver}/session/{session}"


def script(js, *args):
    return call("POST", base + "/execute/sync", {"script": js, "args": list(args)})["value"]


def wait_for(js, what, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        value = script(js)
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"FAIL: timed out waiting for {what}")


def element(css):
    found = call("POST", base + "/element", {"using": "css selector", "value": css})["value"]
    return next(iter(found.values()))


try:
    call("POST", base + "/url", {"url": server + "/"})
    wait_for("return document.getElementById('status').dataset.ready === '1'", "the model ready")
    message = "Good morning, how are you?"
    box = element("#input")
    call("POST", f"{base}/element/{box}/value", {"text": message})
    call("POST", f"{base}/element/{element('#send')}/click", {})
    wait_for("const a = document.querySelector('.assistant');"
             "return a && a.dataset.done === '1'", "the reply")
    shown = script("return document.querySelector('.assistant').textContent")
    errors = script("return [...document.querySelectorAll('.error')].map(e => e.textContent)")
    if errors:
        raise SystemExit(f"FAIL: the page shows errors: {errors}")
    want = call("POST", server + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": message}],
        "max_tokens": 128, "temperature": 0, "top_p": 1})
    text = want["choices"][0]["message"]["content"]
    if not shown or shown != text:
        raise SystemExit(f"FAIL: the page shows {shown!r}, the API answers {text!r}")
    users = script("return [...document.querySelectorAll('.user')].map(e => e.textContent)")
    if users != [message]:
        raise SystemExit(f"FAIL: user messages shown: {users}")
    print(f"ok: the page streamed a reply of {len(shown)} characters equal to the API's")
finally:
    call("DELETE", base)
