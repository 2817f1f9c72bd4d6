"""A decoder-only language model built with x-transformers (lucidrains), from a config, on
synthetic token sequences: a user's model file, written as a new user would."""

import torch
from x_transformers import Decoder, TransformerWrapper

BASELINE = {"micro_batch_size": 16}


def build_model(dim=128, depth=4, heads=4, vocab=512, seq=128):
    return TransformerWrapper(num_tokens=vocab, max_seq_len=seq,
                              attn_layers=Decoder(dim=dim, depth=depth, heads=heads))


def build_dataset(vocab=512, seq=128, size=2048):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randint(0, vocab, (size, seq + 1), generator=g))


def loss_fn(model, batch):
    (tokens,) = batch
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
