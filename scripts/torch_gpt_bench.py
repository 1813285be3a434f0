#!/usr/bin/env python3
"""The 118M-parameter GPT of `benches/gpu_train.rs`, in PyTorch, for a side-by-side table.

Same model as pipewright's reference GPT: token and positional embeddings, 8 pre-norm blocks
(LayerNorm, causal multi-head attention with a fused QKV projection, LayerNorm, a 4*d GeLU
(tanh) MLP), a final LayerNorm and a biased LM head; d_model 1024, 16 heads, seq 256, vocab
8192. A step is 8 microbatches of 8 sequences with gradients accumulated, then AdamW
(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), as pipewright's.

Modes: eager f32, eager with bf16 autocast, and torch.compile with bf16 autocast (where
compile works). TF32 is off in every mode, as in pipewright's f32 run. Prints the median
step time of each mode as a Markdown table, with the GPU and the versions.

    python3 scripts/torch_gpt_bench.py [--steps 20] [--warmup 3] [--modes f32,bf16,compile-bf16]
"""

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, D, HEADS, LAYERS = 8192, 256, 1024, 16, 8
MICROBATCHES, MICROBATCH_SIZE = 8, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D, eps=1e-5)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D, eps=1e-5)
        self.fc1 = nn.Linear(D, 4 * D)
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        heads = lambda z: z.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D, eps=1e-5)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def batches(device):
    """Arithmetic progressions modulo the vocabulary, like pipewright's generated data."""
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(MICROBATCHES):
        start = torch.randint(0, VOCAB, (MICROBATCH_SIZE, 1), generator=g)
        stride = torch.randint(1, 8, (MICROBATCH_SIZE, 1), generator=g)
        seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
        out.append((seq[:, :-1].to(device), seq[:, 1:].to(device)))
    return out


def run(mode, steps, warmup):
    torch.manual_seed(0)
    model = Gpt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    fwd = torch.compile(model) if mode.startswith("compile") else model
    bf16 = mode.endswith("bf16")
    data = batches("cuda")

    def step():
        for ids, targets in data:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = fwd(ids, targets) / MICROBATCHES
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    return statistics.median(times) * 1e3, params


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="f32,bf16,compile-bf16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device visible to PyTorch")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for mode in args.modes.split(","):
        try:
            ms, params = run(mode, args.steps, args.warmup)
            rows.append((mode, f"{ms:.1f}", f"{params / 1e6:.1f}M"))
        except Exception as e:  # compile may be unavailable (no Triton, old GPU): say so
            rows.append((mode, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}", ""))
        torch.cuda.empty_cache()
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}; TF32 off; median of {args.steps} steps after "
          f"{args.warmup} warm-up; {MICROBATCHES} x {MICROBATCH_SIZE} sequences of {SEQ} tokens")
    print()
    print("| mode | ms / step | parameters |")
    print("|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
