"""What this device is and can do: memory, precisions, fused optimizers, CUDA graphs, peak FLOP/s.

The tuner's parent process asks through NVML where it can, so it never creates a CUDA context
of its own: only trial processes touch the GPU.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from autotune.config import CUDA_GRAPH_MODES, TrainConfig

# Dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' data sheets.
# Keys are matched as substrings of the device name, most specific first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "RTX 4090": {"bf16": 165.0, "fp16": 165.0, "tf32": 82.6, "fp32": 82.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
}


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
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_shares(parts: int) -> list[list[int]]:
    """The usable CPUs split into `parts` disjoint sets of consecutive CPUs (shared round-robin
    when there are fewer CPUs than parts): one per parallel CPU trial."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    if len(cpus) < parts:
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    size = len(cpus) // parts
    return [cpus[i * size:(i + 1) * size] for i in range(parts)]


def describe(device: torch.device) -> DeviceInfo:
    """Capabilities of `device`, from NVML on CUDA (no CUDA context), from torch on CPU."""
    if device.type == "cuda":
        index = device.index or 0
        name, memory, major = _nvml_facts(index)
        return DeviceInfo(type="cuda", index=index, name=name, total_memory_bytes=memory,
                          cpu_count=usable_cpus(), bf16=major >= 8, tf32=major >= 8,
                          fused_adamw=True, cuda_graphs=True)
    capabilities = torch.backends.cpu.get_cpu_capability()
    return DeviceInfo(type="cpu", index=None, name=_cpu_name(capabilities),
                      total_memory_bytes=_host_memory(), cpu_count=usable_cpus(), bf16=True,
                      tf32=False, fused_adamw=True, cuda_graphs=False)


def unsupported_reason(config: TrainConfig, info: DeviceInfo) -> str | None:
    """Why this device cannot run `config`, or None when it can."""
    if info.type != "cuda":
        if config.precision == "fp16":
            return "fp16 needs a GradScaler path, which autotune offers on CUDA only; use bf16"
        if config.precision == "tf32":
            return "tf32 is a CUDA tensor-core mode; on CPU use fp32 or bf16"
        if config.pin_memory:
            return "pin_memory only helps copies to a CUDA device"
        if config.compile_mode in CUDA_GRAPH_MODES:
            return f"compile_mode={config.compile_mode} uses CUDA graphs, which need CUDA"
    if config.precision == "bf16" and not info.bf16:
        return f"{info.name} has no bf16 support"
    if config.precision == "tf32" and not info.tf32:
        return f"{info.name} has no TF32 tensor cores (needs compute capability 8.0+)"
    if config.optimizer_impl == "fused" and not info.fused_adamw:
        return f"fused AdamW is not available on {info.name}"
    if config.num_workers > info.cpu_count:
        return f"num_workers={config.num_workers} exceeds the {info.cpu_count} usable CPUs"
    return None


def peak_flops(info: DeviceInfo, precision: str) -> float | None:
    """Peak FLOP/s for MFU: the data-sheet figure, else a short matmul measurement (CUDA only)."""
    if info.type != "cuda":
        return None
    for key, table in PEAK_TFLOPS.items():
        if key in info.name and precision in table:
            return table[precision] * 1e12
    return measure_matmul_flops(info.torch_device, precision)


def measure_matmul_flops(device: torch.device, precision: str, n: int = 8192,
                         repeats: int = 10) -> float:
    """Achieved FLOP/s of a large square matmul: a stand-in peak for GPUs not in the table."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    previous = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32" if precision == "tf32" else "ieee"
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
        torch.backends.cuda.matmul.fp32_precision = previous
    return 2 * n**3 * repeats / elapsed


def nvml_memory_used(index: int) -> int | None:
    """Bytes in use on the whole device per NVML (all processes), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(index))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def nvml_index(index: int) -> int:
    """NVML counts all GPUs; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",")]
        if index < len(ids) and ids[index].isdigit():
            return int(ids[index])
    return index


def _nvml_facts(index: int) -> tuple[str, int, int]:
    """Name, total memory and compute-capability major of a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(index))
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), int(major)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        props = torch.cuda.get_device_properties(index)
        return props.name, int(props.total_memory), props.major


def _cpu_name(capabilities: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({capabilities})"
    except OSError:
        pass
    return f"CPU ({capabilities})"


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
