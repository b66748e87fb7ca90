"""libretranslatepy (the LibreTranslate client, pip-installable) against `transformer serve` with a
translation model, unchanged: translate (a form body with the key as `api_key`), detect, languages,
and a wrong key refused. Usage: python3 libretranslate_test.py URL KEY SOURCE TARGET"""

import sys
import urllib.error

from libretranslatepy import LibreTranslateAPI


def main():
    url, key, source, target = sys.argv[1:5]
    api = LibreTranslateAPI(url, api_key=key)
    languages = api.languages()
    assert languages[0]["code"] == source and languages[0]["targets"] == [target], languages
    text = api.translate("one hundred twenty-three", source, target)
    assert isinstance(text, str) and text, text
    auto = api.translate("one hundred twenty-three", "auto", target)
    assert auto == text, (auto, text)
    detected = api.detect("one hundred twenty-three")
    assert detected == [{"confidence": 100.0, "language": source}], detected
    try:
        LibreTranslateAPI(url, api_key="wrong").translate("one", source, target)
        raise AssertionError("a wrong key was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 401, e.code
    try:
        api.translate("one", target, source)
        raise AssertionError("the reversed pair was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
    print(f"libretranslatepy: languages, translate ({text!r}), auto, detect, 401, 400: ok")


if __name__ == "__main__":
    main()
