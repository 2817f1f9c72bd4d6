"""`compile_events`: the compiles and CUDA-graph recordings a trial counts are the ones torch
makes and announces."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.callback

from autotune.trial import compile_events
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
    so (CPU records none, so the announcement is made here as it makes it). torch 2.6
    announces none: its callbacks carry no trigger."""
    from torch._dynamo import callback_handler

    trigger = getattr(torch._dynamo.callback, "CallbackTrigger", None)
    if trigger is None:
        pytest.skip(f"torch {torch.__version__}'s compile callbacks carry no trigger")
    before = compile_count()
    with callback_handler.install_callbacks(trigger.CUDAGRAPH_RECORDING, "0/0"):
        pass
    with callback_handler.install_callbacks(trigger.DYNAMO, "1/0"):
        pass  # a compile, not a recording
    assert (compile_count() - before).cudagraph_recordings == 1


def test_counts_without_announcements_are_unknown_not_zero() -> None:
    assert (CompileCount(5, 2) - CompileCount(3, None)) == CompileCount(2, None)


def test_a_torch_that_announces_no_recordings_counts_them_as_unknown(monkeypatch) -> None:
    """torch 2.6 has no CallbackTrigger: compiles are still counted, recordings unknown."""
    monkeypatch.delattr(torch._dynamo.callback, "CallbackTrigger", raising=False)
    monkeypatch.setattr(compile_events, "_RECORDINGS", compile_events._Recordings())
    count = compile_count()
    assert count.graphs >= 0 and count.cudagraph_recordings is None
