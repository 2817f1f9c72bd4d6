"""What a process group can run of the user's model: each DDP and FSDP value that can fail,
tried once in a group of its own before the search, and left out with its reason where it fails.

Each check is a check run through the runner (one step of warm-up, one timed), so a crash or a
collective that hangs is that check's result, never the tuner's. Values are tried where they
bite: with gradient accumulation, whose non-final micro-steps skip the gradient sync (DDP's
`static_graph` with `no_sync()` dies on an internal assert in torch 2.13's reducer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.search.runner import MeasureJob, Runner
from autotune.trial.protocol import LeftOut, TrialStatus

# How much of a failure's message a left-out value keeps.
REASON_CHARS = 300


@dataclass(frozen=True)
class GroupCheck:
    """One value tried, the configuration it is tried in, and what it needs to work first."""

    knob: str
    value: Any
    changes: dict[str, Any]
    needs_fsdp: bool = False


CHECKS = (
    GroupCheck("parallelism", "fsdp", {"parallelism": "fsdp"}),
    GroupCheck("ddp_static_graph", True, {"parallelism": "ddp", "ddp_static_graph": True}),
    GroupCheck("ddp_gradient_as_bucket_view", True,
               {"parallelism": "ddp", "ddp_gradient_as_bucket_view": True}),
    GroupCheck("fsdp_reshard_after_forward", False,
               {"parallelism": "fsdp", "fsdp_reshard_after_forward": False}, needs_fsdp=True),
    GroupCheck("fsdp_reduce_dtype", "bf16",
               {"parallelism": "fsdp", "precision": "bf16", "fsdp_reduce_dtype": "bf16"},
               needs_fsdp=True),
)


def group_left_out(runner: Runner, baseline: TrainConfig, device: str, time_limit_s: float,
                   bf16: bool, on_check: Callable[[str], None] | None = None,
                   allowed: Mapping[str, Sequence[Any]] | None = None) -> list[LeftOut]:
    """The process-group values that fail on this model, each with its reason. A value the
    user's narrowing leaves out (`allowed`: knob -> the values `--fix`/`--space` allow) is
    never searched, so it is not tried: each check is a group's run."""
    left_out: list[LeftOut] = []
    accumulating = baseline.replace(grad_accum_steps=max(2, baseline.grad_accum_steps),
                                    compile_mode="none")
    allowed = allowed or {}
    for check in CHECKS:
        fsdp_fails = any(x.knob == "parallelism" and x.value == "fsdp" for x in left_out)
        if (check.needs_fsdp and fsdp_fails) or \
                (check.changes.get("precision") == "bf16" and not bf16) or \
                any(k in allowed and v not in allowed[k] for k, v in check.changes.items()):
            continue
        if on_check is not None:
            on_check(f"{check.knob}={check.value}")
        config = accumulating.replace(**{**_reset(accumulating), **check.changes})
        result = runner.measure(config, MeasureJob(
            f"group-check-{check.knob}-{check.value}", time_limit_s, device, check_run=True,
            profile=False))
        reason = _reason(result.status, result.message, time_limit_s)
        if reason is not None:
            left_out.append(LeftOut(check.knob, check.value, reason))
    return left_out


def _reset(config: TrainConfig) -> dict[str, Any]:
    """The process-group knobs at their defaults, so each check changes one thing."""
    defaults = TrainConfig()
    return {k: getattr(defaults, k) for k in config.distributed() if k != "parallelism"}


def _reason(status: TrialStatus, message: str, time_limit_s: float) -> str | None:
    """Why a check's value is left out, or None where it ran (or only ran out of memory: the
    search finds a micro-batch that fits)."""
    if status in (TrialStatus.OK, TrialStatus.OOM):
        return None
    text = " ".join(message.split())
    if status == TrialStatus.TIMEOUT:
        return f"a step did not finish within {time_limit_s:g} s in a process group (a " \
               "collective that never completes)"
    if len(text) > REASON_CHARS:
        text = text[:REASON_CHARS] + "..."
    return f"fails with gradient accumulation in a process group ({status}): {text}"
