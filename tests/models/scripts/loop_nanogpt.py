"""A hand-written training loop in the style of nanoGPT's train.py: a tiny GPT built in the
script, batches drawn by hand from a token tensor (no DataLoader), gradient accumulation written
out (the loss divided by the steps, a backward per micro-batch), gradient clipping, a cosine
learning-rate schedule with warm-up set by hand each iteration, an evaluation every
`--eval_interval` iterations, and checkpoints written to `--out_dir` (made at start). Its
settings are its own argparse flags; its AdamW is built in the model's configure_optimizers."""

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="out")
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
parser.add_argument("--block_size", type=int, default=32)
parser.add_argument("--n_layer", type=int, default=2)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--max_iters", type=int, default=100000)
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--grad_clip", type=float, default=1.0)
parser.add_argument("--eval_interval", type=int, default=1000)
parser.add_argument("--fused_adam", action="store_true")
args = parser.parse_args()

torch.manual_seed(1337)
os.makedirs(args.out_dir, exist_ok=True)
vocab_size = 96
data = torch.randint(vocab_size, (20000,))


def get_batch():
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([data[i:i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.block_size] for i in ix])
    return x, y


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head=4):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_embd, block_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as nanoGPT's

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, fused):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        extra_args = dict(fused=True) if fused else dict()
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95), **extra_args)


model = GPT(args.n_layer, args.n_embd, args.block_size)
optimizer = model.configure_optimizers(0.1, args.learning_rate, args.fused_adam)


def get_lr(it, warmup=10, decay=5000):
    if it < warmup:
        return args.learning_rate * (it + 1) / (warmup + 1)
    ratio = min(1.0, (it - warmup) / (decay - warmup))
    return args.learning_rate * 0.1 + 0.5 * (1 + math.cos(math.pi * ratio)) * \
        args.learning_rate * 0.9


@torch.no_grad()
def estimate_loss():
    model.eval()
    x, y = get_batch()
    _, loss = model(x, y)
    model.train()
    return loss.item()


X, Y = get_batch()
for iter_num in range(args.max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)
    if iter_num % args.eval_interval == 0:
        print(f"step {iter_num}: loss {estimate_loss():.4f}")
        if iter_num > 0:
            torch.save({"model": model.state_dict(), "iter_num": iter_num},
                       os.path.join(args.out_dir, "ckpt.pt"))
    for _micro_step in range(args.gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / args.gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    if args.grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

torch.save({"model": model.state_dict()}, os.path.join(args.out_dir, "final.pt"))
