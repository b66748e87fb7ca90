"""Pretrained multilingual translators from Python: an NLLB-layout model
(tests/fixtures/nllb, made by its make.py with transformers) translates between the languages
named by their codes exactly as transformers' `generate` does (where its margins are clear),
and unknown codes are a ValueError naming them."""

import json

import pytest

import transformer
from conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "nllb"


def test_nllb_translates_between_named_languages_as_transformers():
    reference = json.loads((FIXTURE / "reference.json").read_text(encoding="utf-8"))
    t = transformer.Translator(FIXTURE, threads=1)
    compared = 0
    for case in reference["cases"]:
        if min(case["greedy_margins"], default=1.0) <= 1e-2:
            continue
        # transformers' max_new_tokens: the source's length (its code and pieces) + max_extra.
        max_extra = case["greedy_steps"] - (len(case["source_ids"]) - 1)
        got = t.translate(
            [case["source"]], source_lang=case["source_lang"],
            target_lang=case["target_lang"], max_extra=max_extra,
        )
        assert got == [case["greedy_text"]], case["source"]
        compared += 1
    assert compared >= 3


def test_unknown_language_codes_are_value_errors():
    t = transformer.Translator(FIXTURE, threads=1)
    with pytest.raises(ValueError, match='"xx_Latn" is not one of the model\'s 202'):
        t.translate(["Hallo"], target_lang="xx_Latn")
