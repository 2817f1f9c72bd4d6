"""Short torch.profiler windows over a few training steps, summarised for the tuner.

The profiler distorts timings, so it runs *after* the timed measurement window, never
inside it. It answers what the timing alone cannot: how often the host waits on the
device, how much of the window the device sits idle, and which operators cost the most.
"""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from autotune.trial.protocol import OperatorStat, WorkKind
from autotune.trial.training import NEXT_BATCH
from autotune.trial.work_kinds import shares_by_kind

# Each profiled step is a range named as torch.profiler's own schedule names them, so
# TensorBoard's profiler plugin splits its overview by step.
STEP_MARKER = "ProfilerStep#"
_STEP_EVENT = "ProfilerStep"  # the events list shows them all as `ProfilerStep*`

# Calls after which the host thread waits for the device (or, on CPU, reads a scalar
# back, which would be such a wait on an accelerator).
HOST_SYNC_NAMES: tuple[str, ...] = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "aten::item",
    "aten::_local_scalar_dense",
)
_SCALAR_READS = frozenset({"aten::item", "aten::_local_scalar_dense"})
_CUDA_WAITS = frozenset(HOST_SYNC_NAMES) - _SCALAR_READS
# Ranges whose scalar reads belong to the loader or the optimizer, not to the model's code.
_OPTIMIZER_STEP = "Optimizer.step#"
_BACKWARD_NODE = "autograd::engine::evaluate_function"
_OUTSIDE_MODEL_CODE = ("enumerate(DataLoader)", NEXT_BATCH, _OPTIMIZER_STEP,
                       "Optimizer.zero_grad#")

# Kineto activity types that occupy the device; user annotations and sync markers only
# span work (or waits) and would hide idle gaps.
_DEVICE_BUSY_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

_US = 1e-6

# Python frames (with_stack=True) are named `file(first line): function`: the entries of an
# event's `stack`, and, on torch 2.13 and later, Python-function events of their own.
PYTHON_FUNCTION = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")
_NOT_OPERATORS = (_STEP_EVENT, "<built-in", "nn.Module:", NEXT_BATCH)

# The columns of torch.profiler's memory timeline, in its order (torch.profiler._memory_profiler).
MEMORY_CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation",
                     "gradient", "autograd_detail", "unknown")


@dataclass
class ProfileSummary:
    steps: int
    window_s: float
    host_syncs_per_step: float
    host_sync_s_per_step: float
    device_idle_fraction: float | None
    self_cpu_total_s: float
    self_device_total_s: float | None
    top_operators: tuple[OperatorStat, ...]
    trace_path: str | None
    # Share of the window with a collective in flight (gloo's on the host, NCCL's kernels on
    # the GPU), overlapped with compute or not; None in a process of its own.
    communication_fraction: float | None = None
    # Share of the window in the optimizer's step: its host time, or on CUDA its kernels'
    # where longer; None where no optimizer step was recorded.
    optimizer_fraction: float | None = None
    # The operators' time (on CUDA: their kernels') by kind of work, and the kernels a step
    # launched (CUDA only).
    work_shares: dict[WorkKind, float] | None = None
    kernels_per_step: float | None = None


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def marked(name: str) -> Iterator[None]:
    """Name a region in profiler traces and, on CUDA, in Nsight Systems too."""
    nvtx = (
        torch.cuda.nvtx.range(name)
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else nullcontext()
    )
    with record_function(name), nvtx:
        yield


def _self_device_us(avg: Any) -> float:
    return float(avg.self_device_time_total)


def _device_us(avg: Any) -> float:
    return float(avg.device_time_total)


def _is_device_busy(evt: Any) -> bool:
    if evt.device_type != DeviceType.CUDA:
        return False
    activity = getattr(evt, "activity_type", None)
    if activity is None:  # torch builds whose events do not carry the kineto activity type
        return not evt.is_user_annotation
    return activity in _DEVICE_BUSY_ACTIVITIES


def _is_kernel(evt: Any) -> bool:
    return _is_device_busy(evt) and getattr(evt, "activity_type", "kernel") == "kernel"


def _busy_intervals(events: Iterable[Any]) -> list[tuple[float, float]]:
    """Device work of this process; CUPTI records only the process's own contexts."""
    return [(evt.time_range.start, evt.time_range.end) for evt in events if _is_device_busy(evt)]


def _collective_intervals(events: Iterable[Any]) -> list[tuple[float, float]]:
    """When the process group's collectives ran: gloo's operations, NCCL's kernels."""
    return [(evt.time_range.start, evt.time_range.end) for evt in events
            if evt.name.startswith("gloo:") or "nccl" in evt.name.lower()]


def _union_within(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi]; overlaps (streams) count once."""
    covered = 0.0
    cursor = lo
    for start, end in sorted(intervals):
        start, end = max(start, cursor), min(end, hi)
        if end > start:
            covered += end - start
            cursor = end
    return covered


def _backward_ranges(events: Iterable[Any]) -> list[tuple[float, float]]:
    return [(evt.time_range.start, evt.time_range.end) for evt in events
            if evt.name.startswith(_BACKWARD_NODE) and evt.device_type == DeviceType.CPU]


def _after_closure(step: Any, backward: Sequence[tuple[float, float]]) -> float:
    """Where an optimizer step's own work starts: after the last backward node inside it, where
    the step ran the forward and backward as its closure (Lightning's `optimizer.step(closure)`),
    else at its start."""
    start, end = step.time_range.start, step.time_range.end
    return max([start, *(stop for began, stop in backward if start <= began < end)])


def _device_us_after(step: Any, start: float) -> float:
    """The device time of the kernels `step` launched from `start` on."""
    if start <= step.time_range.start:
        return _device_us(step)
    return sum(_device_us(c) for c in step.cpu_children if c.time_range.start >= start)


def _optimizer_fraction(events: Sequence[Any], lo: float, hi: float,
                        on_cuda: bool) -> float | None:
    """The share of [lo, hi] the optimizer's step took (torch's optimizers record each step as
    `Optimizer.step#<class>.step`; a closure run inside it is the model's): on the host, or on
    CUDA its kernels' time where longer (a device-bound step)."""
    steps = [evt for evt in events if evt.name.startswith(_OPTIMIZER_STEP)
             and evt.device_type == DeviceType.CPU]
    if not steps or hi <= lo:
        return None
    backward = _backward_ranges(events)
    own = [(_after_closure(e, backward), e.time_range.end) for e in steps]
    host = _union_within(own, lo, hi)
    device = sum(_device_us_after(e, start) for e, (start, _) in zip(steps, own)) \
        if on_cuda else 0.0
    return min(1.0, max(host, device) / (hi - lo))


def _has_descendant(evt: Any, names: frozenset[str]) -> bool:
    return any(c.name in names or _has_descendant(c, names) for c in evt.cpu_children)


def _outside_model_code(evt: Any, at: float, backward: Sequence[tuple[float, float]]) -> bool:
    """Whether `evt` is the loader's or optimizer's code at time `at` (an optimizer step that
    has not yet ended its closure is running the model)."""
    if evt.name.startswith(_OPTIMIZER_STEP):
        return at >= _after_closure(evt, backward)
    return evt.name.startswith(_OUTSIDE_MODEL_CODE)


def _host_syncs(
    events: Sequence[Any], steps: Sequence[tuple[float, float]], on_cuda: bool
) -> tuple[int, float]:
    """Count and CPU time (us) of host syncs that start inside a step.

    Scalar reads made by the DataLoader's sampler or inside `optimizer.step()` (a closure's
    forward and backward aside) are not the model's syncs and are left out. Only the
    outermost of nested sync events counts (aten::item wraps aten::_local_scalar_dense,
    which on CUDA wraps cudaStreamSynchronize). On CUDA a scalar read counts only if it
    really waited on the device: optimizers read CPU step counters with .item() on every
    step, which costs the device nothing.
    """
    count, time_us = 0, 0.0
    backward = _backward_ranges(events)
    for evt in events:
        if evt.name not in HOST_SYNC_NAMES or evt.device_type != DeviceType.CPU:
            continue
        start = evt.time_range.start
        if not any(lo <= start < hi for lo, hi in steps):
            continue
        parent = evt.cpu_parent
        while parent is not None and parent.name not in HOST_SYNC_NAMES and \
                not _outside_model_code(parent, start, backward):
            parent = parent.cpu_parent
        if parent is not None:
            continue
        if on_cuda and evt.name in _SCALAR_READS and not _has_descendant(evt, _CUDA_WAITS):
            continue
        count += 1
        time_us += evt.time_range.elapsed_us()
    return count, time_us


def is_operator(evt: Any) -> bool:
    """A host-side range with its own time: aten ops, autograd nodes and named regions
    (a compiled graph's `CompiledFunction` holds its kernels' time); not a Python frame of
    with_stack, not our step marker."""
    name = evt.key if hasattr(evt, "key") else evt.name
    return evt.device_type == DeviceType.CPU and not name.startswith(_NOT_OPERATORS) and \
        not PYTHON_FUNCTION.match(name)


def _cpu_total_us(averages: Iterable[Any]) -> float:
    return float(sum(avg.self_cpu_time_total for avg in averages if is_operator(avg)))


def _operator_stats(
    averages: Iterable[Any], by_device: bool, total_us: float, top: int
) -> tuple[OperatorStat, ...]:
    """Top CPU-side operators by self time; on CUDA, device time is credited to the op
    that launched it, so kernels appear under readable aten names."""
    rows = []
    for avg in averages:
        name = avg.key
        if not is_operator(avg):
            continue
        if avg.input_shapes:
            name = f"{name} {avg.input_shapes}"
        self_us = _self_device_us(avg) if by_device else float(avg.self_cpu_time_total)
        if self_us <= 0:
            continue
        total = _device_us(avg) if by_device else float(avg.cpu_time_total)
        rows.append(
            OperatorStat(
                name=name,
                calls=int(avg.count),
                self_time_s=self_us * _US,
                total_time_s=total * _US,
                share=self_us / total_us if total_us > 0 else 0.0,
            )
        )
    rows.sort(key=lambda r: r.self_time_s, reverse=True)
    return tuple(rows[:top])


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a profile is read: torch builds a Python
    object per event, and the collections that triggers re-scan every object of the trial
    (~300,000) again and again; reading rgat's 3 steps took 3.0 s with it and 1.7 s without."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def trace_file(out_dir: Path) -> Path:
    """Where `autotune profile` writes its trace: named as TensorBoard's profiler plugin names
    a worker's."""
    return out_dir / "trace" / f"{socket.gethostname()}_{os.getpid()}.pt.trace.json"


def _activities(device: torch.device) -> list[ProfilerActivity]:
    """The CPU's, and the GPU's kernels on CUDA."""
    if device.type == "cuda":
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU]


class ProfilerWindow:
    """torch.profiler over `steps` training steps of a loop that tells it each step's end: a
    library's own loop (a script trial), or `profile_steps`'. Each step is a marked range from
    the previous step's end to its own, so the library's work between steps is in it."""

    def __init__(self, steps: int, device: torch.device | str,
                 trace_path: str | os.PathLike | None = None, top: int = 10,
                 with_stack: bool = False, profile_memory: bool = False) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.steps, self.device = steps, torch.device(device)
        self.trace_path, self.top = trace_path, top
        self._options: dict[str, Any] = {"record_shapes": True, "with_stack": with_stack,
                                         "profile_memory": profile_memory}
        if with_stack:
            # Each event's Python frames in its `stack`: torch 2.6 to 2.12 record them nowhere
            # else (2.13 also makes them parent events), and without this not even there.
            self._options["experimental_config"] = _ExperimentalConfig(verbose=True)
        self._profiler: profile | None = None
        self._step = ExitStack()
        self.done = 0

    def start(self) -> None:
        _synchronize(self.device)
        self._profiler = profile(activities=_activities(self.device), **self._options)
        self._profiler.__enter__()
        self._step.enter_context(marked(f"{STEP_MARKER}0"))

    def step_done(self) -> bool:
        """The step under way has ended; True when it was the window's last (the profiler
        stopped, the device's queued work in it)."""
        assert self._profiler is not None, "start() the window first"
        self._step.close()
        self.done += 1
        if self.done < self.steps:
            self._step.enter_context(marked(f"{STEP_MARKER}{self.done}"))
            return False
        _synchronize(self.device)
        self._profiler.__exit__(None, None, None)
        return True

    def summary(self, on_profile: Callable[[profile], None] | None = None) -> ProfileSummary:
        """What the tuner keeps of the window (and its trace, where one is asked for);
        `on_profile` sees the raw profile, for analyses that need its events."""
        assert self._profiler is not None and self.done >= self.steps, "the window is not over"
        with collection_paused():
            return _summary(self._profiler, self.steps, self.device.type == "cuda",
                            self.trace_path, self.top, on_profile)


# Python frames make a step's events about 5.5x as many, and reading events back costs about
# 60 us each (per_feature_towers, micro-batch 4 x 16 with full checkpointing on CPU: 213,817
# events without frames, 1,166,977 with them, read back in 72 s of a 128 s profiling phase). A
# window whose frames would take longer than FRAMES_READBACK_S to read is profiled without them.
FRAMES_FACTOR = 5.5
READBACK_S_PER_EVENT = 60e-6
FRAMES_READBACK_S = 5.0


def frames_readback_s(events: int) -> float:
    """About how long the events of a window with Python frames take to read back, from the
    events it records without them."""
    return events * FRAMES_FACTOR * READBACK_S_PER_EVENT


def recorded_events(run_step: Callable[[], object], device: torch.device) -> int | None:
    """The events torch.profiler records in one step without Python frames, counted without
    reading them back (0.14 s for 213,817); None where this torch does not say."""
    _synchronize(device)
    with collection_paused(), profile(activities=_activities(device)) as prof:
        run_step()
        _synchronize(device)
    results = getattr(prof.profiler, "kineto_results", None)
    return len(results.events()) if results is not None else None


def profile_steps(
    run_step: Callable[[], object],
    steps: int,
    device: torch.device,
    trace_path: str | os.PathLike | None = None,
    top: int = 10,
    with_stack: bool = False,
    profile_memory: bool = False,
    on_profile: Callable[[profile], None] | None = None,
) -> ProfileSummary:
    """Run `run_step` `steps` times under torch.profiler and summarise it.

    The window runs from the first step's start to whichever ends last: the last step on
    the host or the device work it queued (the device is synchronised before and after).
    """
    window = ProfilerWindow(steps, device, trace_path, top, with_stack, profile_memory)
    window.start()
    finished = False
    while not finished:
        run_step()
        finished = window.step_done()
    return window.summary(on_profile)


def _summary(prof: profile, steps: int, on_cuda: bool, trace_path: str | os.PathLike | None,
             top: int, on_profile: Callable[[profile], None] | None) -> ProfileSummary:
    """What the tuner keeps of a profile, and its trace where one is asked for."""
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))

    events = prof.events()
    step_ranges = sorted(
        (evt.time_range.start, evt.time_range.end)
        for evt in events
        if evt.name.startswith(_STEP_EVENT) and evt.device_type == DeviceType.CPU
    )
    lo, hi = step_ranges[0][0], step_ranges[-1][1]

    idle = None
    device_total_us = None
    if on_cuda:
        busy = _busy_intervals(events)
        hi = max([hi, *(end for _, end in busy)])
        span = hi - lo
        idle = min(1.0, max(0.0, 1.0 - _union_within(busy, lo, hi) / span)) if span > 0 else 0.0
        device_total_us = sum(end - start for start, end in busy)

    collectives = _collective_intervals(events)
    communication = _union_within(collectives, lo, hi) / (hi - lo) \
        if collectives and hi > lo else None
    if on_profile is not None:
        on_profile(prof)
    sync_count, sync_us = _host_syncs(events, step_ranges, on_cuda)
    averages = prof.key_averages()
    cpu_total_us = _cpu_total_us(averages)
    top_ops = _operator_stats(averages, on_cuda, device_total_us if on_cuda else cpu_total_us, top)
    work = shares_by_kind((avg.key, _self_device_us(avg) if on_cuda else avg.self_cpu_time_total)
                          for avg in averages if is_operator(avg))
    return ProfileSummary(
        steps=steps,
        window_s=(hi - lo) * _US,
        host_syncs_per_step=sync_count / steps,
        host_sync_s_per_step=sync_us * _US / steps,
        device_idle_fraction=idle,
        self_cpu_total_s=cpu_total_us * _US,
        self_device_total_s=None if device_total_us is None else device_total_us * _US,
        top_operators=top_ops,
        trace_path=None if trace_path is None else str(trace_path),
        communication_fraction=communication,
        optimizer_fraction=_optimizer_fraction(events, lo, hi, on_cuda),
        work_shares=work or None,
        kernels_per_step=sum(map(_is_kernel, events)) / steps if on_cuda else None,
    )


def operator_tables(prof: profile, top: int = 10) -> dict[str, tuple[OperatorStat, ...]]:
    """Top operators of a raw profile: by self device time (CUDA only), by self CPU time, and
    by (operator, input shape), the last ranked by device time where there is one."""
    averages = prof.key_averages()
    cpu_total = _cpu_total_us(averages)
    by_device = ProfilerActivity.CUDA in prof.activities
    total = cpu_total
    tables = {}
    if by_device:
        total = sum(end - start for start, end in _busy_intervals(prof.events()))
        tables["device"] = _operator_stats(averages, True, total, top)
    tables["cpu"] = _operator_stats(averages, False, cpu_total, top)
    by_shape = prof.key_averages(group_by_input_shape=True)
    tables["input shape"] = _operator_stats(by_shape, by_device, total, top)
    return tables


def memory_categories(prof: profile,
                      device: torch.device) -> tuple[list[float], dict[str, list[int]]]:
    """Memory in use over the window by what it holds (parameters, optimizer state, activations,
    gradients, ...), from the profiler's memory events (needs profile_memory, record_shapes and
    with_stack). Times in seconds from the window's start."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.json"
        with warnings.catch_warnings():  # deprecated for CUDA, where we use the allocator
            warnings.simplefilter("ignore", FutureWarning)
            prof.export_memory_timeline(str(path), device=str(device))
        times_us, sizes = json.loads(path.read_text())
    if not times_us:
        return [], {}
    start = min(times_us)
    columns = list(zip(*sizes, strict=True))[1:]  # column 0 is unused by torch
    return ([(t - start) * _US for t in times_us],
            {name: list(values) for name, values in zip(MEMORY_CATEGORIES, columns, strict=False)})


def allocator_timeline(snapshot: dict[str, Any], device_index: int,
                       start_bytes: int = 0) -> tuple[list[float], dict[str, list[int]]]:
    """Bytes allocated over time from a CUDA caching-allocator memory-history snapshot."""
    times, values = [], []
    allocated = start_bytes
    traces = snapshot.get("device_traces") or []
    for entry in traces[device_index] if device_index < len(traces) else []:
        if entry["action"] == "alloc":
            allocated += entry["size"]
        elif entry["action"] == "free_completed":
            allocated -= entry["size"]
        else:
            continue
        times.append(entry["time_us"])
        values.append(allocated)
    if not times:
        return [], {}
    return [(t - times[0]) * _US for t in times], {"allocated": values}
