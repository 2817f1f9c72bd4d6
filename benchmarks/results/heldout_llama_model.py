"""A Llama-style decoder from Hugging Face transformers, built from a config (no weights), on
synthetic token sequences: a user's model file, written as a new user would."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BASELINE = {"micro_batch_size": 16}


def build_model(dim=128, depth=4, heads=4, vocab=512, seq=128):
    config = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=4 * dim,
                         num_hidden_layers=depth, num_attention_heads=heads,
                         num_key_value_heads=heads, max_position_embeddings=seq)
    return LlamaForCausalLM(config)


def build_dataset(vocab=512, seq=128, size=2048):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (size, seq), generator=g)
    return [{"input_ids": t, "labels": t} for t in tokens]
