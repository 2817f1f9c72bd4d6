"""What torch.compile did while a trial ran: graphs compiled and CUDA graphs recorded.

A compiled model compiles in its first step. If it compiles again later (a new batch shape, a
guard that failed), or records another CUDA graph (reduce-overhead and max-autotune record one
per distinct input shape), that work lands in warm-up or, worse, in the timed window. The trial
counts both, so warm-up can wait them out and the figures say when it could not.

Varying shapes are measured as PyTorch runs them by default, deliberately: trials compile with
`torch.compile(model, mode=...)` and `dynamic=None`, so a dimension that changes is recompiled
once as dynamic ("automatic dynamic shapes") and later sizes reuse that graph; under CUDA graphs
each new size is still recorded once. autotune does not bucket or pad batches: padding belongs
to the model file's `collate_fn` (models/rgat.py pads each batch to its own largest graph), it
changes how much work a step does, and the exported configuration must run what was measured.
A model whose shapes keep changing shows it in these counts and pays for it in its figures.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompileCount:
    """Totals since the process started; subtract two to get what happened in between, add
    two to sum what happened in two spans."""

    graphs: int
    cudagraph_recordings: int | None  # None where torch does not announce recordings

    def __sub__(self, earlier: CompileCount) -> CompileCount:
        recordings = None
        if self.cudagraph_recordings is not None and earlier.cudagraph_recordings is not None:
            recordings = self.cudagraph_recordings - earlier.cudagraph_recordings
        return CompileCount(self.graphs - earlier.graphs, recordings)

    def __add__(self, other: CompileCount) -> CompileCount:
        recordings = None
        if self.cudagraph_recordings is not None and other.cudagraph_recordings is not None:
            recordings = self.cudagraph_recordings + other.cudagraph_recordings
        return CompileCount(self.graphs + other.graphs, recordings)


class _Recordings:
    """Counts the CUDA-graph recordings torch announces through its compile callbacks. Its
    callback is registered again where `torch._dynamo.reset()` cleared torch's callbacks."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._on_start: Any = None

    def listen(self) -> bool:
        """Listening (registered now where it was not); False on a torch that announces no
        recordings."""
        try:
            from torch._dynamo import callback_handler
            from torch._dynamo.callback import CallbackTrigger
        except ImportError:  # a torch whose callbacks carry no trigger
            return False
        with self._lock:
            if self._on_start is None or self._on_start not in callback_handler.start_callbacks:
                recording = CallbackTrigger.CUDAGRAPH_RECORDING

                def on_start(args: Any) -> None:
                    if getattr(args, "callback_trigger", None) == recording:
                        self.count += 1

                callback_handler.register_start_callback(on_start)
                self._on_start = on_start
        return True


_RECORDINGS = _Recordings()


def compile_count() -> CompileCount:
    """Graphs torch.compile has compiled in this process (dynamo's own counter: first compiles
    and recompiles alike) and the CUDA graphs recorded so far."""
    from torch._dynamo.utils import counters

    listening = _RECORDINGS.listen()
    return CompileCount(int(counters["stats"]["unique_graphs"]),
                        _RECORDINGS.count if listening else None)

