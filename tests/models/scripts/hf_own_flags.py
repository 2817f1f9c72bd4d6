"""A Hugging Face Trainer script with flags of its own (argparse, not HfArgumentParser): its
batch size and accumulation passed into TrainingArguments from `--batch_size` and `--accum`,
the rest written in the code; a tiny GPT-2 from a config and generated tokens."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", required=True)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--epochs", type=int, default=100)
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
ids = torch.randint(128, (256, 16), generator=g)
dataset = [{"input_ids": row, "labels": row} for row in ids]
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                   n_positions=16))
training_args = TrainingArguments(
    output_dir=args.output_dir,
    per_device_train_batch_size=args.batch_size,
    gradient_accumulation_steps=args.accum,
    num_train_epochs=args.epochs,
    learning_rate=1e-3,
    logging_steps=10,
)
Trainer(model=model, args=training_args, train_dataset=dataset).train()
