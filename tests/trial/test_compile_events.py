"""`compile_events`: the compiles and CUDA-graph recordings a trial counts are the ones torch
makes and announces."""

from __future__ import annotations

import torch
from torch._dynamo import callback_handler
from torch._dynamo.callback import CallbackTrigger

from autotune.trial.compile_events import CompileCount, compile_count


def test_every_new_shape_of_a_static_compile_is_a_graph() -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    before = compile_count()
    for n in (3, 3, 4, 5, 5):
        fn(torch.ones(n))
    assert (compile_count() - before).graphs == 3


def test_cuda_graph_recordings_are_counted_as_torch_announces_them() -> None:
    """cudagraph_trees announces each recording through dynamo's compile callbacks, exactly
    so (CPU records none, so the announcement is made here as it makes it)."""
    before = compile_count()
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
        pass
    with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "1/0"):
        pass  # a compile, not a recording
    assert (compile_count() - before).cudagraph_recordings == 1


def test_counts_without_announcements_are_unknown_not_zero() -> None:
    assert (CompileCount(5, 2) - CompileCount(3, None)) == CompileCount(2, None)
