"""Make a tiny ImageFolder dataset for torchvision's references/classification/train.py.

Layout (what train.py expects under --data-path):
    data/train/class_XX/img_YYY.png   (10 classes x 20 images, 64x64 RGB PNG)
    data/val/class_XX/img_YYY.png     (10 classes x 5 images)

Each class has its own base colour and stripe orientation/frequency plus per-image
noise, random shift and brightness, so a CNN can actually learn something.
Deterministic (seed 0). Run from this folder:  /work/venv-214/bin/python make_data.py
"""

import os
import random

import numpy as np
from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
NUM_CLASSES = 10
N_TRAIN = 20
N_VAL = 5
SIZE = 64


def make_image(cls, rng):
    base = np.array(
        [(cls * 37) % 256, (cls * 91 + 40) % 256, (cls * 151 + 80) % 256], dtype=np.float32
    )
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    angle = cls * np.pi / NUM_CLASSES
    freq = 0.15 + 0.05 * (cls % 3)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy) + phase)
    img = base[None, None, :] * (0.6 + 0.4 * stripes[..., None])
    img *= rng.uniform(0.8, 1.2)
    img += rng.normal(0, 20, size=img.shape)
    img = np.roll(img, shift=(rng.integers(-8, 9), rng.integers(-8, 9)), axis=(0, 1))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="RGB")


def main():
    rng = np.random.default_rng(0)
    random.seed(0)
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        for cls in range(NUM_CLASSES):
            d = os.path.join(ROOT, split, f"class_{cls:02d}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                make_image(cls, rng).save(os.path.join(d, f"img_{i:03d}.png"))
    print(f"wrote {NUM_CLASSES * (N_TRAIN + N_VAL)} images under {ROOT}")


if __name__ == "__main__":
    main()
