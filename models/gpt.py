"""GPT-2-small-style decoder (nanoGPT in spirit) on synthetic token sequences.

The standard compute-bound transformer workload: large matmuls, fused attention via
``scaled_dot_product_attention``, a tied LM head. Batches are dicts
(``{"input_ids", "labels"}``) and the model returns an output with ``.loss``, so this file
exercises the "dict batch, loss read from the output" path and needs no ``loss_fn``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

BASELINE = {
    "micro_batch_size": 8,
    "grad_accum_steps": 4,
    "precision": "fp32",
    "optimizer_impl": "for_loop",
    "num_workers": 0,
}


@dataclass
class GPTOutput:
    """What ``GPT.forward`` returns; ``loss`` is set when labels are given."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self,
        n_layer: int,
        n_embd: int,
        n_head: int,
        block_size: int,
        vocab_size: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2

        # GPT-2 initialisation; residual projections are scaled down by depth so the
        # residual stream's variance does not grow with the number of layers.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> GPTOutput:
        t = input_ids.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if labels is None:
            return GPTOutput(logits=logits)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return GPTOutput(logits=logits, loss=loss)


class RepeatedPatternDataset(Dataset):
    """Sequences that repeat a random motif, with some tokens replaced by noise.

    A model can lower its loss by learning to copy from one period back, so training
    curves mean something, while each sample costs only a few small tensor ops.
    """

    def __init__(
        self, num_samples: int, block_size: int, vocab_size: int, noise: float, seed: int
    ) -> None:
        self.num_samples = num_samples
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.noise = noise
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed + idx)
        n = self.block_size + 1
        period = int(torch.randint(2, 17, (), generator=g))  # motif length 2..16
        motif = torch.randint(self.vocab_size, (period,), generator=g)
        seq = motif.repeat(-(-n // period))[:n]
        noisy = torch.rand(n, generator=g) < self.noise
        seq[noisy] = torch.randint(self.vocab_size, (int(noisy.sum()),), generator=g)
        return {"input_ids": seq[:-1], "labels": seq[1:]}


def build_model(
    n_layer: int = 12,
    n_embd: int = 768,
    n_head: int = 12,
    block_size: int = 1024,
    vocab_size: int = 50304,
    dropout: float = 0.0,
) -> nn.Module:
    """GPT-2 small by default (~124M parameters; vocab padded to 50304 for matmul speed)."""
    return GPT(n_layer, n_embd, n_head, block_size, vocab_size, dropout)


def build_dataset(
    block_size: int = 1024,
    vocab_size: int = 50304,
    num_samples: int = 100_000,
    noise: float = 0.1,
    seed: int = 0,
) -> Dataset:
    return RepeatedPatternDataset(num_samples, block_size, vocab_size, noise, seed)


def flops_per_sample(
    n_layer: int = 12,
    n_embd: int = 768,
    block_size: int = 1024,
    vocab_size: int = 50304,
    **_: object,
) -> int:
    """Training FLOPs for one sequence of ``block_size`` tokens (the PaLM / nanoGPT estimate).

    Per token, the forward pass costs 2*N for the weight matmuls (N = 12*L*d^2 in the blocks
    plus V*d for the LM head) and 4*L*d*T for attention scores and the weighted sum of values
    (the full T x T square, ignoring causal masking). Training is 3x the forward pass, so a
    sequence of T tokens costs 6*N*T + 12*L*d*T^2.
    """
    n_params = 12 * n_layer * n_embd**2 + vocab_size * n_embd
    t = block_size
    return 6 * n_params * t + 12 * n_layer * n_embd * t**2
