#!/usr/bin/env python3
"""The GPT of examples/gpt in PyTorch on the CPU: the same corpus, model, initialisation, loss,
optimizer and step, for a tokens/s comparison with unihal's `gpt` binary (see gpt_vs_torch.sh).

Mirrors examples/gpt/src/{data,model,train}.rs:
  * corpus: README.md, docs/ARCHITECTURE.md, docs/RELIABILITY.md, docs/BENCHMARKS.md joined with
    "\\n"; vocabulary = sorted distinct characters; chunks of 1024 characters, every 10th held out;
  * GPT-2 pre-norm decoder: token + position embeddings, `layers` blocks of causal self-attention
    (fused QKV with bias, scale 1/sqrt(hd), output projection with bias) and a GELU(tanh) MLP of
    width 4d, final layer norm (eps 1e-5), untied output projection with bias; no dropout;
  * init: N(0, 0.02) matrices and embeddings, N(0, 0.02/sqrt(2L)) residual projections, biases 0,
    layer-norm gains 1;
  * mean cross-entropy over B*T tokens, global-norm clipping at 1.0, AdamW (0.9, 0.95, eps 1e-8),
    weight decay 0.1 on matrices and embeddings only, lr 5e-3 with a linear warm-up over 20 steps
    (lr * min(1, (step + 1) / 20)); f32.

The batches are uniform random offsets into the training text from a seeded torch generator (not
unihal's SplitMix64 sequence), and the initial weights come from torch's generator, so the losses
agree with unihal's statistically, not bit for bit.

A timed step: draw the batch, zero_grad, forward, backward, clip, optimizer step, loss.item()
(unihal's step also draws and uploads its batch and reads the loss back). tokens/s = B*T / step
time. The last line on stdout is one JSON object; per-step lines go to stderr with --verbose.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SOURCES = ["README.md", "docs/ARCHITECTURE.md", "docs/RELIABILITY.md", "docs/BENCHMARKS.md"]
CHUNK = 1024
HELDOUT_EVERY = 10
WARMUP_STEPS = 20
LN_EPS = 1e-5


def corpus(repo):
    texts = []
    for name in SOURCES:
        # newline="": no newline translation, the bytes as `include_str!` sees them.
        with open(os.path.join(repo, name), encoding="utf-8", newline="") as f:
            texts.append(f.read())
    text = "\n".join(texts)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = [index[c] for c in text]
    train = []
    for i in range(0, len(ids), CHUNK):
        if (i // CHUNK) % HELDOUT_EVERY != HELDOUT_EVERY - 1:
            train.extend(ids[i : i + CHUNK])
    return vocab, torch.tensor(train, dtype=torch.long)


class Block(nn.Module):
    def __init__(self, d, h, attn):
        super().__init__()
        self.h = h
        self.attn_impl = attn
        self.ln1 = nn.LayerNorm(d, eps=LN_EPS)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=LN_EPS)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        hd = d // self.h
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, hd).transpose(1, 2) for z in (q, k, v))
        if self.attn_impl == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # As unihal does it: scores, additive causal mask, softmax, weighted sum.
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            a = torch.softmax(s + mask, dim=-1) @ v
        a = a.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, d, h, layers, attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=LN_EPS)
        self.head = nn.Linear(d, vocab)
        mask = torch.full((ctx, ctx), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("pos", torch.arange(ctx), persistent=False)
        std, res_std = 0.02, 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                s = res_std if name.endswith(("proj.weight", "out.weight")) else std
                nn.init.normal_(p, 0.0, s)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:  # layer-norm gains
                nn.init.ones_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(self.pos[:t])
        for blk in self.blocks:
            x = blk(x, self.mask[:t, :t])
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def median_after_warmup(values):
    """Median of the values after the first tenth, as unihal's `gpt` summary takes it
    (the element at len/2 of the sorted tail)."""
    tail = sorted(values[len(values) // 10 :])
    return tail[len(tail) // 2]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=os.path.normpath(os.path.join(here, "..", "..", "..")))
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--attn",
        choices=["math", "sdpa"],
        default="math",
        help="math: explicit masked softmax as unihal computes it; sdpa: scaled_dot_product_attention",
    )
    ap.add_argument(
        "--optim-impl",
        choices=["foreach", "fused", "forloop"],
        default="foreach",
        help="AdamW implementation (torch's own CPU default is forloop)",
    )
    ap.add_argument("--verbose", action="store_true", help="per-step loss and tokens/s on stderr")
    a = ap.parse_args()

    torch.set_num_interop_threads(1)  # before any parallel work
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    vocab, train = corpus(a.repo)
    model = GPT(len(vocab), a.ctx, a.dim, a.heads, a.layers, a.attn)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": a.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=a.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        **impl[a.optim_impl],
    )
    params = list(model.parameters())

    gen = torch.Generator().manual_seed(a.seed)
    span = len(train) - a.ctx - 1
    arange = torch.arange(a.ctx + 1)
    tokens = a.batch * a.ctx
    losses, tps = [], []
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / WARMUP_STEPS)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        off = torch.randint(0, span, (a.batch, 1), generator=gen)
        seq = train[off + arange]
        x, y = seq[:, :-1], seq[:, 1:]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        losses.append(lv)
        tps.append(tokens / dt)
        if a.verbose:
            print(
                f"step {step:4} | loss {lv:.4f} | {tokens / dt:8.0f} tok/s | {dt * 1e3:7.1f} ms",
                file=sys.stderr,
            )

    print(
        json.dumps(
            {
                "impl": "pytorch",
                "version": torch.__version__,
                "threads": a.threads,
                "median_tokens_per_s": median_after_warmup(tps),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "vocab": len(vocab),
                "parameters": sum(p.numel() for p in params),
                "steps": a.steps,
                "attn": a.attn,
                "optim_impl": a.optim_impl,
            }
        )
    )


if __name__ == "__main__":
    main()
