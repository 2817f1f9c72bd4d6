"""Data for nanoGPT's `config/train_shakespeare_char.py` without downloading: a character
dataset in nanoGPT's own format (`data/shakespeare_char/train.bin`, `val.bin` as uint16 token
ids, `meta.pkl` with the vocabulary), made from words drawn at random. Run it in a checkout of
karpathy/nanoGPT; its CPU recipe then trains as its README says."""
import pickle
import random
from pathlib import Path

import numpy as np

random.seed(0)
words = ["thou", "art", "the", "king", "of", "rome", "and", "my", "lord", "speak", "hath", "not"]
text = " ".join(random.choice(words) for _ in range(200000))
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
ids = np.array([stoi[c] for c in text], dtype=np.uint16)
split = int(0.9 * len(ids))
folder = Path("data/shakespeare_char")
folder.mkdir(parents=True, exist_ok=True)
ids[:split].tofile(folder / "train.bin")
ids[split:].tofile(folder / "val.bin")
with open(folder / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
