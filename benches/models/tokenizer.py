#!/usr/bin/env python3
"""A byte-level BPE tokenizer with a real model's vocabulary layout, trained on ../shared/data.

usage: tokenizer.py FAMILY OUTDIR        (FAMILY: llama3, qwen3 or olmoe)

The regular tokens take ids 0..REGULAR-1, as in the real tokenizer: the 256 byte symbols, then
the merges a byte-level BPE learns from the English, Spanish and German text in ../shared/data
(with `tokenizers`, min frequency 2, as far as the text allows: about 60-90k merges). The ids
the text cannot fill are unreachable filler tokens (`Ġfiller123456`, decoded " filler123456":
regular vocabulary entries that no merge produces, so they cost the tokenizer nothing). The real
special tokens follow at their real ids (Llama 3: <|begin_of_text|> 128000 ... 256 of them;
Qwen3: <|endoftext|> 151643 ... 26 of them; OLMoE: <|endoftext|> 50279). The model's embedding
may have more rows than the tokenizer (Qwen3: 151,936 against 151,669; OLMoE: 50,304 against
50,280), as the real ones do; the GGUF converter pads those ids with unused tokens.

Writes tokenizer.json, tokenizer_config.json, special_tokens_map.json and tokenizer_info.json
(ids and the llama.cpp pre-tokenizer name for the converter).
"""
import json
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_specials():
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
             6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
             10: "<|python_tag|>"}
    out, reserved = [], 0
    for i in range(256):
        if i in named:
            out.append((named[i], True))
        else:
            out.append((f"<|reserved_special_token_{reserved}|>", True))
            reserved += 1
    return out


QWEN3_SPECIALS = [(t, True) for t in [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]] + [
    ("<tool_call>", False), ("</tool_call>", False)] + [(t, True) for t in [
        "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
        "<|file_sep|>"]] + [("<tool_response>", False), ("</tool_response>", False),
                            ("<think>", False), ("</think>", False)]

# family -> regular token count, specials (text, special?), regex, bos, eos, pad, add_bos, llama.cpp pre
FAMILIES = {
    "llama3": dict(regular=128000, specials=llama3_specials(), regex=LLAMA3_RE,
                   bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None, add_bos=True,
                   pre="llama-bpe"),
    "qwen3": dict(regular=151643, specials=QWEN3_SPECIALS, regex=QWEN2_RE, bos=None,
                  eos="<|im_end|>", pad="<|endoftext|>", add_bos=False, pre="qwen2"),
    "olmoe": dict(regular=50279, specials=[("<|endoftext|>", True)], regex=None, bos=None,
                  eos="<|endoftext|>", pad=None, add_bos=False, pre="olmo"),
}


def corpus():
    """The text of ../shared/data, in lines (TSV files: every column)."""
    files = sorted(p for p in DATA.rglob("*") if p.suffix in (".txt", ".tsv"))
    if not files:
        raise SystemExit(f"no training text under {DATA} (the shared data folder is needed)")
    for p in files:
        for line in p.read_text(encoding="utf-8", errors="ignore").splitlines():
            for field in line.split("\t"):
                if field.strip():
                    yield field + "\n"


def build(family: str, out: Path) -> dict:
    f = FAMILIES[family]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    if f["regex"] is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(f["regex"]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=f["regular"], min_frequency=2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    learned = tok.get_vocab_size()
    # Fill the regular ids the text could not: unreachable entries of the BPE vocabulary.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    n = 0
    while len(vocab) < f["regular"]:
        text = f"Ġfiller{n:06d}"
        n += 1
        if text not in vocab:
            vocab[text] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(spec))
    assert tok.get_vocab_size() == f["regular"], tok.get_vocab_size()
    specials = f["specials"]
    for text, special in specials:
        added = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    total = tok.get_vocab_size(with_added_tokens=True)
    assert total == f["regular"] + len(specials), total
    for i, (text, _) in enumerate(specials):
        assert tok.token_to_id(text) == f["regular"] + i, text
    if f["add_bos"]:
        bos = f["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    names = {k: f[k] for k in ("bos", "eos", "pad")}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
           "clean_up_tokenization_spaces": False, "add_bos_token": f["add_bos"], "add_eos_token": False,
           **{f"{k}_token": v for k, v in names.items() if v},
           "added_tokens_decoder": {str(f["regular"] + i): {
               "content": t, "lstrip": False, "rstrip": False, "normalized": False,
               "single_word": False, "special": s} for i, (t, s) in enumerate(specials)}}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    stm = {f"{k}_token": v for k, v in names.items() if v}
    (out / "special_tokens_map.json").write_text(json.dumps(stm, indent=1) + "\n")
    info = {"family": family, "tokens": total, "learned": learned, "fillers": f["regular"] - learned,
            "bos_token_id": tok.token_to_id(f["bos"]) if f["bos"] else None,
            "eos_token_id": tok.token_to_id(f["eos"]),
            "pad_token_id": tok.token_to_id(f["pad"]) if f["pad"] else None,
            "llama_cpp_pre": f["pre"]}
    (out / "tokenizer_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        raise SystemExit(f"usage: tokenizer.py {{{','.join(FAMILIES)}}} OUTDIR")
    print(json.dumps(build(sys.argv[1], Path(sys.argv[2]))))
