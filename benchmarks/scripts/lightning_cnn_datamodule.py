"""A Lightning image-classification script: a small CNN LightningModule, a LightningDataModule
that generates its images in setup() and whose train_dataloader() reads self.batch_size, the
script's own gradient accumulation and clipping, validation each epoch, a checkpoint callback,
early stopping and a CSV logger under --work-dir, then test() after fit()."""

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class Shapes(L.LightningDataModule):
    """16x16 single-channel images; the class is which quadrant is bright."""

    def __init__(self, batch_size: int = 32, samples: int = 2048, num_workers: int = 0):
        super().__init__()
        self.batch_size = batch_size
        self.samples = samples
        self.num_workers = num_workers

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        images = torch.rand(self.samples, 1, 16, 16, generator=g) * 0.3
        labels = torch.randint(4, (self.samples,), generator=g)
        for i, label in enumerate(labels.tolist()):
            r, c = divmod(label, 2)
            images[i, 0, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 0.7
        split = self.samples * 7 // 8
        self.train_set = TensorDataset(images[:split], labels[:split])
        self.val_set = TensorDataset(images[split:], labels[split:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class SmallCNN(L.LightningModule):
    def __init__(self, lr: float = 1e-3, width: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width * 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(width * 2 * 8 * 8, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
        return [optimizer], [scheduler]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    options = parser.parse_args()

    L.seed_everything(42)
    data = Shapes(batch_size=options.batch_size)
    model = SmallCNN()
    trainer = L.Trainer(
        default_root_dir=options.work_dir,
        max_epochs=options.epochs,
        accumulate_grad_batches=options.accumulate,
        gradient_clip_val=1.0,
        logger=CSVLogger(options.work_dir, name="cnn"),
        callbacks=[ModelCheckpoint(monitor="val_loss"), EarlyStopping(monitor="val_loss")],
        log_every_n_steps=5,
    )
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data)


if __name__ == "__main__":
    main()
