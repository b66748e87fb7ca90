"""Prompt and decode speed of transformers on SmolLM2 (the GGUF dequantised to float32).

Usage: hf_generate.py GGUF IDS_JSON THREADS NEW_TOKENS REPS

Loads the GGUF with transformers (`gguf_file=`, float32: the weights ours computes with), then
`REPS` times, after one untimed warm-up: the prompt (the ids of IDS_JSON) in one forward with a
fresh cache, logits of the last position only (`logits_to_keep=1`, as `generate` does), timed
as the prefill; then NEW_TOKENS greedy steps of one token each through the cache (the end of
the text is not a stop), timed as the decode. Prints one JSON line: tokens/s of each repetition,
the greedy ids and the peak resident memory of the process (ru_maxrss).
"""

import json
import os
import resource
import sys
import time


def main():
    gguf, ids_path, threads, new_tokens, reps = sys.argv[1:6]
    threads, new_tokens, reps = int(threads), int(new_tokens), int(reps)
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)),
        gguf_file=os.path.basename(gguf),
        dtype=torch.float32,
    )
    model.eval()
    with open(ids_path) as f:
        ids = json.load(f)
    prompt = torch.tensor([ids], dtype=torch.long)
    # The cache argument's name: `cache` in recent transformers, `past_key_values` before.
    import inspect

    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run(n_new):
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{cache_arg: cache})
            token = int(out.logits[0, -1].argmax())
            t1 = time.perf_counter()
            c1 = time.process_time()
            new = [token]
            for _ in range(n_new):
                out = model(
                    input_ids=torch.tensor([[token]]), use_cache=True, **{cache_arg: cache}
                )
                token = int(out.logits[0, -1].argmax())
                new.append(token)
            t2 = time.perf_counter()
            c2 = time.process_time()
        return t1 - t0, t2 - t1, new, c1 - c0, c2 - c1

    run(8)  # warm-up
    prefill, decode, new, prefill_cpu, decode_cpu = [], [], [], [], []
    for _ in range(reps):
        tp, td, new, cp, cd = run(new_tokens)
        prefill.append(len(ids) / tp)
        decode.append(new_tokens / td)
        prefill_cpu.append(cp)
        decode_cpu.append(cd)
    print(json.dumps({
        "impl": "transformers",
        "version": __import__("transformers").__version__ + " / torch " + torch.__version__,
        "threads": threads,
        "prompt_tokens": len(ids),
        "new_tokens": new_tokens,
        "prefill_tps": prefill,
        "decode_tps": decode,
        "prefill_cpu_s": prefill_cpu,
        "decode_cpu_s": decode_cpu,
        "new_ids": new,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
