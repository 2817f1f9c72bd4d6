"""What the observer is told: samples counted from the real batches, losses summed on the
device, waits added, per optimizer step."""

from __future__ import annotations

import torch

from autotune.trial.script.observer import StepTally, rows


def test_rows_are_the_first_dimension_of_the_batchs_first_tensor() -> None:
    x = torch.zeros(5, 3)
    assert rows(x) == 5
    assert rows({"input_ids": torch.zeros(4, 16, dtype=torch.long), "labels": x}) == 4
    assert rows((x, torch.zeros(5))) == 5
    assert rows([{"meta": "text"}, (torch.zeros(7, 2),)]) == 7
    assert rows({"text": ["a", "b"]}) == 0  # no tensor: nothing to count


class _Steps:
    def __init__(self) -> None:
        self.seen: list[tuple[int, float | None, float]] = []

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        self.seen.append((samples, None if loss is None else float(loss), data_wait_s))
        return len(self.seen) == 2


def test_a_tally_reports_one_optimizer_step_and_starts_the_next() -> None:
    tally, steps = StepTally(), _Steps()
    tally.add_batch(torch.zeros(4, 2), 0.5)
    tally.add_loss(torch.tensor(1.0))
    tally.add_batch(torch.zeros(4, 2), 0.25)
    tally.add_loss(torch.tensor(2.0, dtype=torch.bfloat16))
    assert tally.report(steps) is False
    tally.add_batch(torch.zeros(3, 2), 0.0)
    tally.add_loss(None)
    assert tally.report(steps) is True
    assert steps.seen == [(8, 3.0, 0.75), (3, None, 0.0)]
