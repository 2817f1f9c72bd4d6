"""Was the machine busy while a window was timed? Other processes' share of the trial's CPUs,
and on CUDA other processes on the device and its clocks' slowdown reasons.

A timed rate is only worth ranking when nothing else competed for the hardware: on a 2-core
machine one busy process beside a trial that runs two intra-op threads stalls every parallel
region on the thread that lost its core, and the step slows down by far more than the share of
the CPU it lost. So every timed window is bracketed by two samples of the CPU tick counters:

- all processes: the busy ticks of the trial's CPUs (its affinity), from `/proc/stat`, with
  the hypervisor's steal counted as busy (another guest had the core);
- the trial's own: user and system ticks of the trial process and its descendants (DataLoader
  workers, compile workers) from `/proc/<pid>/stat`, with those of exited children that were
  waited for, so a worker that ends inside the window still counts as the trial's.

Their difference over the CPUs' ticks is what other processes took. Ticks are 10 ms samples,
so a short window carries a few ticks of noise either way: `NOISE_TICKS` per CPU are forgiven.
On CUDA, NVML adds the device's other compute processes and the reasons its clocks are held
back (`HW_SLOWDOWNS` disturb; a power cap under full load is the steady state and does not).
Without /proc (not Linux) nothing is measured and no window is flagged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
# /proc/stat ticks a window may be off by, per CPU, from sampling alone.
NOISE_TICKS = 2
# NVML clock-event reasons (nvmlClocksEventReason*): the ones that mean the device ran slower
# than it would have on its own.
HW_SLOWDOWNS = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                0x80: "hw_power_brake"}
OTHER_REASONS = {0x4: "sw_power_cap", 0x10: "sync_boost"}


@dataclass(frozen=True)
class CpuTicks:
    """One reading of the tick counters: every process on `cpus`, and the trial's own."""

    busy: int
    total: int
    own: int


@dataclass
class Contention:
    """What else ran during one window, and whether that makes the window's rate suspect."""

    other_cpu_share: float | None  # other processes' share of the trial's CPUs' time
    cpus: int
    device_other_processes: int | None = None
    device_slowdowns: list[str] = field(default_factory=list)
    disturbed: bool = False

    def describe(self) -> str:
        """One line for progress and logs."""
        parts = []
        if self.other_cpu_share is not None:
            parts.append(f"other processes used {self.other_cpu_share:.0%} of "
                         f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}")
        if self.device_other_processes:
            parts.append(f"{self.device_other_processes} other process(es) on the device")
        if self.device_slowdowns:
            parts.append("device clocks held back: " + ", ".join(self.device_slowdowns))
        return "; ".join(parts) or "not measured"


def same_load(earlier: Contention, later: Contention) -> bool:
    """Two windows disturbed by about the same load (other processes' shares within a factor
    of two of each other, or only the device's other processes in both): a load that was
    there all along, the machine's state, which waiting will not clear."""
    if not (earlier.disturbed and later.disturbed):
        return False
    a, b = earlier.other_cpu_share, later.other_cpu_share
    if a is None or b is None:
        return a is None and b is None
    return similar_shares(a, b)


def similar_shares(a: float, b: float) -> bool:
    """Two loads' shares of the CPUs within a factor of two of each other."""
    return min(a, b) >= 0.5 * max(a, b)


class ContentionProbe:
    """Brackets a window: `start()` before it, `stop()` after, for the trial process `pid`;
    with a `family` (a warm process's tuner), every process under it counts as the trial's:
    the other warm processes, idle between their turns, hold their own context on the device
    and are the confirmation's, not a load beside it."""

    def __init__(self, threshold: float, device: Any = None, pid: int | None = None,
                 family: int | None = None) -> None:
        self.threshold = threshold
        self.pid = pid or os.getpid()
        self.cpus = trial_cpus(self.pid)
        self.root = family or self.pid  # the processes below it are the trial's own
        self.device = device if device is not None and device.type == "cuda" else None
        self._start: CpuTicks | None = None
        self._pids: set[int] = set()
        self._device_pids: set[int] = set()

    def start(self) -> None:
        self._pids = own_pids(self.root)
        self._start = cpu_ticks(self.cpus, self.root, self._pids)
        self._device_pids = _device_pids(self.device) if self.device is not None else set()

    def disturbed_so_far(self) -> bool:
        """A cheap look inside the window (no scan of every process: the trial's processes
        at the start), so that a window already disturbed is not lengthened."""
        now = cpu_ticks(self.cpus, self.root, self._pids)
        share = other_share(self._start, now, len(self.cpus))
        return share is not None and share > self.threshold

    def stop(self) -> Contention:
        end = cpu_ticks(self.cpus, self.root)
        share = other_share(self._start, end, len(self.cpus))
        result = Contention(share, len(self.cpus))
        if self.device is not None:
            pids = self._device_pids | _device_pids(self.device)
            result.device_other_processes = _others_on_device(pids, own_pids(self.root))
            result.device_slowdowns = device_slowdowns(self.device)
        result.disturbed = bool(
            (share is not None and share > self.threshold)
            or result.device_other_processes
            or any(reason in HW_SLOWDOWNS.values() for reason in result.device_slowdowns))
        return result

    def wait_for_quiet(self, limit_s: float, interval_s: float = 0.5) -> bool:
        """Idle until other processes leave the trial's CPUs (and device) quiet for
        `interval_s`; False if that did not happen within `limit_s`."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() + interval_s <= deadline:
            self.start()
            time.sleep(interval_s)
            if not self.stop().disturbed:
                return True
        return False


def other_share(start: CpuTicks | None, end: CpuTicks | None, cpus: int) -> float | None:
    """Other processes' ticks over all ticks of the CPUs between two readings, sampling noise
    forgiven; None without readings."""
    if start is None or end is None or end.total <= start.total:
        return None
    others = (end.busy - start.busy) - (end.own - start.own)
    return max(0, others - NOISE_TICKS * cpus) / (end.total - start.total)


def trial_cpus(pid: int | None = None) -> list[int]:
    """The CPUs the trial may run on (its affinity), all of them where that is unknown."""
    try:
        return sorted(os.sched_getaffinity(pid or 0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_ticks(cpus: Collection[int], pid: int, pids: set[int] | None = None) -> CpuTicks | None:
    """The tick counters now, or None where /proc cannot be read; the trial's own processes
    are `pid` and its descendants, or `pids` where given."""
    try:
        busy, total = _cpu_lines(set(cpus))
        own = sum(_process_ticks(p) for p in (pids if pids is not None else own_pids(pid)))
    except OSError:
        return None
    return CpuTicks(busy, total, own)


def _cpu_lines(cpus: set[int]) -> tuple[int, int]:
    """Busy and total ticks of `cpus` from /proc/stat (steal is busy: another guest ran)."""
    busy = total = 0
    for line in (PROC / "stat").read_text().splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, values[:8])
        work = user + nice + system + irq + softirq + steal
        busy += work
        total += work + idle + iowait
    return busy, total


def own_pids(pid: int) -> set[int]:
    """The trial process and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, []))
    return found


def _process_ticks(pid: int) -> int:
    """utime + stime, and cutime + cstime of the children it waited for."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0
    # Fields after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return sum(int(v) for v in fields[11:15])


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


# -- CUDA (NVML) -----------------------------------------------------------------------------
# Not exercised on CPU-only machines; every call is guarded, and a failure measures nothing.

def _device_handle(device: Any) -> Any:
    import pynvml

    from autotune.hardware import nvml_handle, visible_entry

    pynvml.nvmlInit()
    return nvml_handle(pynvml, visible_entry(device.index or 0, os.environ))


def _device_pids(device: Any) -> set[int]:
    """Processes with a compute context on the device, or nothing without NVML."""
    try:
        import pynvml

        handle = _device_handle(device)
        try:
            return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return set()


def _others_on_device(pids: set[int], own: set[int]) -> int | None:
    """Processes on the device that are not the trial's. In a container NVML reports host
    PIDs, which match none of ours: then one of them is taken to be the trial."""
    if not pids:
        return None
    mine = pids & own
    return len(pids - mine) if mine else max(0, len(pids) - 1)


def device_slowdowns(device: Any) -> list[str]:
    """Why the device's clocks are below their maximum right now (NVML clock-event reasons),
    idle and application-clock settings left out."""
    try:
        import pynvml

        handle = _device_handle(device)
        try:
            reader = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            mask = int(reader(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return []
    names = {**HW_SLOWDOWNS, **OTHER_REASONS}
    return [name for bit, name in sorted(names.items()) if mask & bit]
