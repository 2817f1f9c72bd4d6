"""Findings in plain words from one profiled window: what to fix first, and where in the user's
code it comes from.

Two sources of "where": the profiler's Python-function events name the user's function around
each expensive operator, and a traced step (of autotune's loop, or of a script's own) with the
tensor methods that force a host sync (`.item()`, `.tolist()`, `print(tensor)`, ...) wrapped
names the exact line of each call.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import statistics
import sys
import sysconfig
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

import autotune
from autotune.trial.profiling import HOST_SYNC_NAMES, PYTHON_FUNCTION, is_operator
from autotune.trial.protocol import Finding

# The share of the window a problem must cost before it is worth a finding.
COPY_SHARE = 0.15
HOT_OPERATOR_SHARE = 0.30
LOADER_WAIT_SHARE = 0.10
FP32_MATMUL_SHARE = 0.20
LAUNCH_BOUND_IDLE = 0.30
TINY_KERNEL_S = 20e-6
TINY_CPU_OP_S = 10e-6
TINY_OP_SHARE = 0.30

COPY_OPS = frozenset({"aten::copy_", "aten::clone", "aten::contiguous", "aten::repeat",
                      "aten::repeat_interleave", "aten::_to_copy", "aten::index_select"})
_COPY_SOURCE = re.compile(r"\.(repeat|repeat_interleave|permute|transpose|contiguous|expand|"
                          r"clone|copy_|t|to|index_select)\(|\btorch\.(cat|stack)\(")
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
                        "aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                        "aten::mkldnn_convolution", "aten::_scaled_dot_product_flash_attention",
                        "aten::_scaled_dot_product_efficient_attention",
                        "aten::_scaled_dot_product_flash_attention_for_cpu"})

# Tensor methods that copy a value to the host and, on a GPU, wait for every queued kernel.
SYNC_METHODS = {"item": ".item()", "tolist": ".tolist()", "cpu": ".cpu()",
                "__bool__": "bool(tensor) / if tensor", "__float__": "float(tensor)",
                "__int__": "int(tensor)", "__repr__": "print(tensor)",
                "__format__": "f-string of a tensor"}

_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {os.path.dirname(torch.__file__), os.path.dirname(autotune.__file__),
              *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


_AUTOTUNE_ROOT = str(Path(autotune.__file__).parent.resolve()) + os.sep
_DATA_LOADING = os.path.join("torch", "utils", "data", "")


@dataclass
class SyncSite:
    """A line of the user's code that read a tensor back to the host."""

    call: str
    file: str
    line: int
    function: str
    code: str
    calls_per_step: float

    def describe(self) -> str:
        return (f"{_display(self.file)}:{self.line} in {self.function}: {self.code}  "
                f"({self.call}, {self.calls_per_step:g} per step)")


# -- where: the user's code ------------------------------------------------------------------


def is_user_file(path: str) -> bool:
    """Code the person wrote: a real file outside torch, autotune and the installed packages."""
    if path.startswith("<"):
        return False
    resolved = str(Path(path).resolve())
    return not resolved.startswith(_LIBRARY_ROOTS)


def _resolve(name: str) -> str | None:
    """The profiler shortens file names by their sys.path prefix; find the real file."""
    if os.path.isabs(name):
        return name if os.path.exists(name) else None
    for root in (os.getcwd(), *sys.path):
        candidate = os.path.join(root or os.getcwd(), name)
        if os.path.exists(candidate):
            return candidate
    return None


def _display(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


@dataclass(frozen=True)
class _Function:
    file: str
    first_line: int
    name: str

    def label(self) -> str:
        return f"{self.name} ({_display(self.file)}:{self.first_line})"

    def lines_matching(self, pattern: re.Pattern[str], limit: int = 3) -> list[str]:
        """The function's source lines that match, as `file:line: code`."""
        lines = linecache.getlines(self.file)
        if not lines or self.first_line > len(lines):
            return []
        block = inspect.getblock(lines[self.first_line - 1:])
        found = []
        for offset, text in enumerate(block):
            if pattern.search(text) and offset > 0:
                found.append(f"{_display(self.file)}:{self.first_line + offset}: {text.strip()}")
        return found[:limit]


def _is_harness(path: str) -> bool:
    return str(Path(path).resolve()).startswith(_AUTOTUNE_ROOT)


def _user_function(evt: Any, frames: dict[str, _Function | bool | None]) -> _Function | None:
    """The innermost function of the user's code on the Python stack of a profiler event.

    Its `stack`, innermost first (the profiler window records it on every torch). The walk
    stops at autotune's own frames: above them is the harness, not the model (the backward
    pass, run by autograd from our train step, has no user frame). `frames` keeps what each
    frame is: a step's events share a few hundred frames among tens of thousands of events,
    and each frame's file is looked up on the file system."""
    for frame in evt.stack:
        if frame not in frames:
            frames[frame] = _frame_function(frame)
        found = frames[frame]
        if found is _HARNESS:
            return None
        if isinstance(found, _Function):
            return found
    return None


# What `_frame_function` says of a frame of autotune's own code.
_HARNESS = True


def _frame_function(frame: str) -> _Function | bool | None:
    """The user's function a profiler frame names, `_HARNESS` for autotune's, else None."""
    match = PYTHON_FUNCTION.match(frame)
    path = _resolve(match["file"]) if match else None
    if path is None:
        return None
    if _is_harness(path):
        return _HARNESS
    return _Function(path, int(match["line"]), match["func"]) if is_user_file(path) else None


# -- the sync tracer ------------------------------------------------------------------------


@contextmanager
def _wrapped_sync_methods(record: Callable[[str, Any, torch.Tensor], None]) -> Iterator[None]:
    """Wrap the syncing tensor methods; nested calls (print -> item) are recorded once."""
    state = threading.local()
    saved = {name: torch.Tensor.__dict__.get(name) for name in SYNC_METHODS}
    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def wrap(name: str) -> Callable[..., Any]:
        original = originals[name]

        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if getattr(state, "inside", False):
                return original(self, *args, **kwargs)
            state.inside = True
            try:
                if name != "cpu" or self.device.type != "cpu":
                    record(SYNC_METHODS[name], sys._getframe(1), self)
                return original(self, *args, **kwargs)
            finally:
                state.inside = False

        return method

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, wrap(name))
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)


def _in_data_loading(frame: Any) -> bool:
    """Called from the DataLoader (a dataset's __getitem__, a collate_fn): CPU tensors that
    never touch the device, whatever the device."""
    while frame is not None:
        if _DATA_LOADING in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class HostSyncTrace:
    """The user's lines that read tensors back to the host, from `start` to `stop`: around a
    step autotune's loop runs (`trace_host_syncs`), or from one step boundary of a script's own
    loop to the next (`trial/script/measuring`).

    On CUDA only reads of device tensors count. On CPU every read in the user's code counts
    (there, the tensor would be on the GPU), but not the data loading's. Not for compiled
    code: the wrappers would be traced by dynamo and force recompiles.
    """

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._counts: Counter[tuple[str, str, int, str]] = Counter()
        self._wrapped = ExitStack()
        # a DataLoader worker forked while the methods are wrapped keeps the wrappers: it
        # records nothing
        self._pid = os.getpid()

    def start(self) -> None:
        self._wrapped.enter_context(_wrapped_sync_methods(self._record))

    def stop(self) -> None:
        """The tensor methods as they were."""
        self._wrapped.close()

    def sites(self, steps: int = 1) -> list[SyncSite]:
        """The lines recorded, the most calls first, over the `steps` steps traced."""
        sites = [SyncSite(call, file, line, func, linecache.getline(file, line).strip(),
                          n / steps)
                 for (call, file, line, func), n in self._counts.items()]
        return sorted(sites, key=lambda s: s.calls_per_step, reverse=True)

    def _record(self, call: str, frame: Any, tensor: torch.Tensor) -> None:
        if os.getpid() != self._pid:
            return
        if not is_user_file(frame.f_code.co_filename):  # torch's own reads are not the user's
            return
        if self.device_type != "cpu" and tensor.device.type == "cpu" or \
                _in_data_loading(frame):
            return
        self._counts[(call, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)] += 1


def trace_host_syncs(run_step: Callable[[], object], steps: int = 1,
                     device_type: str = "cpu") -> list[SyncSite]:
    """Run `steps` steps and return the user's lines that read tensors back to the host
    (`HostSyncTrace`)."""
    trace = HostSyncTrace(device_type)
    trace.start()
    try:
        for _ in range(steps):
            run_step()
    finally:
        trace.stop()
    return trace.sites(steps)


# -- the findings ---------------------------------------------------------------------------


def _op_events(events: Iterable[Any]) -> list[Any]:
    """The operators findings are about: the regions (loader, optimizer) have their own."""
    return [e for e in events if is_operator(e) and not e.is_user_annotation]


def _self_time(evt: Any, on_cuda: bool) -> float:
    """Seconds: device time of the kernels an op launched on CUDA, its own CPU time elsewhere."""
    if on_cuda:
        return float(evt.self_device_time_total) * 1e-6
    return float(evt.self_cpu_time_total) * 1e-6


def _by_function(events: Iterable[Any], on_cuda: bool) -> list[tuple[_Function | None, float]]:
    times: dict[_Function | None, float] = defaultdict(float)
    frames: dict[str, _Function | bool | None] = {}
    for evt in events:
        times[_user_function(evt, frames)] += _self_time(evt, on_cuda)
    return sorted(times.items(), key=lambda item: item[1], reverse=True)


def _time_by(events: Iterable[Any], on_cuda: bool, key: str) -> Counter[str]:
    """Self time summed by an event attribute (its name, its input shapes)."""
    times: Counter[str] = Counter()
    for evt in events:
        times[str(getattr(evt, key))] += _self_time(evt, on_cuda)
    return times


def _functions_and_copy_lines(events: list[Any], on_cuda: bool) -> list[str]:
    """The user's functions that cost the most, each with its lines that copy or re-lay out
    tensors (repeat, permute, contiguous, expand, ...)."""
    where: list[str] = []
    for fn, _ in _by_function(events, on_cuda)[:3]:
        if fn is not None:
            where.append(fn.label())
            where.extend(f"  {line}" for line in fn.lines_matching(_COPY_SOURCE))
    return where


def _sync_finding(sites: list[SyncSite], syncs_per_step: float, sync_s_per_step: float,
                  step_s: float, on_cuda: bool, events: list[Any]) -> Finding | None:
    where = [site.describe() for site in sites[:5]]
    if not where and syncs_per_step:
        syncs = [e for e in events if e.name in HOST_SYNC_NAMES]
        where = [f"{fn.label()}" for fn, _ in _by_function(syncs, False) if fn is not None][:3]
    count = sum(s.calls_per_step for s in sites) or syncs_per_step
    if not count or not where:
        return None
    share = min(1.0, sync_s_per_step / step_s) if step_s else 0.0
    cost = (f"they cost {sync_s_per_step * 1e3:.2f} ms per step ({share:.0%} of it)" if on_cuda
            else "on this CPU run they cost little, but on a GPU each one stalls the host")
    return Finding(
        kind="host_sync", share=share,
        title=f"{count:g} host syncs per step from your code",
        advice=(f"Each one copies a value to the host and waits until every queued kernel has "
                f"finished, so the GPU idles while Python catches up; {cost}. Keep running "
                "values as tensors (accumulate on the device), read them once per logging "
                "interval, and avoid Python branches on tensor values."),
        where=tuple(where))


def _copy_finding(ops: list[Any], total_s: float, on_cuda: bool) -> Finding | None:
    copies = [e for e in ops if e.name in COPY_OPS]
    copy_s = sum(_self_time(e, on_cuda) for e in copies)
    share = copy_s / total_s if total_s else 0.0
    if share < COPY_SHARE:
        return None
    top = ", ".join(f"{name} {t / total_s:.0%}"
                    for name, t in _time_by(copies, on_cuda, "name").most_common(3))
    clock = "device" if on_cuda else "CPU"
    return Finding(
        kind="copies", share=share,
        title=f"{share:.0%} of {clock} time only copies tensors ({top})",
        advice=("repeat/expand+contiguous/permute materialise large tensors that are read once. "
                "Broadcast instead of repeating, keep the layout the next matmul wants instead of "
                "permuting back and forth, and use fused kernels such as "
                "torch.nn.functional.scaled_dot_product_attention for attention."),
        where=tuple(_functions_and_copy_lines(copies, on_cuda)))


def _hot_operator_finding(ops: list[Any], total_s: float, on_cuda: bool) -> Finding | None:
    per_op = _time_by(ops, on_cuda, "name")
    if not per_op or not total_s:
        return None
    name, seconds = per_op.most_common(1)[0]
    share = seconds / total_s
    if share < HOT_OPERATOR_SHARE or name in COPY_OPS or name in MATMUL_OPS:
        return None
    events = [e for e in ops if e.name == name]
    shape = _time_by(events, on_cuda, "input_shapes").most_common(1)[0][0]
    clock = "device" if on_cuda else "CPU"
    return Finding(
        kind="hot_operator", share=share,
        title=f"{name} takes {share:.0%} of {clock} time (mostly on inputs {shape})",
        advice=("One operator dominates the step. Check the shapes it runs on: a tensor blown up "
                "by repeat/expand or broadcasting before an element-wise op multiplies its cost; "
                "torch.compile fuses chains of element-wise ops into one kernel."),
        where=tuple(_functions_and_copy_lines(events, on_cuda)))


def _matmul_finding(ops: list[Any], total_s: float, on_cuda: bool,
                    precision: str) -> Finding | None:
    if precision in ("bf16", "fp16") or (on_cuda and precision == "tf32"):
        return None
    matmuls = [e for e in ops if e.name in MATMUL_OPS and _on_float32(e)]
    share = sum(_self_time(e, on_cuda) for e in matmuls) / total_s if total_s else 0.0
    if share < FP32_MATMUL_SHARE:
        return None
    where = [fn.label() for fn, _ in _by_function(matmuls, on_cuda)[:3] if fn is not None]
    if on_cuda:
        advice = ("fp32 matmuls do not use the tensor cores. precision=bf16 (autocast) or tf32 "
                  "runs them there, several times faster, with the same model.")
    else:
        advice = ("precision=bf16 (autocast) runs them in bfloat16, which halves their memory "
                  "traffic and is faster on CPUs with AVX512-BF16 or AMX.")
    return Finding(kind="fp32_matmul", share=share,
                   title=f"{share:.0%} of {'device' if on_cuda else 'CPU'} time in fp32 matmuls",
                   advice=advice, where=tuple(where))


def _on_float32(event: Any) -> bool:
    """Whether a matmul event ran on float32 inputs. Events of torch before 2.12 carry no
    dtypes (the GPU machine's torch 2.11 raised here on every fp32 trial): the precision
    already says fp32 there, so the matmul counts."""
    dtypes = getattr(event, "input_dtypes", None)
    return dtypes is None or "float" in dtypes


def _launch_finding(events: list[Any], ops: list[Any], steps: int, on_cuda: bool,
                    idle_fraction: float | None, total_s: float) -> Finding | None:
    if on_cuda:
        kernels = [e.time_range.elapsed_us() * 1e-6 for e in events
                   if e.device_type == DeviceType.CUDA and
                   getattr(e, "activity_type", "kernel") == "kernel"]
        if not kernels or idle_fraction is None or idle_fraction < LAUNCH_BOUND_IDLE:
            return None
        median = statistics.median(kernels)
        if median >= TINY_KERNEL_S:
            return None
        return Finding(
            kind="launch_bound", share=idle_fraction,
            title=(f"launch-bound: {len(kernels) / steps:.0f} kernels per step, median "
                   f"{median * 1e6:.1f} us, device idle {idle_fraction:.0%} of the window"),
            advice=("The GPU finishes each tiny kernel before Python launches the next. "
                    "compile_mode=reduce-overhead (CUDA graphs) or default (fusion) removes "
                    "most launches; a larger micro-batch gives each kernel more work."),
            where=())
    tiny = [e for e in ops if e.self_cpu_time_total * 1e-6 < TINY_CPU_OP_S]
    tiny_s = sum(e.self_cpu_time_total for e in tiny) * 1e-6
    share = tiny_s / total_s if total_s else 0.0
    if share < TINY_OP_SHARE:
        return None
    return Finding(
        kind="launch_bound", share=share,
        title=(f"overhead-bound: {len(tiny) / steps:.0f} operators per step under "
               f"{TINY_CPU_OP_S * 1e6:.0f} us each take {share:.0%} of CPU time"),
        advice=("Per-operator dispatch costs as much as the work. torch.compile fuses them; a "
                "larger micro-batch gives each operator more work."),
        where=())


def _loader_finding(data_wait_fraction: float, config: Any) -> Finding | None:
    if data_wait_fraction < LOADER_WAIT_SHARE:
        return None
    return Finding(
        kind="loader", share=data_wait_fraction,
        title=f"the model waits for data {data_wait_fraction:.0%} of the time",
        advice=(f"The DataLoader (num_workers={config.num_workers}) cannot keep up. More "
                "workers, a larger prefetch_factor, persistent_workers, and pin_memory on CUDA "
                "overlap loading with compute; a cheaper __getitem__/collate_fn helps most."),
        where=("your build_dataset's __getitem__ and collate_fn",))


def diagnose(prof: Any, *, config: Any, steps: int, step_s: float, data_wait_fraction: float,
             syncs_per_step: float, sync_s_per_step: float, idle_fraction: float | None,
             sync_sites: list[SyncSite]) -> list[Finding]:
    """Every finding of one profiled window, the costliest first."""
    events = list(prof.events())
    on_cuda = any(e.device_type == DeviceType.CUDA for e in events)
    ops = _op_events(events)
    total_s = sum(_self_time(e, on_cuda) for e in ops)
    findings = [
        _loader_finding(data_wait_fraction, config),
        _copy_finding(ops, total_s, on_cuda),
        _hot_operator_finding(ops, total_s, on_cuda),
        _matmul_finding(ops, total_s, on_cuda, config.precision),
        _launch_finding(events, ops, steps, on_cuda, idle_fraction, total_s),
        _sync_finding(sync_sites, syncs_per_step, sync_s_per_step, step_s, on_cuda, events),
    ]
    return sorted((f for f in findings if f is not None), key=lambda f: f.share, reverse=True)
