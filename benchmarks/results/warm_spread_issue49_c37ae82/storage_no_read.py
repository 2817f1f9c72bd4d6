"""storage_images without its read cost (each read 0 ms, not 4): all compute, what
warm_spread.py's `spread_fast_*` runs measured a 32-worker configuration against."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "expert_bar"))

from storage_images import BASELINE, SlowImages, build_model, loss_fn  # noqa: E402

__all__ = ["BASELINE", "build_model", "loss_fn", "build_dataset"]


def build_dataset(count: int = 20_000) -> SlowImages:
    return SlowImages(count, read_ms=0.0)
