"""A hand-written training loop over DataLoaders: a small classifier, a training loader and an
evaluation loader built in the script (the training one's batch size from `--batch_size`), an
AdamW with a step-decay schedule, an evaluation under no_grad every `--eval_every` steps, and
the loaders' worker counts and a log written to `--out`."""

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="out")
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--eval_every", type=int, default=1000)
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
x = torch.randn(1024, 32, generator=g)
y = (x[:, :4].sum(dim=1) > 0).long()
train = TensorDataset(x[:896], y[:896])
held_out = TensorDataset(x[896:], y[896:])
train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=0)
eval_loader = DataLoader(held_out, batch_size=64)

model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                      nn.Linear(128, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "loaders.json"), "w") as f:
    json.dump({"train": train_loader.num_workers, "eval": eval_loader.num_workers}, f)

step = 0
for _epoch in range(args.epochs):
    model.train()
    for inputs, labels in train_loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        step += 1
        if step % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(a).argmax(1) == b).sum()) for a, b in eval_loader)
            print(f"step {step}: accuracy {correct / len(held_out):.3f}")
            model.train()
