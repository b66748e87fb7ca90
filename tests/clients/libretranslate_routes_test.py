"""libretranslatepy against `transformer serve` with two translation models (`--model A --model
B`): the demo's English -> German model and the Marian fixture (German -> English), unchanged.
/languages lists both pairs; translate both ways, each answer what `transformer translate`
prints with that model; "auto" tells a German sentence from an English one and routes it;
detect names the language; a pair no model serves is a 400.
Usage: python3 libretranslate_routes_test.py URL BIN EN_DE_MODEL DE_EN_MODEL"""

import subprocess
import sys
import urllib.error

from libretranslatepy import LibreTranslateAPI

GERMAN = "Er gab uns nur einen Bericht über das Haus und die Stadt."
ENGLISH = "one hundred twenty-three"


def cli(bin, model, text):
    out = subprocess.run(
        [bin, "translate", "--model", model], input=text + "\n", capture_output=True, text=True,
        check=True,
    ).stdout
    return out.rstrip("\n")


def main():
    url, bin, en_de, de_en = sys.argv[1:5]
    api = LibreTranslateAPI(url)
    languages = {l["code"]: l["targets"] for l in api.languages()}
    assert languages == {"de": ["en"], "en": ["de"]}, languages
    to_german = api.translate(ENGLISH, "en", "de")
    assert to_german == cli(bin, en_de, ENGLISH), to_german
    to_english = api.translate(GERMAN, "de", "en")
    assert to_english == cli(bin, de_en, GERMAN), to_english
    assert api.translate(GERMAN, "auto", "en") == to_english
    detected = api.detect(GERMAN)[0]
    assert detected["language"] == "de" and 50 < detected["confidence"] <= 100, detected
    assert api.detect("The house is very old and stands at the edge of the town.")[0]["language"] == "en"
    try:
        api.translate(GERMAN, "de", "es")
        raise AssertionError("a pair no model serves was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
    print("libretranslatepy, two models: languages, both ways as the CLI, auto, detect, 400: ok")


if __name__ == "__main__":
    main()
