#!/usr/bin/env python3
"""Time training steps of the paper's Transformer in PyTorch eager mode, on the CPU.

    python torch_train.py --threads 1 [--batch 16 --src-len 32 --tgt-len 32 --vocab 8000]

The PyTorch side of `transformer bench` (src/cli/bench.rs): the same model, batch and step,
written the way a PyTorch user would write it (torch.nn layers, no compilation):

- the base model by default: d_model 512, 8 heads, d_ff 2048, 6 + 6 layers, post-LN (no final
  layer norms), ReLU, dropout 0.1 on embeddings + positions and on each sublayer output, as
  ours (torch.nn's layers would also drop attention weights and FFN hidden units; that is
  switched off unless --inner-dropout is given);
- one shared vocabulary: the token table is the source embedding, the target embedding and
  (tied) the pre-softmax projection; embeddings scaled by sqrt(d_model) plus the paper's
  interleaved sinusoids;
- a fixed batch of `--batch` random pairs: source = src_len - 1 random ids + EOS, decoder input
  = BOS + tgt_len - 1 random ids, decoder output = the random ids + EOS (ids above the 4
  specials), so a step processes batch * (src_len + tgt_len) tokens, the count ours reports;
- a step: zero the gradients, forward, label-smoothed (0.1) cross-entropy averaged over target
  tokens, backward, Adam(0.9, 0.98, eps 1e-9) with the Noam learning rate (warm-up 4000).

With `--autocast-bf16` the forward and the loss run under
`torch.autocast("cpu", dtype=torch.bfloat16)` (PyTorch's mixed precision: bf16 inputs to the
linear layers' and attention's products, float32 weights, gradients and Adam state), the
peer of our `--precision bf16`.

Prints `pytorch: X tokens/s` and `step: S s median over N steps` (N timed steps after the
warm-up steps, median of their wall-clock times).
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, BOS, EOS = 0, 1, 2


def sinusoids(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    dim = torch.arange(d_model)
    i2 = (dim - dim % 2).to(torch.float64)
    angle = pos / torch.pow(10000.0, i2 / d_model)
    return torch.where(dim % 2 == 0, torch.sin(angle), torch.cos(angle)).to(torch.float32)


class Transformer(nn.Module):
    def __init__(self, vocab, d_model, heads, d_ff, layers, dropout, inner_dropout, max_len=1024):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab, d_model)
        nn.init.xavier_uniform_(self.embedding.weight)
        self.register_buffer("positions", sinusoids(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        enc_layer = nn.TransformerEncoderLayer(
            d_model, heads, d_ff, dropout, activation="relu", batch_first=True, norm_first=False
        )
        dec_layer = nn.TransformerDecoderLayer(
            d_model, heads, d_ff, dropout, activation="relu", batch_first=True, norm_first=False
        )
        # torch.nn also drops attention weights and the FFN's hidden activations with the same
        # probability; ours (the paper's P_drop) only drops embeddings and sublayer outputs.
        for layer in (enc_layer, dec_layer):
            layer.dropout = nn.Dropout(inner_dropout)  # between the FFN's two linears
            layer.self_attn.dropout = inner_dropout
        dec_layer.multihead_attn.dropout = inner_dropout
        # Post-LN: no final norm (nn.Transformer would add one).
        self.encoder = nn.TransformerEncoder(enc_layer, layers, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(dec_layer, layers)

    def embed(self, ids):
        x = self.embedding(ids) * math.sqrt(self.d_model) + self.positions[: ids.shape[1]]
        return self.dropout(x)

    def forward(self, src, tgt_in):
        memory = self.encoder(self.embed(src))
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.decoder(self.embed(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True)
        return h @ self.embedding.weight.t()  # tied pre-softmax projection


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--batch", type=int, default=16, help="sentence pairs per batch")
    parser.add_argument("--src-len", type=int, default=32, help="source tokens (EOS included)")
    parser.add_argument("--tgt-len", type=int, default=32, help="target tokens (EOS included)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument(
        "--inner-dropout",
        type=float,
        default=0.0,
        help="dropout on attention weights and the FFN hidden layer (torch.nn's default is "
        "--dropout; 0 matches ours)",
    )
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--autocast-bf16",
        action="store_true",
        help='forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)',
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Transformer(
        args.vocab, args.d_model, args.heads, args.d_ff, args.layers, args.dropout, args.inner_dropout
    )
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    noam = lambda step: args.d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * 4000**-1.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, noam)

    def random_ids(n):
        return torch.randint(4, args.vocab, (args.batch, n))

    eos = torch.full((args.batch, 1), EOS)
    bos = torch.full((args.batch, 1), BOS)
    src = torch.cat([random_ids(args.src_len - 1), eos], dim=1)
    tgt = random_ids(args.tgt_len - 1)
    tgt_in = torch.cat([bos, tgt], dim=1)
    tgt_out = torch.cat([tgt, eos], dim=1)
    tokens = src.numel() + tgt_out.numel()
    print(
        f"pytorch {torch.__version__}: {n_params} parameters, {args.threads} threads, "
        f"batch {args.batch} x ({args.src_len} + {args.tgt_len}) tokens, vocab {args.vocab}, "
        f"{'bf16 autocast' if args.autocast_bf16 else 'float32'}",
        flush=True,
    )

    times = []
    for step in range(args.warmup_steps + args.steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast_bf16):
            logits = model(src, tgt_in)
            loss = F.cross_entropy(
                logits.reshape(-1, args.vocab),
                tgt_out.reshape(-1),
                ignore_index=PAD,
                label_smoothing=0.1,
            )
        loss.backward()
        optimizer.step()
        schedule.step()
        dt = time.perf_counter() - t0
        warm = step < args.warmup_steps
        print(f"step {step}: {dt:.3f} s, loss {loss.item():.3f}{' (warm-up)' if warm else ''}",
              flush=True)
        if not warm:
            times.append(dt)
    med = statistics.median(times)
    print(f"pytorch: {tokens / med:.0f} tokens/s")
    print(f"step: {med:.3f} s median over {args.steps} steps")


if __name__ == "__main__":
    main()
