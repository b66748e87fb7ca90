"""libretranslatepy against `transformer serve` with a multilingual model (NLLB's layout:
tests/fixtures/nllb), unchanged: /languages lists every language with all the others as
targets, translate both ways between two of them (each answer what `transformer translate
--source-lang --target-lang` prints for the line), "auto" is the configured source, detect
answers it, an unknown code is a 400.
Usage: python3 libretranslate_multilingual_test.py URL BIN MODEL_DIR"""

import subprocess
import sys
import urllib.error

from libretranslatepy import LibreTranslateAPI

LINES = {"deu_Latn": "Das Haus ist alt.", "eng_Latn": "The house is old and the garden is big."}


def cli(bin, model, text, source, target):
    out = subprocess.run(
        [bin, "translate", "--model", model, "--source-lang", source, "--target-lang", target],
        input=text + "\n", capture_output=True, text=True, check=True,
    ).stdout
    return out.rstrip("\n")


def main():
    url, bin, model = sys.argv[1:4]
    api = LibreTranslateAPI(url)
    languages = api.languages()
    codes = [l["code"] for l in languages]
    assert len(codes) == 202 and "deu_Latn" in codes and "spa_Latn" in codes, codes[:5]
    for l in languages:
        assert sorted(l["targets"] + [l["code"]]) == sorted(codes), l["code"]
    texts = {}
    for source, target in [("deu_Latn", "eng_Latn"), ("eng_Latn", "deu_Latn"), ("eng_Latn", "spa_Latn")]:
        text = api.translate(LINES[source], source, target)
        want = cli(bin, model, LINES[source], source, target)
        assert text == want, (source, target, text, want)
        texts[(source, target)] = text
    # The configured source (tokenizer_config.json: deu_Latn).
    auto = api.translate(LINES["deu_Latn"], "auto", "eng_Latn")
    assert auto == texts[("deu_Latn", "eng_Latn")], auto
    assert api.detect("Hallo")[0]["language"] == "deu_Latn"
    try:
        api.translate("Hallo", "deu_Latn", "xx_Latn")
        raise AssertionError("an unknown target was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
    print(f"libretranslatepy, multilingual: 202 languages, 3 pairs as the CLI, auto, detect, 400: ok")


if __name__ == "__main__":
    main()
