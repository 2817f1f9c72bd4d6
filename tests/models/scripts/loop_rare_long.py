"""A hand-written loop over token sequences of varying length, padded per batch by its own
collate function: 4,000 sequences of 8 to 32 tokens and one of 2,048 (a long document left in
the data), and a small held-out set of the same kind. A mean-pooled embedding classifier."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

LONG_AT = 2_903


class Sequences(torch.utils.data.Dataset):
    def __init__(self, size: int, long_at: int | None) -> None:
        g = torch.Generator().manual_seed(size)
        self.lengths = torch.randint(8, 33, (size,), generator=g).tolist()
        if long_at is not None:
            self.lengths[long_at] = 2_048

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randint(1, 256, (self.lengths[i],), generator=g), i % 2


def pad(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = nn.utils.rnn.pad_sequence([s for s, _ in samples], batch_first=True)
    return ids, torch.tensor([label for _, label in samples])


parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
args = parser.parse_args()

train_loader = DataLoader(Sequences(4_000, LONG_AT), batch_size=args.batch_size, shuffle=True,
                          collate_fn=pad)
eval_loader = DataLoader(Sequences(200, None), batch_size=50, collate_fn=pad)
model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
head = nn.Linear(64, 2)
optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)

for _epoch in range(1_000):
    for ids, labels in train_loader:
        hidden = model(ids) * (ids > 0).unsqueeze(-1)
        loss = nn.functional.cross_entropy(head(hidden.mean(1)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
