"""How large each of the dataset's samples is, so that the worst batch a long training run can
meet is measured, not left to a random window's luck.

A trial times a few hundred random batches; text padded per batch, graphs and detection images
vary in size, and a micro-batch that fits every batch a window drew can still run out of memory
hours into a run, on the batch that holds the longest samples. A sample's size is the bytes of
the tensors its collate function (the model file's `collate_fn`, else PyTorch's
`default_collate`) makes of it alone: a padding collate pads it to its own length, so the size
follows what the batch it lands in will hold.

The samples are read in a random order for at most `SCAN_BUDGET_S`: every one where reading them
all is that cheap (a scan), else the random sample read by then; `SampleSizes` says which.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import default_collate

from autotune.trial.protocol import SAMPLED, SCANNED, SampleSizes

# Samples are read in a random order for at most this long: all of them where that suffices (a
# scan), else those read by then (a random sample, bounded in time).
SCAN_BUDGET_S = 5.0
# Indices drawn at a time from the random order.
CHUNK = 4096
# The largest samples kept, largest first: a worst micro-batch of more repeats the largest.
KEPT = 1024


def sizes_or_none(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None,
                  progress: Callable[[str], None]) -> SampleSizes | None:
    """The samples' sizes (`size_samples`), or None where the dataset cannot be read by index
    (a stream) or the collate function cannot take one sample alone (the worst batch then goes
    unchecked, and the study says so)."""
    progress("sizing the samples: which are the largest")
    try:
        return size_samples(dataset, collate_fn)
    except Exception:  # noqa: BLE001 - a stream, or a collate that needs more than one sample
        return None


def size_samples(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None = None,
                 budget_s: float = SCAN_BUDGET_S, seed: int = 0) -> SampleSizes:
    """Each sample's size (`sample_bytes`), read in a random order (`seed`) until all are
    read or `budget_s` has passed: a scan where reading them all is cheap, else a random
    sample of those read by then."""
    collate = collate_fn or default_collate
    total = len(dataset)
    start = time.perf_counter()
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    sizes: dict[int, int] = {}
    for first in range(0, total, CHUNK):
        if sizes and time.perf_counter() - start > budget_s:
            break
        for index in order[first:first + CHUNK].tolist():
            sizes[index] = sample_bytes(dataset[index], collate)
            if time.perf_counter() - start > budget_s:
                break
    ranked = sorted(sizes, key=lambda i: (-sizes[i], i))[:KEPT]
    values = list(sizes.values())
    return SampleSizes(how=SCANNED if len(sizes) == total else SAMPLED, seen=len(sizes),
                       total=total, largest=tuple(ranked),
                       largest_bytes=tuple(sizes[i] for i in ranked),
                       median_bytes=int(statistics.median(values)),
                       smallest_bytes=min(values), seconds=time.perf_counter() - start)


def sample_bytes(sample: Any, collate: Callable[[list[Any]], Any]) -> int:
    """The bytes of the tensors `collate` makes of `sample` alone."""
    return tensor_bytes(collate([sample]))


def tensor_bytes(value: Any) -> int:
    """The bytes of every tensor (and NumPy array) in a batch: in dicts, tuples, lists,
    dataclasses, and objects that list their fields with `to_dict()` (PyTorch Geometric's
    `Data`); anything else counts nothing."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return 0
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and hasattr(value, "dtype"):  # a NumPy array
        return nbytes
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(tensor_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        try:
            return tensor_bytes(to_dict())
        except Exception:  # noqa: BLE001 - a to_dict that wants arguments: not a batch's fields
            return 0
    return 0
