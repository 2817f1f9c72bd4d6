"""An MLP-Mixer on generated 64x64 images (patches mixed across tokens, then across channels):
a model this project had not tuned before issue 33's bar, sized so that one trial takes about
half a minute on the 2-core CPU (its baseline step about a second)."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 64}


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                    nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                      nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, image: int, patch: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        self.blocks = nn.ModuleList(MixerBlock(tokens, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def build_model(image: int = 64, patch: int = 8, width: int = 192, depth: int = 6,
                classes: int = 100) -> nn.Module:
    return Mixer(image, patch, width, depth, classes)


def build_dataset(image: int = 64, classes: int = 100, size: int = 2048):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(size, 3, image, image, generator=g)
    labels = torch.randint(0, classes, (size,), generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)
