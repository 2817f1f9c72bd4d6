"""A small ImageFolder dataset: 10 classes of 64x64 images, 40 each for training, 8 to validate."""
from pathlib import Path

import numpy as np
from PIL import Image

rng = np.random.default_rng(0)
for split, n in (("train", 40), ("validation", 8)):
    for c in range(10):
        d = Path("data") / split / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            base = np.full((64, 64, 3), c * 25, np.uint8)
            noise = rng.integers(0, 40, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(base + noise).save(d / f"{i}.png")
