"""The samples' sizes: what collate makes of each alone, every one read where that is cheap, a
random sample of them where it is not, the largest first."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from autotune.trial.protocol import SAMPLED, SCANNED
from autotune.trial.sample_sizes import KEPT, sample_bytes, size_samples, tensor_bytes


class Lengths(torch.utils.data.Dataset):
    """Sequences of `lengths[i]` tokens; a read takes `delay_s`."""

    def __init__(self, lengths: list[int], delay_s: float = 0.0) -> None:
        self.lengths, self.delay_s = lengths, delay_s

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.zeros(self.lengths[i], dtype=torch.long)


def pad(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    longest = max(len(s) for s in samples)
    return {"tokens": torch.zeros(len(samples), longest, dtype=torch.long),
            "mask": torch.zeros(len(samples), longest, dtype=torch.bool)}


@dataclasses.dataclass
class Graph:
    nodes: torch.Tensor
    edges: torch.Tensor
    name: str


class HasFields:
    def __init__(self) -> None:
        self.x = torch.zeros(3, 4)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {"x": self.x}


def test_a_batch_counts_the_bytes_of_every_tensor_it_holds() -> None:
    assert tensor_bytes(torch.zeros(4, 2)) == 32
    assert tensor_bytes({"a": torch.zeros(2, dtype=torch.int64), "b": [torch.zeros(1), 3]}) == 20
    assert tensor_bytes(Graph(torch.zeros(5), torch.zeros(2, 3, dtype=torch.int64), "g")) == 68
    assert tensor_bytes(np.zeros(10, dtype=np.float64)) == 80
    assert tensor_bytes(HasFields()) == 48
    assert tensor_bytes(("text", None, 1.5)) == 0


def test_a_sample_is_sized_by_what_collate_makes_of_it_alone() -> None:
    assert sample_bytes(torch.zeros(7, dtype=torch.long), pad) == 7 * 8 + 7


def test_a_cheap_dataset_is_scanned_and_its_rare_long_sample_found() -> None:
    lengths = [10 + i % 5 for i in range(5000)]
    lengths[3333] = 2000
    sizes = size_samples(Lengths(lengths), pad)
    assert sizes.how == SCANNED and sizes.seen == sizes.total == 5000
    assert sizes.largest[0] == 3333 and sizes.largest_bytes[0] == 2000 * 9
    assert len(sizes.largest) == KEPT and list(sizes.largest_bytes) == sorted(
        sizes.largest_bytes, reverse=True)
    assert sizes.median_bytes == 12 * 9 and sizes.smallest_bytes == 10 * 9
    assert not sizes.uniform
    assert "a scan of all 5,000 samples" in sizes.describe()
    assert sizes.worst_indices(3) == list(sizes.largest[:3])


def test_an_expensive_dataset_is_sampled_within_the_time_and_says_so() -> None:
    sizes = size_samples(Lengths([8] * 10_000, delay_s=0.001), budget_s=0.2)
    assert sizes.how == SAMPLED and 0 < sizes.seen < 10_000
    assert "a random sample of" in sizes.describe()
    assert sizes.uniform and "every sample is the same size" in sizes.describe()


def test_a_worst_micro_batch_larger_than_the_samples_kept_repeats_the_largest() -> None:
    sizes = size_samples(Lengths([3, 9, 5]))
    assert sizes.largest == (1, 2, 0)
    assert sizes.worst_indices(5) == [1, 2, 0, 1, 1]
