#!/usr/bin/env python3
"""Runs llama.cpp's unmodified convert_hf_to_gguf.py with one tokenizer-only change in memory.

A BPE vocabulary is named to llama.cpp by hashing its tokens for a fixed test string; a freshly
trained vocabulary never matches a known hash, so the converter would stop. The lookup falls
back to the name of the pre-tokenizer regex the tokenizer was actually built with
($LLAMACPP_PRE: llama-bpe, qwen2 or olmo). Nothing else is touched (the weights go through the
converter as they would for the real model). As ../shared/tools/fixtures/convert_wrapper.py.

usage: LLAMACPP=<llama.cpp source dir> LLAMACPP_PRE=<pre> convert.py <convert_hf_to_gguf args...>
"""
import logging
import os
import runpy
import sys
from pathlib import Path

LLAMACPP = Path(os.environ["LLAMACPP"])
sys.path.insert(0, str(LLAMACPP))
sys.path.insert(1, str(LLAMACPP / "gguf-py"))
os.environ["NO_LOCAL_GGUF"] = "1"

import conversion.base as base  # noqa: E402

PRE = os.environ["LLAMACPP_PRE"]
_known_pre = base.TextModel.get_vocab_base_pre


def get_vocab_base_pre(self, tokenizer) -> str:
    try:
        return _known_pre(self, tokenizer)
    except NotImplementedError:
        logging.getLogger("convert").warning("pre-tokenizer hash unknown (a freshly trained vocabulary); using %r", PRE)
        return PRE


base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [str(LLAMACPP / "convert_hf_to_gguf.py")] + sys.argv[1:]
runpy.run_path(str(LLAMACPP / "convert_hf_to_gguf.py"), run_name="__main__")
