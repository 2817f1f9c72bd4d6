"""GPT-2 as Hugging Face ships it: ``transformers``' ``GPT2LMHeadModel`` built from a
``GPT2Config`` (nothing is downloaded), trained on synthetic token sequences.

A user's real-library model next to the project's own ``gpt.py``: the model is the library's
(its own attention implementation, its KV cache, its per-layer activation checkpointing), and
batches are what a tokenizer's padding collator yields, a ``BatchEncoding`` of ``input_ids``,
``attention_mask`` and ``labels`` (``-100`` on padding, which the loss ignores). Sequences vary
in length and are padded to ``block_size``, so every batch has the same shape. The model
returns an output with ``.loss``, so the file needs no ``loss_fn``.

Needs the ``examples`` extra (``pip install -e ".[examples]"``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate
from transformers import BatchEncoding, GPT2Config, GPT2LMHeadModel

BASELINE = {
    "micro_batch_size": 8,
    "grad_accum_steps": 4,
    "precision": "fp32",
    "optimizer_impl": "for_loop",
    "num_workers": 0,
}


class PaddedPatternDataset(Dataset):
    """Sequences that repeat a random motif (some tokens replaced by noise), of random length
    between half of ``block_size`` and all of it, padded to ``block_size``.

    Copying from one period back lowers the loss, so training curves mean something.
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
        n = self.block_size
        length = int(torch.randint(max(1, n // 2), n + 1, (), generator=g))
        period = int(torch.randint(2, 17, (), generator=g))
        motif = torch.randint(self.vocab_size, (period,), generator=g)
        ids = motif.repeat(-(-n // period))[:n]
        noisy = torch.rand(n, generator=g) < self.noise
        ids[noisy] = torch.randint(self.vocab_size, (int(noisy.sum()),), generator=g)
        mask = (torch.arange(n) < length).long()
        # GPT2LMHeadModel shifts the labels itself; padding is the last token id, masked out.
        ids = ids.masked_fill(mask == 0, self.vocab_size - 1)
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def collate_fn(samples: list[dict[str, torch.Tensor]]) -> BatchEncoding:
    """Stacks the samples into a ``BatchEncoding``, the type a tokenizer's collators return."""
    return BatchEncoding(default_collate(samples))


def build_model(
    n_layer: int = 12,
    n_embd: int = 768,
    n_head: int = 12,
    block_size: int = 1024,
    vocab_size: int = 50257,
    dropout: float = 0.1,
) -> nn.Module:
    """GPT-2 small by default (124M parameters), with the library's default dropout."""
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=block_size,
        vocab_size=vocab_size,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
    )
    return GPT2LMHeadModel(config)


def build_dataset(
    block_size: int = 1024,
    vocab_size: int = 50257,
    num_samples: int = 100_000,
    noise: float = 0.1,
    seed: int = 0,
) -> Dataset:
    return PaddedPatternDataset(num_samples, block_size, vocab_size, noise, seed)
