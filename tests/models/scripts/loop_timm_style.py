"""A hand-written loop in the style of timm's `train.py`: its model made by a library's factory
(transformers' `AutoModelForSequenceClassification.from_config`, as timm's `create_model`),
its own AMP flags (`--amp`, `--amp-dtype`) and compile flags (`--torchcompile [BACKEND]`,
`--torchcompile-mode`), a `-b` short option for the batch, and at each epoch's end an
evaluation (`--eval-batches` batches without gradients) and a checkpoint in `--output`."""

import argparse
import contextlib
import functools
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForSequenceClassification, BertConfig

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--train-samples", type=int, default=32)
parser.add_argument("--eval-batches", type=int, default=0)
parser.add_argument("--amp", action="store_true")
parser.add_argument("--amp-dtype", default="float16")
parser.add_argument("--torchcompile", nargs="?", type=str, default=None, const="inductor")
parser.add_argument("--torchcompile-mode", type=str, default=None)
parser.add_argument("--output", default="output")
args = parser.parse_args()

config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = AutoModelForSequenceClassification.from_config(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if args.torchcompile:
    model = torch.compile(model, backend=args.torchcompile, mode=args.torchcompile_mode)
amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
amp_autocast = functools.partial(torch.autocast, "cpu", dtype=amp_dtype) if args.amp else \
    contextlib.nullcontext

g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, 64, (args.train_samples, 16), generator=g)
labels = (tokens[:, 0] % 2).long()
train_loader = DataLoader(TensorDataset(tokens, labels), batch_size=args.batch_size,
                          shuffle=True)
held_out = torch.randint(0, 64, (64 * max(1, args.eval_batches), 16), generator=g)
eval_loader = DataLoader(TensorDataset(held_out), batch_size=64)
output = Path(args.output)

for _epoch in range(args.epochs):
    model.train()
    for inputs, targets in train_loader:
        with amp_autocast():
            loss = model(input_ids=inputs, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for (inputs,), _ in zip(eval_loader, range(args.eval_batches), strict=False):
            model(input_ids=inputs)
    output.mkdir(exist_ok=True)
    torch.save(model.state_dict(), output / "last.pth")
