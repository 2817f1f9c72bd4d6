"""`hardware`: which GPU a name, an id or a MIG slice is, what its data sheet says, which
device and cores a trial gets, and why a device refuses a configuration. All of it runs without
a GPU: NVML is replaced by a small stand-in that answers as the real library does for the
machine described."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from autotune.config import TrainConfig
from autotune.hardware import (
    PEAK_TFLOPS,
    DeviceInfo,
    core_shares,
    cpu_name,
    describe,
    peak_flops,
    table_peak_tflops,
    tf32_matmuls,
    trial_device,
    unsupported_reason,
    usable_cpus,
    value_reason,
    visible_entries,
)

# --- the data-sheet table ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("Tesla V100-SXM2-16GB", "V100"),
])
def test_a_device_name_gets_its_own_data_sheet_peak(name, key) -> None:
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        assert table_peak_tflops(name, precision) == PEAK_TFLOPS[key].get(precision), precision


def test_variants_are_told_apart() -> None:
    """The first-substring match gave H100 NVL the SXM peak and the L40 the L4's."""
    assert table_peak_tflops("NVIDIA H100 NVL", "bf16") < table_peak_tflops(
        "NVIDIA H100 80GB HBM3", "bf16")
    assert table_peak_tflops("NVIDIA L40", "bf16") > table_peak_tflops("NVIDIA L4", "bf16")
    assert table_peak_tflops("NVIDIA L40S", "bf16") > table_peak_tflops("NVIDIA L40", "bf16")


def test_mfu_divides_by_the_precisions_peak_which_says_where_it_came_from() -> None:
    """The data sheet's dense peak, float8 against bf16's (as torchtitan reports it); a CPU
    has none, which is why MFU is CUDA's only."""
    h100 = DeviceInfo(type="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                      total_memory_bytes=80 * 2**30, cpu_count=16, bf16=True, tf32=True,
                      fused_adamw=True, cuda_graphs=True, fp8=True)
    peak = peak_flops(h100, "fp8_rowwise")
    assert peak is not None and peak.flops == PEAK_TFLOPS["H100"]["bf16"] * 1e12
    assert peak.source == "the bf16 data-sheet peak"
    assert peak_flops(describe(torch.device("cpu")), "bf16") is None


@pytest.fixture
def fresh_tf32():
    """TF32 as a fresh process has it, after the test too (both of torch's APIs)."""
    yield
    torch.set_float32_matmul_precision("highest")
    if hasattr(torch.backends, "fp32_precision"):  # torch 2.9 and later
        torch.backends.cuda.matmul.fp32_precision = "none"
        torch.backends.fp32_precision = "none"


def test_tf32_is_read_however_a_script_set_it(fresh_tf32) -> None:
    """A script on torch 2.9+ sets the new `fp32_precision`, as PyTorch now advises: the legacy
    getters then raise "mix of the legacy and new APIs", which failed the peak's measurement
    and a Lightning script's trial. Before 2.9 only the legacy API exists."""
    assert not tf32_matmuls()
    torch.set_float32_matmul_precision("high")
    assert tf32_matmuls()
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "ieee"
        assert not tf32_matmuls()
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
    assert tf32_matmuls()


def test_an_unknown_device_has_no_table_peak() -> None:
    assert table_peak_tflops("NVIDIA GH200 480GB", "bf16") is None
    assert table_peak_tflops("NVIDIA RTX A4000", "bf16") is None
    assert table_peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 on Volta


# --- which CPU this is ------------------------------------------------------------------------

ZEN4_GUEST = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""


def test_two_cpus_of_one_model_name_differing_in_native_bf16_are_told_apart() -> None:
    """Virtual machines sold as one model differ in what their host exposes; emulated bf16 is
    many times slower, so a study must not take one for the other."""
    native = cpu_name("AVX512", ZEN4_GUEST)
    emulated = cpu_name("AVX512", ZEN4_GUEST.replace(" avx512_bf16", ""))
    assert native == "AMD EPYC (AVX512, native bf16)"
    assert emulated == "AMD EPYC (AVX512)"
    assert cpu_name("AVX2", "") == "CPU (AVX2)"


# --- which GPU a trial sees -------------------------------------------------------------------

UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-66666666-7777-8888-9999-000000000000"
MIG_B = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.mark.parametrize(("device", "environ", "visible"), [
    ("cuda:2", {}, "2"),
    ("cuda", {}, "0"),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": "3,5"}, "5"),
    ("cuda:0", {"CUDA_VISIBLE_DEVICES": " 3 , 5"}, "3"),
    ("cuda:1", {"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"}, UUID_B),
    ("cuda:0", {"CUDA_VISIBLE_DEVICES": MIG_B}, MIG_B),
])
def test_a_cuda_trial_sees_its_gpu_alone_as_cuda_0(device, environ, visible) -> None:
    name, env = trial_device(device, environ)
    assert name == "cuda:0"
    assert env == {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_the_users_device_order_is_kept() -> None:
    _, env = trial_device("cuda:1", {"CUDA_VISIBLE_DEVICES": "0,1",
                                     "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_a_cpu_trial_keeps_its_environment() -> None:
    assert trial_device("cpu", {"CUDA_VISIBLE_DEVICES": "1"}) == ("cpu", {})


def test_visible_devices_end_at_the_first_empty_entry_as_cuda_reads_them() -> None:
    assert visible_entries({}) is None
    assert visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_entries({"CUDA_VISIBLE_DEVICES": "2,,3"}) == ["2"]


def test_a_device_beyond_the_visible_ones_is_refused() -> None:
    with pytest.raises(ValueError, match="not visible"):
        trial_device("cuda:2", {"CUDA_VISIBLE_DEVICES": "0,1"})


# --- what NVML says about it --------------------------------------------------------------------

class FakeNvml:
    """NVML for a machine with two full H100s (A, B) and one MIG slice of B."""

    GPUS = {UUID_A: ("NVIDIA H100 80GB HBM3", 80 * 2**30),
            UUID_B: ("NVIDIA H100 80GB HBM3", 80 * 2**30),
            MIG_B: ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * 2**30)}

    def __init__(self, mig_mode_on: set[str] = frozenset()) -> None:
        self.mig_mode_on = mig_mode_on

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return [UUID_A, UUID_B][index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetName(self, handle: str) -> str:
        return self.GPUS[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=self.GPUS[handle][1], used=2**30)

    def nvmlDeviceIsMigDeviceHandle(self, handle: str) -> bool:
        return handle.startswith("MIG-")

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: str) -> str:
        return UUID_B

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        return (1, 1) if handle in self.mig_mode_on else (0, 0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: str) -> tuple[int, int]:
        assert not handle.startswith("MIG-"), "the real NVML asks the parent GPU"
        return 9, 0


@pytest.fixture
def nvml(monkeypatch):
    def install(environ: dict[str, str], mig_mode_on: set[str] = frozenset()) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(mig_mode_on))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        for key, value in environ.items():
            monkeypatch.setenv(key, value)
    return install


def test_a_gpu_named_by_uuid_is_described_as_itself(nvml, monkeypatch) -> None:
    """The logical index fell back to NVML's index 0, another GPU, when ids were UUIDs."""
    asked = []
    nvml({"CUDA_VISIBLE_DEVICES": f"{UUID_B}"})
    fake = sys.modules["pynvml"]
    monkeypatch.setattr(fake, "nvmlDeviceGetHandleByUUID",
                        lambda uuid: asked.append(uuid) or uuid)
    info = describe(torch.device("cuda", 0))
    assert asked and set(asked) == {UUID_B}
    assert info.total_memory_bytes == 80 * 2**30 and not info.mig


def test_a_mig_slice_has_no_whole_gpu_figures(nvml) -> None:
    nvml({"CUDA_VISIBLE_DEVICES": MIG_B})
    info = describe(torch.device("cuda", 0))
    assert info.mig
    assert info.name.endswith("MIG 1g.10gb")
    assert info.total_memory_bytes is None  # the trial's own mem_get_info says it
    assert info.bf16 and info.tf32


def test_a_gpu_in_mig_mode_counts_as_a_slice(nvml) -> None:
    nvml({"CUDA_VISIBLE_DEVICES": "1"}, mig_mode_on={UUID_B})
    info = describe(torch.device("cuda", 0))
    assert info.mig and info.total_memory_bytes is None


# --- cores for parallel trials ------------------------------------------------------------------

@pytest.mark.parametrize("parts", [1, 2, 3])
def test_parallel_trials_get_disjoint_shares_of_the_cores(parts) -> None:
    shares = core_shares(parts)
    assert len(shares) == parts and all(shares)
    everything = [cpu for share in shares for cpu in share]
    if parts <= usable_cpus():
        assert sorted(everything) == sorted(set(everything))
        assert len(everything) == usable_cpus()


def test_more_trials_than_cores_still_get_one_core_each() -> None:
    shares = core_shares(usable_cpus() + 1)
    assert all(len(share) == 1 for share in shares)


# --- why a device refuses a configuration ----------------------------------------------------

def test_a_refusal_names_the_knob_at_fault_once_then_the_devices_reason():
    info = describe(torch.device("cpu"))
    fp8 = TrainConfig(precision="fp8_tensorwise", compile_mode="default")
    reason = unsupported_reason(fp8, info)
    assert reason.startswith("precision=fp8_tensorwise: float8 training needs a CUDA GPU of "
                             "compute capability 8.9+")
    assert reason.count("fp8_tensorwise") == 1
    # the reason alone, for a caller that names the value itself
    assert value_reason("precision", "fp8_tensorwise", info) == reason.split(": ", 1)[1]
    assert value_reason("compile_mode", "reduce-overhead", info) == \
        "compile modes that capture CUDA graphs need a CUDA device"
    # a knob the value needs, at fault instead, is named
    v100 = DeviceInfo(type="cuda", index=0, name="Tesla V100-SXM2-16GB",
                      total_memory_bytes=16 * 2**30, cpu_count=8, bf16=False, tf32=False,
                      fused_adamw=False, cuda_graphs=True)
    assert value_reason("fsdp_reduce_dtype", "bf16", v100) == \
        "precision=bf16: Tesla V100-SXM2-16GB has no bf16 support"


def test_a_missing_library_is_named_only_where_the_device_would_run_the_value(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # an environment without torchao
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    cpu = describe(torch.device("cpu"))
    # installing torchao would not help a CPU: the device's reason is the one given
    on_cpu = value_reason("precision", "fp8_tensorwise", cpu)
    assert "compute capability 8.9" in on_cpu and "pip install" not in on_cpu
    h100 = DeviceInfo(type="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                      total_memory_bytes=80 * 2**30, cpu_count=16, bf16=True, tf32=True,
                      fused_adamw=True, cuda_graphs=True, fp8=True)
    assert value_reason("precision", "fp8_rowwise", h100) == \
        "float8 training is torchao's: pip install torchao"
    # eager float8 cannot run with torchao either: that is the reason given
    eager = unsupported_reason(TrainConfig(precision="fp8_rowwise"), h100)
    assert "runs compiled only" in eager and "pip install" not in eager
    # no device refuses 8-bit AdamW: the library is what it lacks
    assert value_reason("optimizer", "adamw_8bit", cpu).endswith("pip install bitsandbytes")


def test_flash_and_cudnn_attention_are_offered_in_half_precision_and_refused_in_fp32() -> None:
    """On the H100 and the H200 the probe left flash and cuDNN attention out of every fp32
    BASELINE's study ("No available kernel"), though they ran in bf16 (540 and 472 samples/s
    on the H200). On CUDA they are a value of the space (asked in bf16), and a configuration
    that pairs them with a 32-bit precision is refused before it runs; on CPU flash runs in
    any precision."""
    h200 = DeviceInfo(type="cuda", index=0, name="NVIDIA H200", total_memory_bytes=140 * 2**30,
                      cpu_count=16, bf16=True, tf32=True, fused_adamw=True, cuda_graphs=True,
                      fp8=True)
    for kernel in ("flash", "cudnn"):
        assert value_reason("attention_backend", kernel, h200) is None
        assert unsupported_reason(TrainConfig(attention_backend=kernel, precision="bf16"),
                                  h200) is None
        assert unsupported_reason(TrainConfig(attention_backend=kernel), h200) == \
            f"attention_backend={kernel}: {kernel} attention has CUDA kernels for fp16 and " \
            "bf16 only"
    assert unsupported_reason(TrainConfig(attention_backend="efficient"), h200) is None
    assert unsupported_reason(TrainConfig(attention_backend="flash"),
                              describe(torch.device("cpu"))) is None
