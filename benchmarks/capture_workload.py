"""A real-model workload for capture coverage: forward and backward of torchvision's resnet18
and of a small GPT-2-like transformer built from torch.nn, plus a torch.compile'd MLP.

    python benchmarks/capture_workload.py [--no-compile] [--batch 8]

Random initialisation only (no weights are downloaded). Prints one JSON line with the time
the model work took (after imports), so an outside timer can separate it from start-up.
"""

from __future__ import annotations

import argparse
import json
import math
import time

t_start = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d, d), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """GPT-2 small's width (768, 12 heads) and vocabulary, two layers."""

    def __init__(self, vocab: int = 50257, d: int = 768, heads: int = 12, layers: int = 2,
                 ctx: int = 256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(1 + (p.shape[0] == vocab)))

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    t0 = time.perf_counter()

    resnet = torchvision.models.resnet18(weights=None).to(dev)
    sgd = torch.optim.SGD(resnet.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(args.batch, 3, 224, 224, device=dev)
    labels = torch.randint(0, 1000, (args.batch,), device=dev)
    F.cross_entropy(resnet(images), labels).backward()
    sgd.step()
    sgd.zero_grad()

    gpt = TinyGPT().to(dev)
    adamw = torch.optim.AdamW(gpt.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, 50257, (4, 128), device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = gpt(tokens)
    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tokens.view(-1)).backward()
    adamw.step()
    adamw.zero_grad()

    if not args.no_compile:
        mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(dev)
        fn = torch.compile(lambda t: F.layer_norm(mlp(t) + t, (256,)))
        t = torch.randn(64, 256, device=dev, requires_grad=True)
        fn(t).sum().backward()
    torch.cuda.synchronize()
    print(json.dumps({"workload": "resnet18+tinygpt" + ("" if args.no_compile else "+compile"),
                      "import_s": round(t0 - t_start, 3),
                      "model_s": round(time.perf_counter() - t0, 3)}), flush=True)


if __name__ == "__main__":
    main()
