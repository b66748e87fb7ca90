"""Prompt and decode speed of llama.cpp (llama-cpp-python) on the same GGUF.

Usage: llama_generate.py GGUF IDS_JSON THREADS NEW_TOKENS REPS

llama.cpp computes with the quantised blocks as they are stored (Q4_1 / Q8_0 dot products), not
dequantised. `n_threads = n_threads_batch = THREADS`, one context of 512 positions, the prompt
in one batch. `REPS` times, after one untimed warm-up: the prompt (the ids of IDS_JSON) into an
emptied KV cache and the argmax of the last position's logits, timed as the prefill; then
NEW_TOKENS greedy steps of one token each (the end of the text is not a stop), timed as the
decode. Prints one JSON line like hf_generate.py's.
"""

import json
import resource
import sys
import time


def main():
    gguf, ids_path, threads, new_tokens, reps = sys.argv[1:6]
    threads, new_tokens, reps = int(threads), int(new_tokens), int(reps)
    import numpy as np
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=gguf,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    with open(ids_path) as f:
        ids = json.load(f)
    n_vocab = llm.n_vocab()

    def last_argmax():
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        return int(row.argmax())

    def run(n_new):
        llm.reset()
        c0 = time.process_time()
        t0 = time.perf_counter()
        llm.eval(ids)
        token = last_argmax()
        t1 = time.perf_counter()
        c1 = time.process_time()
        new = [token]
        for _ in range(n_new):
            llm.eval([token])
            token = last_argmax()
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
        "impl": "llama.cpp",
        "version": "llama-cpp-python " + llama_cpp.__version__,
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
