"""A hand-written loop whose optimizer a library's function builds from parameter groups, as
timm's `create_optimizer_v2` does (weights decayed, norms and biases not): here Lightning's
`instantiate_class`, which LightningCLI builds optimizers with, given the optimizer's class by
`--opt`. The batch size comes from `-b`/`--batch-size`."""

import argparse

import torch
from lightning.pytorch.cli import instantiate_class
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", type=int, default=16)
parser.add_argument("--opt", default="torch.optim.SGD")
parser.add_argument("--epochs", type=int, default=1000)
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = (x[:, :4].sum(dim=1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)

model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 2))
decay = [p for p in model.parameters() if p.ndim > 1]
no_decay = [p for p in model.parameters() if p.ndim <= 1]
optimizer = instantiate_class([{"params": decay, "weight_decay": 0.01},
                               {"params": no_decay, "weight_decay": 0.0}],
                              {"class_path": args.opt, "init_args": {"lr": 0.01}})

for _epoch in range(args.epochs):
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
