"""What this device is and can do: memory, precisions, fused optimizers, CUDA graphs, peak FLOP/s.

The tuner's parent process asks through NVML where it can, so it never creates a CUDA context
of its own: only trial processes touch the GPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from autotune.config import (
    CUDA_GRAPH_MODES,
    FP8_PRECISIONS,
    HALF_ONLY_ATTENTION,
    TrainConfig,
    config_with,
)

# float8 tensor cores: Ada (8.9), Hopper (9.0) and later.
FP8_CAPABILITY = (8, 9)

# Dense (no sparsity) peaks in TFLOP/s from the vendors' data sheets, which print the tensor-core
# figures with 2:4 sparsity: the dense figure is half of it. A key matches whole words of the
# device name ("L4" does not match "NVIDIA L40"); the first key that matches wins, so the table
# runs most specific first ("H100 NVL" and "H100 PCIe" before "H100").
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # H100 data sheet, NVL column: TF32 835, BF16/FP16 1,671 (sparse); FP32 60.
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # H100 data sheet, PCIe column: TF32 756, BF16/FP16 1,513 (sparse); FP32 51.
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    # H100 data sheet, SXM column ("NVIDIA H100 80GB HBM3"): TF32 989, BF16/FP16 1,979; FP32 67.
    "H100": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
    # H200 data sheet, NVL column: TF32 835, BF16/FP16 1,671 (sparse); FP32 60.
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # H200 data sheet, SXM column: TF32 989, BF16/FP16 1,979 (sparse); FP32 67.
    "H200": {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
    # A100 data sheet (SXM and PCIe alike): TF32 156, BF16/FP16 312 (dense); FP32 19.5.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # L40S data sheet: TF32 183, BF16/FP16 362.05 (dense; 366 and 733 sparse); FP32 91.6.
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    # L40 data sheet: TF32 90.5, BF16/FP16 181.05 with FP32 accumulate (dense); FP32 90.5.
    "L40": {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5},
    # L4 data sheet: TF32 120, BF16/FP16 242 (sparse); FP32 30.3.
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    # A10 data sheet: TF32 62.5, BF16/FP16 125 (dense); FP32 31.2.
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "RTX 4090": {"bf16": 165.0, "fp16": 165.0, "tf32": 82.6, "fp32": 82.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
}

# How CUDA numbers GPUs in CUDA_VISIBLE_DEVICES and `cuda:N` unless the user says otherwise: by
# PCI bus, as NVML and nvidia-smi do, so that NVML describes the GPU the trial runs on.
BUS_ORDER = "PCI_BUS_ID"


@dataclass(frozen=True)
class DeviceInfo:
    """A device as a trial will see it."""

    type: str
    index: int | None
    name: str
    total_memory_bytes: int | None
    cpu_count: int
    bf16: bool
    tf32: bool
    fused_adamw: bool
    cuda_graphs: bool
    # A MIG slice: NVML's figures of the whole GPU (memory, peak) are not its own.
    mig: bool = False
    # float8 tensor cores: compute capability 8.9+ (Ada, Hopper, Blackwell).
    fp8: bool = False

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else \
            torch.device(self.type)

    def __str__(self) -> str:
        return f"{self.torch_device} ({self.name})"


def parse_device(spec: str | None) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`; None means CUDA when present, else CPU."""
    if spec is None:
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"unknown device {spec!r}; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {device.type!r}; use cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("CUDA was asked for but this machine has no usable CUDA device; "
                             "use --device cpu")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"{spec}: this machine has {torch.cuda.device_count()} CUDA "
                             "device(s)")
        device = torch.device("cuda", index)
    return device


def usable_cpus() -> int:
    return len(_cpu_ids())


def core_shares(parts: int) -> list[list[int]]:
    """This process's CPU cores split into `parts` disjoint, contiguous shares (at least one
    core each): one per trial running in parallel, so that neither its threads nor its
    DataLoader workers take the cores of another's."""
    cpus = _cpu_ids()
    if parts > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    size, extra = divmod(len(cpus), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        shares.append(cpus[start:end])
        start = end
    return shares


def _cpu_ids() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def describe(device: torch.device) -> DeviceInfo:
    """Capabilities of `device`, from NVML on CUDA (no CUDA context), from torch on CPU.

    On a MIG slice the memory is left unknown (None): NVML's handle may be the whole GPU's, and
    only a process on the slice knows its size (`cuda_total_memory`).
    """
    if device.type == "cuda":
        index = device.index or 0
        facts = _nvml_facts(index)
        return DeviceInfo(type="cuda", index=index, name=facts.name,
                          total_memory_bytes=None if facts.mig else facts.memory,
                          cpu_count=usable_cpus(), bf16=facts.capability[0] >= 8,
                          tf32=facts.capability[0] >= 8,
                          fused_adamw=True, cuda_graphs=True, mig=facts.mig,
                          fp8=facts.capability >= FP8_CAPABILITY)
    capabilities = torch.backends.cpu.get_cpu_capability()
    return DeviceInfo(type="cpu", index=None, name=cpu_name(capabilities, _cpuinfo()),
                      total_memory_bytes=_host_memory(), cpu_count=usable_cpus(), bf16=True,
                      tf32=False, fused_adamw=True, cuda_graphs=False)


def cuda_total_memory(device: torch.device) -> int:
    """The device's memory as the CUDA driver gives it to this process: a MIG slice's own size.
    Only for a process that may hold a CUDA context (a trial, not the tuner)."""
    return int(torch.cuda.mem_get_info(device)[1])


def unsupported_reason(config: TrainConfig, info: DeviceInfo) -> str | None:
    """Why this device cannot run `config`, the knob at fault named first, or None when it
    can."""
    refusal = _refusal(config, info)
    if refusal is None:
        return None
    knob, reason = refusal
    return f"{knob}={getattr(config, knob)}: {reason}"


def value_reason(knob: str, value: Any, info: DeviceInfo) -> str | None:
    """Why this device cannot run `knob=value`, the other knobs at their defaults, or None: the
    reason alone, for a caller that names the value itself (a knob that `value` needs, at
    fault instead, is named)."""
    config = config_with(knob, value)
    refusal = _refusal(config, info)
    if refusal is None:
        return None
    culprit, reason = refusal
    return reason if culprit == knob else f"{culprit}={getattr(config, culprit)}: {reason}"


def _refusal(config: TrainConfig, info: DeviceInfo) -> tuple[str, str] | None:
    """The knob of `config` this device cannot run and why, or None. The device's own reasons
    come first: a missing library is named only where the device would run the value with
    it."""
    if info.type != "cuda":
        if config.precision == "fp16":
            return "precision", ("fp16 needs a GradScaler path, which autotune offers on CUDA "
                                 "only; use bf16")
        if config.precision == "tf32":
            return "precision", "tf32 is a CUDA tensor-core mode; on CPU use fp32 or bf16"
        if config.pin_memory:
            return "pin_memory", "pinned memory only speeds up copies to a CUDA device"
        if config.compile_mode in CUDA_GRAPH_MODES:
            return "compile_mode", "compile modes that capture CUDA graphs need a CUDA device"
        if config.attention_backend in ("efficient", "cudnn"):
            return "attention_backend", "an attention kernel for CUDA only"
    if config.precision == "bf16" and not info.bf16:
        return "precision", f"{info.name} has no bf16 support"
    if config.precision == "tf32" and not info.tf32:
        return "precision", f"{info.name} has no TF32 tensor cores (needs compute capability 8.0+)"
    if config.precision in FP8_PRECISIONS:
        if not info.fp8:
            return "precision", ("float8 training needs a CUDA GPU of compute capability 8.9+ "
                                 f"(Ada, Hopper, Blackwell); {info.name} is not one")
        if config.compile_mode == "none":
            return "precision", ("float8 runs compiled only: torchao's float8 casts are Triton "
                                 "kernels, and eager float8 is slower than bf16")
    if info.type == "cuda" and config.attention_backend in HALF_ONLY_ATTENTION and \
            config.precision not in ("bf16", "fp16", *FP8_PRECISIONS):
        return "attention_backend", (f"{config.attention_backend} attention has CUDA kernels "
                                     "for fp16 and bf16 only")
    if config.optimizer_impl == "fused" and not info.fused_adamw:
        return "optimizer_impl", f"fused AdamW is not available on {info.name}"
    return _missing_library(config)


def _missing_library(config: TrainConfig) -> tuple[str, str] | None:
    """The knob of `config` whose library is not installed here, with how to install it."""
    if config.precision in FP8_PRECISIONS and importlib.util.find_spec("torchao") is None:
        return "precision", "float8 training is torchao's: pip install torchao"
    if config.optimizer == "adamw_8bit" and importlib.util.find_spec("bitsandbytes") is None:
        return "optimizer", "8-bit AdamW is bitsandbytes' AdamW8bit: pip install bitsandbytes"
    return None


class PeakFlops(NamedTuple):
    """The FLOP/s an MFU divides by, and where the figure came from (a reader asks both)."""

    flops: float
    source: str  # e.g. "the bf16 data-sheet peak", "a bf16 matmul measured here"


def peak_flops(info: DeviceInfo, precision: str) -> PeakFlops | None:
    """Peak FLOP/s for MFU: the data-sheet figure, else a short matmul measurement (CUDA only:
    a CPU has no such figure to divide by). A MIG slice has a share of the GPU's SMs, so it is
    always measured."""
    if info.type != "cuda":
        return None
    # float8 runs only the large linears in float8: its MFU is against the bf16 peak, as
    # torchtitan reports it
    precision = "bf16" if precision in FP8_PRECISIONS else precision
    table = None if info.mig else table_peak_tflops(info.name, precision)
    if table is not None:
        return PeakFlops(table * 1e12, f"the {precision} data-sheet peak")
    try:
        return PeakFlops(measure_matmul_flops(info.torch_device, precision),
                         f"a {precision} matmul measured here")
    except torch.cuda.OutOfMemoryError:  # a small GPU or slice, already full of the trial's cache
        return None


def table_peak_tflops(name: str, precision: str) -> float | None:
    """The data-sheet peak of a device name in TFLOP/s: the most specific key that matches."""
    for key, peaks in PEAK_TFLOPS.items():
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return peaks.get(precision)
    return None


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls on CUDA may run on TF32 tensor cores in this process, however it
    was set. torch 2.9 and later have `fp32_precision` beside the legacy `allow_tf32` and
    `set_float32_matmul_precision`, and the legacy getters raise once code in the process (a
    user's script, say) has set the new one, so the new one is read where it exists."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def measure_matmul_flops(device: torch.device, precision: str, n: int = 8192,
                         repeats: int = 10) -> float:
    """Achieved FLOP/s of a large square matmul: a stand-in peak for GPUs not in the table."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    previous = tf32_matmuls()
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * n**3 * repeats / elapsed


def nvml_memory_used(index: int) -> int | None:
    """Bytes in use on the whole device per NVML (all processes), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = nvml_handle(pynvml, visible_entry(index, os.environ))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def visible_entries(environ: Mapping[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: its ids (indices, `GPU-<uuid>`, `MIG-<uuid>`) up
    to the first empty one; None when it is not set (every GPU is visible, in order)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            break
        entries.append(entry)
    return entries


def visible_entry(index: int, environ: Mapping[str, str]) -> str:
    """The id of this process's `cuda:index` that names the same GPU in any process: its
    CUDA_VISIBLE_DEVICES entry (a bus-order index or a UUID)."""
    entries = visible_entries(environ)
    if entries is None:
        return str(index)
    if index >= len(entries):
        raise ValueError(f"cuda:{index} is not visible: CUDA_VISIBLE_DEVICES="
                         f"{environ.get('CUDA_VISIBLE_DEVICES')!r} names {len(entries)} device(s)")
    return entries[index]


def trial_device(device: str, environ: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The device a trial process uses and the environment that makes it the only one it sees.

    A CUDA trial sees its GPU alone, as `cuda:0`: CUDA events then time its stream, and pinned
    memory and the caching allocator open no context on another GPU. Its CUDA_VISIBLE_DEVICES is
    the entry that names the GPU here (mapped through this process's own CUDA_VISIBLE_DEVICES,
    UUIDs and MIG slices included), read in the same order as here.
    """
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return device, {}
    return "cuda:0", {"CUDA_VISIBLE_DEVICES": visible_entry(parsed.index or 0, environ),
                      "CUDA_DEVICE_ORDER": environ.get("CUDA_DEVICE_ORDER", BUS_ORDER)}


def group_device_env(devices: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that shows a process group's ranks the GPUs `devices` (as this process
    names them) and no others: rank r then takes `cuda:r`, the r-th of them."""
    entries = [visible_entry(torch.device(d).index or 0, environ) for d in devices]
    return {"CUDA_VISIBLE_DEVICES": ",".join(entries),
            "CUDA_DEVICE_ORDER": environ.get("CUDA_DEVICE_ORDER", BUS_ORDER)}


@dataclass(frozen=True)
class _NvmlFacts:
    name: str
    memory: int
    capability: tuple[int, int]
    mig: bool


def nvml_handle(pynvml: Any, entry: str) -> Any:
    """The NVML handle of a CUDA_VISIBLE_DEVICES entry: by UUID (a GPU or a MIG slice), else by
    its index in bus order (NVML's own)."""
    if entry.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    return pynvml.nvmlDeviceGetHandleByIndex(int(entry))


def _is_mig(pynvml: Any, entry: str, handle: Any) -> bool:
    """A MIG slice was named, or the GPU runs in MIG mode (CUDA then sees one of its slices)."""
    if entry.startswith("MIG-"):
        return True
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
        return bool(current)
    except Exception:  # no MIG support on this GPU or driver
        return False


def _nvml_facts(index: int) -> _NvmlFacts:
    """Name, total memory, compute capability and MIG-ness of a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            entry = visible_entry(index, os.environ)
            handle = nvml_handle(pynvml, entry)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            mig = _is_mig(pynvml, entry, handle)
            if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
                handle = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return _NvmlFacts(name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                              (int(major), int(minor)), mig)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        props = torch.cuda.get_device_properties(index)
        return _NvmlFacts(props.name, int(props.total_memory), (props.major, props.minor),
                          "MIG" in props.name)


# CPU flags of native bf16 arithmetic: without them bf16 is emulated, far slower.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU (or the one `cpuinfo` describes) computes in bf16 itself (AVX512-BF16
    or AMX), rather than emulating it."""
    flags = (_cpuinfo_field(_cpuinfo() if cpuinfo is None else cpuinfo, "flags") or "").split()
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def cpu_name(capabilities: str, cpuinfo: str) -> str:
    """The CPU's model, the vector instructions torch uses on it, and whether it has native
    bf16: virtual machines of one model name can differ in that, and so in their speed."""
    model = _cpuinfo_field(cpuinfo, "model name") or "CPU"
    features = [capabilities, *(["native bf16"] if cpu_has_native_bf16(cpuinfo) else [])]
    return f"{model} ({', '.join(features)})"


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _cpuinfo_field(cpuinfo: str, key: str) -> str | None:
    """The first processor's value of `key` in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_available_memory(meminfo: str | None = None) -> int | None:
    """The memory the kernel could hand out now without swapping (MemAvailable), in bytes."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
    except OSError:
        return None
    value = _cpuinfo_field(text, "MemAvailable")
    return int(value.split()[0]) * 1024 if value else None
