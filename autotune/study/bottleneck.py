"""Where a measured step's time goes, in words: the shares an engineer reads off a profile, the
knobs each points to, and the one that dominates.

From one trial's `Measurement`: waiting for data (the timed window's own share), the optimizer's
step, host syncs, per-operator overhead (launch-bound kernels, or tiny CPU operators: the
profile's `launch_bound` finding) and the rest, forward and backward; on CUDA the share the
device sat idle and the kernels a step launches; the operators' time by kind of work (matmuls,
attention, elementwise...: where an MFU short of the roofline goes); and the memory left at the
peak. The search measures the dominant share's knobs
first (`search/expert`), the run prints the baseline's diagnosis after its trial, and the verdict
says what the answer did to the dominant share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.trial.protocol import Measurement, WorkKind

DATA_WAIT = "data_wait"
OPTIMIZER = "optimizer"
OVERHEAD = "overhead"
HOST_SYNC = "host_sync"
COMPUTE = "compute"
MEMORY = "memory"  # not a share of the step: the memory left, which a larger micro-batch uses
# A share of the step this large is worth fixing first; a share this small is not named.
DOMINANT = 0.25
NAMED = 0.05
# Memory this free at the peak points to a larger micro-batch.
ROOMY = 0.5

# The knobs each kind points to, the cheapest trial first; host syncs are the model's own code.
KNOBS: dict[str, tuple[str, ...]] = {
    DATA_WAIT: ("num_workers",),
    OPTIMIZER: ("optimizer_impl",),
    OVERHEAD: ("micro_batch_size", "compile_mode"),
    HOST_SYNC: (),
    COMPUTE: ("precision", "compile_mode"),
    MEMORY: ("micro_batch_size",),
}
_WORDS = {DATA_WAIT: "waiting for data", OPTIMIZER: "the optimizer step",
          OVERHEAD: "per-operator overhead", HOST_SYNC: "host syncs",
          COMPUTE: "forward and backward"}
_FIXES = {DATA_WAIT: "DataLoader workers", OPTIMIZER: "a fused or foreach AdamW",
          OVERHEAD: "a larger micro-batch, torch.compile",
          HOST_SYNC: "fewer .item()/.cpu() reads in your code",
          COMPUTE: "bf16, torch.compile", MEMORY: "a larger micro-batch"}
# The kinds a knob can fix, in the order a bottleneck is looked for.
FIXABLE = (DATA_WAIT, OPTIMIZER, OVERHEAD)


@dataclass(frozen=True)
class Share:
    """One part of the step: what it is and its share of the step's wall time."""

    kind: str
    fraction: float

    @property
    def words(self) -> str:
        return _WORDS[self.kind]


@dataclass(frozen=True)
class Diagnosis:
    """A step's shares (largest first), the device's idle share (CUDA), the memory left, and
    its operators' time by kind of work (largest first) with the kernels a step launches (CUDA)."""

    shares: tuple[Share, ...]
    device_idle: float | None = None
    memory_free: float | None = None  # share of the memory limit free at the step's peak
    work: tuple[tuple[WorkKind, float], ...] = ()
    kernels_per_step: float | None = None
    larger_batch: bool = True  # whether the search space holds a larger micro-batch

    @property
    def roomy(self) -> bool:
        """Whether the memory left points to a larger micro-batch: free enough, and one the
        space holds (a fixed global batch of 16 x 1 holds none)."""
        return self.memory_free is not None and self.memory_free >= ROOMY and self.larger_batch

    def share(self, kind: str) -> float | None:
        return next((s.fraction for s in self.shares if s.kind == kind), None)

    @property
    def dominant(self) -> str | None:
        """The kind to fix first: the largest fixable share of at least `DOMINANT`, else the
        memory where it is roomy, else None (no single bottleneck)."""
        fixable = [s for s in self.shares if s.kind in FIXABLE and s.fraction >= DOMINANT]
        if fixable:
            return max(fixable, key=lambda s: s.fraction).kind
        return MEMORY if self.roomy else None

    def to_fix(self) -> tuple[str, ...]:
        """The kinds worth a fix, in the order an engineer takes them: each fixable share of at
        least `DOMINANT`, the largest first, then the memory where it is roomy."""
        kinds = [s.kind for s in sorted(self.shares, key=lambda s: -s.fraction)
                 if s.kind in FIXABLE and s.fraction >= DOMINANT]
        if self.roomy:
            kinds.append(MEMORY)
        return tuple(kinds)

    def first_knobs(self) -> tuple[str, ...]:
        """The knobs an engineer tries first, the dominant kind's first, then the other
        fixable shares' by size."""
        kinds = [self.dominant] if self.dominant else []
        kinds += [s.kind for s in self.shares if s.kind in FIXABLE and s.fraction >= NAMED
                  and s.kind not in kinds]
        return tuple(dict.fromkeys(k for kind in kinds for k in KNOBS[kind]))

    def describe(self, first: bool = True) -> str:
        """In words: each named share with what it points to, the idle device, the memory,
        and (`first`) what an engineer fixes first."""
        largest = self.shares[0].kind if self.shares else None
        parts = [f"{s.words} {s.fraction:.0%}{self._pointer(s, largest)}"
                 for s in self.shares if s.fraction >= NAMED]
        text = ", ".join(parts) or "no share of the step stands out"
        if self.device_idle is not None:
            text += f"; the GPU idle {self.device_idle:.0%} of it"
        if self.memory_free is not None:
            text += f"; {self.memory_free:.0%} of the memory free at the peak"
            if self.dominant == MEMORY:
                text += f" (-> {_FIXES[MEMORY]})"
            elif self.memory_free >= ROOMY and not self.larger_batch:
                text += (" (the space holds no larger micro-batch: --free-batch-size MIN:MAX "
                         "lets your global batch change)")
        if not first:
            return text
        if self.dominant is None:
            return f"{text}. No single bottleneck: the usual fast settings first"
        return f"{text}. {_WORDS.get(self.dominant, 'the unused memory').capitalize()} first"

    def describe_work(self) -> str | None:
        """Where the operators' time goes, by kind of work (each named one of at least
        `NAMED`), with the kernels a step launches; None without a profile's kinds."""
        named = [f"{kind.words} {fraction:.0%}" for kind, fraction in self.work
                 if fraction >= NAMED]
        if not named:
            return None
        whose = "GPU time" if self.device_idle is not None else "operator time"
        text = f"{whose}: {', '.join(named)}"
        if self.kernels_per_step is not None:
            text += f"; {self.kernels_per_step:,.0f} kernels a step"
        return text

    def _pointer(self, share: Share, largest: str | None) -> str:
        """What a share points to, where it is worth saying: a fixable share that dominates,
        host syncs (the model's own code), the largest share where it is forward and
        backward."""
        if (share.kind in FIXABLE and share.fraction >= DOMINANT) or share.kind == HOST_SYNC \
                or (share.kind == COMPUTE and share.kind == largest):
            return f" (-> {_FIXES[share.kind]})"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {"shares": {s.kind: s.fraction for s in self.shares},
                "device_idle": self.device_idle, "memory_free": self.memory_free,
                "dominant": self.dominant, "work": {k.value: v for k, v in self.work},
                "kernels_per_step": self.kernels_per_step, "larger_batch": self.larger_batch}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Diagnosis:
        return cls(tuple(Share(k, v) for k, v in data["shares"].items()),
                   data.get("device_idle"), data.get("memory_free"),
                   tuple((WorkKind(k), v) for k, v in (data.get("work") or {}).items()),
                   data.get("kernels_per_step"), data.get("larger_batch", True))


def holds_larger_batch(micro_batches: Sequence[int] | None, micro_batch: int) -> bool:
    """Whether a search space's micro-batches (None: not known) hold one larger than
    `micro_batch`, for the memory left to point to (`Diagnosis.larger_batch`)."""
    return not micro_batches or max(micro_batches) > micro_batch


def diagnose(m: Measurement, memory_limit_bytes: int | None,
             larger_batch: bool = True) -> Diagnosis | None:
    """The shares of one measured step, or None for a measurement without a profile (a
    screened trial, `--profile-steps 0`). The profiled steps fetch their batches ahead, so the
    profile's shares divide the step less its data wait. `larger_batch`: whether the search
    space holds a micro-batch larger than the step's, for the memory left to point to."""
    if not m.step_time_median_s or m.host_syncs_per_step is None:
        return None
    wait = min(1.0, m.data_wait_fraction or 0.0)
    rest = 1.0 - wait
    optimizer = min(rest, (m.optimizer_fraction or 0.0) * rest)
    sync = min(rest - optimizer, (m.host_sync_s_per_step or 0.0) / m.step_time_median_s)
    launch = next((f.share for f in m.findings if f.kind == "launch_bound"), 0.0)
    overhead = min(rest - optimizer - sync, launch * rest)
    compute = max(0.0, rest - optimizer - sync - overhead)
    shares = sorted((Share(DATA_WAIT, wait), Share(OPTIMIZER, optimizer),
                     Share(HOST_SYNC, sync), Share(OVERHEAD, overhead),
                     Share(COMPUTE, compute)), key=lambda s: s.fraction, reverse=True)
    free = None
    if memory_limit_bytes and m.peak_memory_bytes:
        free = max(0.0, 1.0 - m.peak_memory_bytes / memory_limit_bytes)
    return Diagnosis(tuple(shares), m.device_idle_fraction, free,
                     tuple((m.work_shares or {}).items()), m.kernels_per_step, larger_batch)


def before_and_after(before: Diagnosis, after: Diagnosis | None) -> str | None:
    """The dominant share of the user's step and of the answer's, in words ("waiting for data
    was 71% of your step; with the answer it is 6%"); None without a dominant share or the
    answer's own diagnosis."""
    kind = before.dominant
    if kind is None or after is None:
        return None
    if kind == MEMORY:
        if before.memory_free is None or after.memory_free is None:
            return None
        return (f"your settings left {before.memory_free:.0%} of the memory free at the peak; "
                f"the answer leaves {after.memory_free:.0%}")
    was, now = before.share(kind), after.share(kind)
    if was is None or now is None:
        return None
    return f"{_WORDS[kind]} was {was:.0%} of your step; with the answer it is {now:.0%}"
