#!/usr/bin/env python3
"""The page of `transformer serve` in headless Chromium, driven through chromedriver's
WebDriver protocol (plain HTTP + JSON, no client library). The page finds the model ready and
shows the view of its kind (`GET /info`):
- a language model: a message typed and sent gets a streamed reply, and the reply shown is
  exactly the text the API returns for the same conversation (greedy, as the page's default
  temperature 0);
- an encoder: the sentences typed are compared, and the table shows, to 3 decimals, the cosine
  of every pair of the vectors `POST /v1/embeddings` returns for them;
- a translation model: a sentence typed and translated shows exactly the translation
  `POST /translate` returns, and the heat map of a chosen layer and head (for the cross-,
  encoder and decoder attention) is a canvas of one 14-pixel cell per (query, key) pair whose
  colours are the weights `POST /attention` returns.

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


def chat_view():
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


# The colour the page gives weight w: rgb(v, v, 255) with v = round(255 (1 - w)).
CELL = 14


def check_map(kind, label, panel):
    """The map `label` of `kind` is shown as a canvas whose cells have `panel`'s colours."""
    select = "const k = document.getElementById('kind'); k.value = arguments[0];" \
             "k.dispatchEvent(new Event('change'));"
    script(select, kind)
    found = script("""
        const m = [...document.querySelectorAll('#maps .map')]
            .find(m => m.dataset.label === arguments[0]);
        if (!m) return null;
        const c = m.querySelector('canvas');
        const g = c.getContext('2d');
        const px = [];
        for (let i = 0; i < arguments[1]; i++) for (let j = 0; j < arguments[2]; j++) {
            const d = g.getImageData(j * arguments[3] + arguments[3] / 2,
                                     i * arguments[3] + arguments[3] / 2, 1, 1).data;
            px.push([d[0], d[1], d[2]]);
        }
        return {width: c.width, height: c.height, title: m.textContent, px,
                maps: document.querySelectorAll('#maps .map').length};
    """, label, len(panel["rows"]), len(panel["cols"]), CELL)
    if not found:
        raise SystemExit(f"FAIL: no heat map labelled {label!r} in the {kind} view")
    rows, cols = len(panel["rows"]), len(panel["cols"])
    if (found["width"], found["height"]) != (cols * CELL, rows * CELL):
        raise SystemExit(f"FAIL: {label}: canvas {found['width']}x{found['height']}, "
                         f"want {cols}x{rows} cells of {CELL}")
    for i in range(rows):
        for j in range(cols):
            v = round(255 * (1 - panel["weights"][i][j]))
            got = found["px"][i * cols + j]
            if abs(got[0] - v) > 1 or abs(got[1] - v) > 1 or got[2] != 255:
                raise SystemExit(f"FAIL: {label} cell ({i}, {j}): colour {got}, want "
                                 f"({v}, {v}, 255) for weight {panel['weights'][i][j]}")
    return found["maps"]


def translate_view():
    sentence = "three hundred twenty-one"
    box = element("#source")
    call("POST", f"{base}/element/{box}/value", {"text": sentence})
    call("POST", f"{base}/element/{element('#tsend')}/click", {})
    wait_for("return document.getElementById('translation').dataset.done === '1'",
             "the translation")
    shown = script("return document.getElementById('translation').textContent")
    want = call("POST", server + "/translate", {"q": sentence, "source": "auto"})
    if not shown or shown != want["translatedText"] or shown.startswith("error"):
        raise SystemExit(f"FAIL: the page shows {shown!r}, /translate answers {want!r}")
    maps = call("POST", server + "/attention", {"q": sentence})
    heads = maps["heads"]
    layers = len(maps["cross"]) // heads
    if layers < 1 or not maps["encoder"]:
        raise SystemExit(f"FAIL: /attention has {len(maps['cross'])} cross maps, {heads} heads")
    # The last layer's last head, the first layer's second head, the first of the decoder.
    chosen = [("cross", layers - 1, heads - 1), ("encoder", 0, min(1, heads - 1)),
              ("decoder", 0, 0)]
    for kind, layer, head in chosen:
        panel = maps[kind][layer * heads + head]
        label = f"{kind} layer {layer + 1} head {head + 1}"
        if panel["label"] != label:
            raise SystemExit(f"FAIL: /attention panel {layer * heads + head} of {kind} is "
                             f"{panel['label']!r}, want {label!r}")
        shown_maps = check_map(kind, label, panel)
        if shown_maps != len(maps[kind]):
            raise SystemExit(f"FAIL: the {kind} view shows {shown_maps} maps, /attention "
                             f"has {len(maps[kind])}")
    print(f"ok: the page translated {sentence!r} to {shown!r} as /translate does, and drew "
          f"every layer's {heads} heads' heat maps with /attention's weights "
          f"({', '.join(f'{k} L{l + 1} H{h + 1}' for k, l, h in chosen)} checked cell by cell)")


def embed_view():
    sentences = ["A cat sits on the mat.", "A kitten is on the rug.", "Stock prices fell sharply."]
    script("document.getElementById('sentences').value = arguments[0];", "\n".join(sentences))
    call("POST", f"{base}/element/{element('#esend')}/click", {})
    wait_for("return document.getElementById('similarity').dataset.done === '1'", "the table")
    dims = script("return document.getElementById('dims').textContent")
    if dims.startswith("error"):
        raise SystemExit(f"FAIL: the page shows {dims!r}")
    cells = script("return [...document.querySelectorAll('#similarity tr')].slice(1)"
                   ".map(r => [...r.querySelectorAll('td')].map(td => td.textContent))")
    got = call("POST", server + "/v1/embeddings", {"input": sentences})
    vecs = [d["embedding"] for d in got["data"]]

    def cos(a, b):
        dot = sum(x * y for x, y in zip(a, b))
        return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)
    want = [[f"{cos(a, b):.3f}" for b in vecs] for a in vecs]
    if cells != want:
        raise SystemExit(f"FAIL: the page shows {cells}, the API's vectors give {want}")
    if f"{len(vecs[0])} dimensions" not in dims:
        raise SystemExit(f"FAIL: the page says {dims!r} of {len(vecs[0])}-dimensional vectors")
    if not float(want[0][1]) > float(want[0][2]):
        raise SystemExit(f"FAIL: the cat sentences are not the closer pair: {want}")
    print(f"ok: the page compared {len(sentences)} sentences, {dims}, every cosine as the API's "
          f"vectors give it ({want[0][1]} cat/kitten, {want[0][2]} cat/stocks)")


try:
    call("POST", base + "/url", {"url": server + "/"})
    wait_for("return document.getElementById('status').dataset.ready === '1'"
             " && !!document.getElementById('status').dataset.kind", "the model ready")
    kind = script("return document.getElementById('status').dataset.kind")
    if kind == "translation":
        translate_view()
    elif kind == "language-model":
        chat_view()
    elif kind == "encoder":
        embed_view()
    else:
        raise SystemExit(f"FAIL: the page has no view for a {kind!r} model")
finally:
    call("DELETE", base)
