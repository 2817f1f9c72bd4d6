"""Model FLOPs, as MFU counts them: the matmuls, convolutions and attention of a forward and its
backward (`torch.utils.flop_counter`), never the forward that activation checkpointing runs
again inside the backward (that is hardware FLOPs, not the model's); and a figure a sample
with where it came from. A model file's are counted on the meta device (`trial/measure`); a
training script's in one of its own warm-up steps (`StepFlops`, `trial/script/measuring`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode

# A step that runs torch.compile'd code cannot be counted: under the counter's dispatch mode
# torch.compile runs the code eagerly (not the step that is timed) or, with fullgraph=True,
# raises in the user's step.
COMPILED = "not counted: the step runs torch.compile'd code, which a FLOP counter cannot see"


class SampleFlops(NamedTuple):
    """Model FLOPs of one sample's forward and backward, and where the figure came from; with no
    figure, why none was counted."""

    per_sample: float | None
    source: str  # "given" (the model file's flops_per_sample), "counted", or "not counted: why"


class ModelFlopCounter(FlopCounterMode):
    """`FlopCounterMode` less what activation checkpointing recomputes: an op run inside a
    backward pass with grad enabled is a forward run again to rebuild saved activations
    (`torch.utils.checkpoint`, reentrant or not), so it is left out. A backward with
    `create_graph=True` (a gradient penalty) runs with grad enabled too and would be left out
    the same way."""

    def __init__(self) -> None:
        super().__init__(display=False)

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled():
            return out
        return super()._count_flops(func_packet, out, args, kwargs)


class StepFlops:
    """One optimizer step of a loop autotune does not drive, counted from the step boundary it
    is made at to the next one, where `stop` is told the samples the step trained. Everything
    the step runs is counted (its optimizer's arithmetic is element-wise, which the counter does
    not count), so a loop's evaluation or a teacher's forward inside the step would count too."""

    def __init__(self) -> None:
        self._counter = ModelFlopCounter()
        self._counter.__enter__()

    def stop(self, samples: int) -> SampleFlops | None:
        """The counter off; the step's model FLOPs a sample (None where it counted nothing, or
        trained no samples: a loop that ended inside the step)."""
        self._counter.__exit__(None, None, None)
        total = self._counter.get_total_flops()
        return SampleFlops(total / samples, "counted") if total and samples else None
