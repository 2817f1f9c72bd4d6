"""Train a small CNN on synthetic 32x32 images with PyTorch Ignite, as its MNIST example does."""
import argparse

import torch
from ignite.engine import Events, create_supervised_evaluator, create_supervised_trainer
from ignite.metrics import Accuracy, Loss
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(),
                                  nn.Linear(128, 10))

    def forward(self, x):
        return self.head(self.features(x))


def loaders(batch_size, num_workers):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (4096,), generator=g)
    train = TensorDataset(x[:3584], y[:3584])
    val = TensorDataset(x[3584:], y[3584:])
    return (DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=num_workers),
            DataLoader(val, batch_size=256, num_workers=num_workers))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num_workers", type=int, default=0)
    parser.add_argument("--log_interval", type=int, default=50)
    args = parser.parse_args()

    train_loader, val_loader = loaders(args.batch_size, args.num_workers)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    trainer = create_supervised_trainer(model, optimizer, criterion)
    evaluator = create_supervised_evaluator(
        model, metrics={"accuracy": Accuracy(), "nll": Loss(criterion)})

    @trainer.on(Events.ITERATION_COMPLETED(every=args.log_interval))
    def log_training_loss(engine):
        print(f"Epoch {engine.state.epoch} iteration {engine.state.iteration} "
              f"loss {engine.state.output:.3f}")

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_validation(engine):
        evaluator.run(val_loader)
        m = evaluator.state.metrics
        print(f"Validation epoch {engine.state.epoch}: accuracy {m['accuracy']:.3f} "
              f"nll {m['nll']:.3f}")

    trainer.run(train_loader, max_epochs=args.epochs)


if __name__ == "__main__":
    main()
