"""A Lightning training script: a LightningModule, a LightningDataModule whose batch size and
workers are attributes its train_dataloader() reads, its own gradient accumulation, a
checkpoint callback and a logger writing under its root directory, many epochs asked for, and
work after Trainer.fit(). `--flavour pytorch_lightning` runs the same with the older package."""

import argparse
import importlib
from pathlib import Path

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--root", required=True)
parser.add_argument("--flavour", default="lightning.pytorch")
parser.add_argument("--accelerator", default="auto")
parser.add_argument("--batch-size", type=int, default=16)
options = parser.parse_args()
pl = importlib.import_module(options.flavour)
callbacks = importlib.import_module(f"{options.flavour}.callbacks")
loggers = importlib.import_module(f"{options.flavour}.loggers")


class Regression(pl.LightningModule):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x).squeeze(1), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int, num_workers: int = 0) -> None:
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g),
                                                   torch.randn(256, generator=g))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True,
                                           num_workers=self.num_workers)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size)


trainer = pl.Trainer(
    max_epochs=100,
    accumulate_grad_batches=2,
    accelerator=options.accelerator,
    gradient_clip_val=1e-3,
    default_root_dir=options.root,
    callbacks=[callbacks.ModelCheckpoint(dirpath=Path(options.root, "checkpoints")),
               callbacks.EarlyStopping(monitor="val_loss")],
    logger=loggers.CSVLogger(options.root),
)
trainer.fit(Regression(), datamodule=Data(options.batch_size))
Path(options.root).mkdir(parents=True, exist_ok=True)
Path(options.root, "post_training_ran").write_text("yes")
