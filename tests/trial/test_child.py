"""The trial's side of the process boundary: how it classifies the way its job ended."""

from __future__ import annotations

import pytest

from autotune.trial.child import clipped, is_oom

CUBLAS_CREATE = "`cublasCreate(handle)`"


@pytest.mark.parametrize(("message", "oom"), [
    (f"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling {CUBLAS_CREATE}", True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul(...)`", True),
    (f"CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling {CUBLAS_CREATE}", True),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasSetStream(handle, s)`",
     False),
    ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`", False),
    ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", False),
])
def test_cublas_and_cudnn_allocation_failures_are_oom(message, oom) -> None:
    assert is_oom(RuntimeError(message)) is oom
    try:  # torch.compile re-raises with the original as the cause
        raise RuntimeError("backend compiler failed") from RuntimeError(message)
    except RuntimeError as wrapped:
        assert is_oom(wrapped) is oom


def test_a_long_message_keeps_its_start_and_its_own_last_line() -> None:
    """A traceback or a parser's usage runs long; what failed is at the start, the error's
    own line at the end: both are kept, the middle is left out."""
    message = "train.py failed before its training started:\n" + "  frame\n" * 2000 + \
        "ValueError: invalid int value: 'many'"
    short = clipped(message, 400)
    assert len(short) < 460
    assert short.startswith("train.py failed before its training started:\n  frame")
    assert short.endswith("  frame\nValueError: invalid int value: 'many'")
    assert f"[... {len(message) - 400:,} characters left out ...]" in short
    assert clipped("short", 400) == "short"
