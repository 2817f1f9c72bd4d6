"""A Lightning script over token sequences of varying length, padded per batch by the collate
function its DataModule's train_dataloader() gives: 4,000 sequences of 8 to 32 tokens and one
of 2,048 (a long document left in the data). A mean-pooled embedding classifier; its batch size
an attribute of the DataModule, as Lightning's batch-size finder reads it."""

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

LONG_AT = 1_207


class Sequences(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(size)
        self.lengths = torch.randint(8, 33, (size,), generator=g).tolist()
        self.lengths[LONG_AT] = 2_048

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randint(1, 256, (self.lengths[i],), generator=g), i % 2


def pad(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = nn.utils.rnn.pad_sequence([s for s, _ in samples], batch_first=True)
    return ids, torch.tensor([label for _, label in samples])


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256), nn.GELU(),
                                   nn.Linear(256, 64))
        self.head = nn.Linear(64, 2)

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        hidden = self.embed(ids) * (ids > 0).unsqueeze(-1)
        return nn.functional.cross_entropy(self.head(hidden.mean(1)), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(Sequences(4_000), batch_size=self.batch_size, shuffle=True,
                          collate_fn=pad)


parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--root", default="runs")
options = parser.parse_args()
pl.Trainer(max_epochs=5, default_root_dir=options.root, logger=False,
           enable_checkpointing=False).fit(Classifier(), datamodule=Data(options.batch_size))
