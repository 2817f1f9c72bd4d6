"""A ConvNeXt image classifier from Hugging Face transformers, built from a config (no weights),
on synthetic images: a user's model file, written as a new user would."""

import torch
from transformers import ConvNextConfig, ConvNextForImageClassification

BASELINE = {"micro_batch_size": 32}


def build_model(classes=10, size=64):
    config = ConvNextConfig(num_labels=classes, depths=[2, 2, 4, 2],
                            hidden_sizes=[32, 64, 128, 256], image_size=size)
    return ConvNextForImageClassification(config)


def build_dataset(classes=10, size=64, count=1024):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(count, 3, size, size, generator=g)
    labels = torch.randint(0, classes, (count,), generator=g)
    return [{"pixel_values": x, "labels": y} for x, y in zip(images, labels)]
