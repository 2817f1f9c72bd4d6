"""The search space of the Optuna study: what to try, limited to what this device can run.

Every knob gets a domain (the values a trial may take): the values `domains.device_domains`
offers on this device (those `hardware` says it runs), the baseline's own among them, narrowed by
the user's `--fix` and `--space`. The batch knobs follow one of two rules:

- fixed effective batch (the default): micro_batch_size ranges over the divisors of the
  effective batch G and grad_accum_steps = G // micro_batch_size is derived, not searched, so
  the tuned run trains the same model as the baseline;
- free batch (`--free-batch-size MIN:MAX`): grad_accum_steps is an Optuna integer parameter
  whose range depends on the micro-batch, keeping MIN <= micro * accum <= MAX.

Optuna parameter names are the knob names. A categorical's choices are the same tuple in every
trial (Optuna refuses choices that change within a study); only grad_accum_steps's integer range
varies. Under float8, which runs compiled only, `compile_mode=none` is read as the first
compiled mode the space has (without one, float8 is not offered). A knob that means something
only given others (`config.CONDITIONS`: prefetch_factor under workers, the DDP knobs under ddp,
the FSDP knobs under fsdp, the AdamW implementations under AdamW) is asked for only there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.config import (
    CONDITIONS,
    DISTRIBUTED_KNOBS,
    FP8_PRECISIONS,
    TrainConfig,
    config_with,
    knob_names,
    parse_value,
    read_yaml,
)
from autotune.errors import AutotuneError, ConfigError
from autotune.hardware import DeviceInfo, value_reason
from autotune.options import DEFAULT_MAX_GRAD_ACCUM
from autotune.search.domains import device_domains, powers_of_two

# Knobs in the order `suggest` asks for them; grad_accum_steps comes last, after the micro-batch
# it depends on. num_workers precedes the knobs it conditions.
_CATEGORICAL = tuple(k for k in knob_names() if k != "grad_accum_steps")

# The knobs that others depend on (`config.CONDITIONS`).
_PARENTS = ("precision", "optimizer", "num_workers", "parallelism")

_Categorical = Callable[[str, Sequence[Any]], Any]
_Integer = Callable[[str, int, int], int]


class SpaceError(ConfigError):
    """Bad --fix/--space/--global-batch-size/--free-batch-size input (exit 2 in the CLI)."""


# Knobs whose order matters to memory and speed: suggested as log-scale integers.
ORDINAL = ("micro_batch_size",)
# Per knob, its values from usually fastest on, when memory allows: half-precision tensor-core
# math, no recomputation, one fused optimizer kernel. The expert's first guess (`fast_corner`).
FAST_FIRST: dict[str, tuple] = {"precision": ("bf16", "fp16", "tf32"),
                                "memory_format": ("channels_last",),
                                "activation_checkpointing": ("none", "selective"),
                                "optimizer_impl": ("fused", "foreach")}


class _Outside(AutotuneError):
    """A configuration value the space does not offer (internal to `params_for`)."""


@dataclass(frozen=True)
class SearchSpace:
    """What the study may try. Build it with `build_space`, which checks everything."""

    domains: dict[str, tuple]            # knob -> allowed values; all knobs but grad_accum_steps
    baseline: TrainConfig
    global_batch: int | None             # fixed mode: micro * accum == global_batch
    batch_range: tuple[int, int] | None  # free mode: MIN <= micro * accum <= MAX
    fixed_grad_accum: int | None = None  # free mode only: grad_accum_steps set by the user
    max_grad_accum: int | None = None    # free mode only: the cap on searched accumulation

    @property
    def free_batch(self) -> bool:
        return self.batch_range is not None

    def accum_range(self, micro: int) -> tuple[int, int]:
        """The grad_accum_steps a micro-batch may pair with (inclusive bounds)."""
        if self.batch_range is None:
            accum = self.global_batch // micro
            return accum, accum
        if self.fixed_grad_accum is not None:
            return self.fixed_grad_accum, self.fixed_grad_accum
        low, high = self.batch_range
        return math.ceil(low / micro), min(high // micro, self.max_grad_accum or high)

    def suggest(self, trial: optuna.trial.BaseTrial) -> TrainConfig:
        """The configuration of one trial, asked of Optuna knob by knob (define-by-run).

        The micro-batch is an integer on a log scale, snapped to the nearest allowed size, not a
        category: TPE then learns that memory grows with it and stops proposing sizes beyond
        the out-of-memory wall, which it cannot infer for unordered categories.
        """
        def choose(knob: str, choices: Sequence[Any]) -> Any:
            if knob in ORDINAL:
                raw = trial.suggest_int(knob, min(choices), max(choices), log=True)
                return min(choices, key=lambda c: (abs(math.log(c / raw)), c))
            return trial.suggest_categorical(knob, list(choices))

        return self._assemble(choose, lambda knob, low, high: trial.suggest_int(knob, low, high))

    def params_for(self, config: TrainConfig) -> dict[str, Any] | None:
        """The Optuna parameters `suggest` turns into `config` (to enqueue it), else None."""
        params: dict[str, Any] = {}

        def categorical(knob: str, choices: Sequence[Any]) -> Any:
            value = getattr(config, knob)
            if value not in choices:
                raise _Outside
            params[knob] = value
            return value

        def integer(knob: str, low: int, high: int) -> int:
            value = getattr(config, knob)
            if not low <= value <= high:
                raise _Outside
            params[knob] = value
            return value

        try:
            rebuilt = self._assemble(categorical, integer)
        except _Outside:
            return None
        # Replaying the walk also checks what is not a parameter: single-valued knobs, the
        # derived grad_accum_steps, the DataLoader knobs that num_workers == 0 switches off.
        return params if rebuilt == config else None

    def fast_corner(self, micro: int) -> TrainConfig:
        """The configuration an expert tries first, at micro-batch `micro`: each knob of
        FAST_FIRST at its first offered value, the others at the baseline's (else their first
        value); in free-batch mode the accumulation nearest the baseline's effective batch."""
        return self._near_baseline(lambda knob: (micro,) if knob == "micro_batch_size"
                                   else FAST_FIRST.get(knob, ()))

    def with_changes(self, changes: Mapping[str, Any]) -> TrainConfig:
        """The baseline with `changes` (knob -> value), the rest as in `fast_corner`: what an
        expert measures to see what one change (or a few) does alone."""
        return self._near_baseline(lambda knob: (changes[knob],) if knob in changes else ())

    def _near_baseline(self, preferred: Callable[[str], Sequence[Any]]) -> TrainConfig:
        """Each knob at its first `preferred` value the space offers, else the baseline's (else
        its first value); the accumulation nearest the baseline's effective batch."""
        base, chosen = self.baseline, {}

        def categorical(knob: str, choices: Sequence[Any]) -> Any:
            offered = [v for v in preferred(knob) if v in choices]
            own = getattr(base, knob)
            chosen[knob] = offered[0] if offered else own if own in choices else choices[0]
            return chosen[knob]

        def integer(knob: str, low: int, high: int) -> int:
            micro = chosen.get("micro_batch_size", self.domains["micro_batch_size"][0])
            target = round(base.micro_batch_size * base.grad_accum_steps / micro)
            return min(max(target, low), high)

        return self._assemble(categorical, integer)

    def contains(self, config: TrainConfig) -> bool:
        return self.params_for(config) is not None

    def grid(self) -> list[TrainConfig]:
        """Every configuration in the space, by walking every branch `suggest` can take."""
        configs = []
        path: list[list[int]] = []  # [index chosen, number of options] per decision, in order
        while True:
            depth = 0

            def pick(knob: str, options: Sequence[Any]) -> Any:
                nonlocal depth
                if depth == len(path):
                    path.append([0, len(options)])
                value = options[path[depth][0]]
                depth += 1
                return value

            configs.append(self._assemble(
                pick, lambda knob, low, high: pick(knob, range(low, high + 1))))
            while path and path[-1][0] + 1 == path[-1][1]:
                path.pop()
            if not path:
                return configs
            path[-1][0] += 1

    def size(self) -> int:
        """How many configurations `grid` holds, without building them (free mode can be vast):
        the knobs that others depend on walked value by value, the rest multiplied."""
        parents = [k for k in _CATEGORICAL if k in _PARENTS]
        conditional = 0
        for chosen in itertools.product(*(self.domains[k] for k in parents)):
            values = dict(zip(parents, chosen))
            conditional += math.prod(len(self.domains[k]) for k, c in CONDITIONS.items()
                                     if c.holds(values))
        others = math.prod(len(self.domains[k]) for k in _CATEGORICAL
                           if k not in ("micro_batch_size", *_PARENTS, *CONDITIONS))
        batches = sum(high - low + 1 for low, high in map(self.accum_range,
                                                          self.domains["micro_batch_size"]))
        return batches * conditional * others

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary, for the study's attributes and the report."""
        return {
            "mode": "free-batch" if self.free_batch else "fixed-effective-batch",
            "global_batch": self.global_batch,
            "batch_range": list(self.batch_range) if self.batch_range else None,
            "domains": {knob: list(values) for knob, values in self.domains.items()},
            # per micro_batch_size, the inclusive [low, high] of grad_accum_steps
            "grad_accum_steps": {str(m): list(self.accum_range(m))
                                 for m in self.domains["micro_batch_size"]},
            "conditional": {knob: f"only when {c.needs}" for knob, c in CONDITIONS.items()},
            "size": self.size(),
            "baseline_in_space": self.contains(self.baseline),
        }

    def _assemble(self, categorical: _Categorical, integer: _Integer) -> TrainConfig:
        """The one walk over the knobs that `suggest`, `params_for` and `grid` share."""
        values: dict[str, Any] = {}
        for knob in _CATEGORICAL:
            domain = self.domains[knob]
            if knob in CONDITIONS and not CONDITIONS[knob].holds(values):
                values[knob] = CONDITIONS[knob].otherwise
            elif len(domain) > 1:
                values[knob] = categorical(knob, domain)
            else:
                values[knob] = domain[0]
        if values["precision"] in FP8_PRECISIONS and values["compile_mode"] == "none":
            values["compile_mode"] = next(m for m in self.domains["compile_mode"] if m != "none")
        low, high = self.accum_range(values["micro_batch_size"])
        if self.free_batch and self.fixed_grad_accum is None:
            values["grad_accum_steps"] = integer("grad_accum_steps", low, high)
        else:
            values["grad_accum_steps"] = low
        return TrainConfig(**values)


def build_space(baseline: TrainConfig, info: DeviceInfo, dataset_size: int, *,
                global_batch: int | None = None, free_batch: tuple[int, int] | None = None,
                fixes: Mapping[str, Any] | None = None,
                space_file: str | Path | None = None,
                max_grad_accum: int = DEFAULT_MAX_GRAD_ACCUM,
                left_out: Mapping[str, Mapping[Any, str]] | None = None,
                world_size: int = 1, convolutional: bool = False,
                attention: bool = False, optimizer_change: bool = False,
                loader_workers: Sequence[int] = ()) -> SearchSpace:
    """The space for `baseline` on `info`'s device, narrowed by `--space` and then `--fix` (a
    fix must be one of the values `--space` lists for its knob).

    Unless the user lists micro-batches or accumulation steps, accumulation is searched only
    up to `max_grad_accum` (the baseline's own is always kept): a step of hundreds of tiny
    micro-batches is never fast and takes minutes to measure. `left_out` (knob -> value ->
    reason, from the capability probe) removes values that fail or are pointless on this model
    and machine, the baseline's own excepted; a `--fix` of one is an error with its reason.
    `loader_workers` (the worker counts the probe timed) adds those beyond the cores that a
    DataLoader waiting on storage was timed with.
    """
    if not _positive_int(dataset_size):
        raise SpaceError(f"the dataset must hold at least one sample, got {dataset_size!r}")

    narrowed = user_values(info, fixes, space_file)
    for knob, value in (fixes or {}).items():
        reason = (left_out or {}).get(knob, {}).get(narrowed[knob][0])
        if reason is not None and narrowed[knob][0] != getattr(baseline, knob):
            raise SpaceError(f"--fix {knob}={value}: left out on this model and machine: "
                             f"{reason}")

    offered = device_domains(baseline, info, world_size, convolutional, attention,
                             optimizer_change)
    offered["num_workers"] = tuple(sorted({*offered["num_workers"], *loader_workers}))
    changed = [v for v in narrowed.get("optimizer", ()) if v not in offered["optimizer"]]
    if changed:
        raise SpaceError(f"optimizer={changed[0]} changes what the model learns (another update "
                         f"rule than the baseline's {baseline.optimizer}): add "
                         "--allow-optimizer-change to try it")
    for knob in DISTRIBUTED_KNOBS:
        refused = [v for v in narrowed.get(knob, ()) if v not in offered[knob]
                   and (knob != "ddp_bucket_cap_mb" or world_size == 1)]
        if refused:
            where = ("a knob of a process group: run with --nproc-per-node N" if world_size == 1
                     else f"{world_size} ranks need ddp or fsdp")
            raise SpaceError(f"{knob}={refused[0]}: {where}")
    domains = {knob: narrowed.get(knob) or offered[knob]
               for knob in _CATEGORICAL if knob != "micro_batch_size"}
    for knob, reasons in (left_out or {}).items():
        kept = tuple(v for v in domains[knob] if v not in reasons or v == getattr(baseline, knob))
        if not kept:
            raise SpaceError(f"every value of {knob} the search could try is left out on this "
                             "model and machine: " + "; ".join(f"{v}: {r}"
                                                               for v, r in reasons.items()))
        domains[knob] = kept
    for knob, condition in CONDITIONS.items():
        if any(condition.holds(dict(zip(_PARENTS, chosen))) for chosen in
               itertools.product(*(domains[k] for k in _PARENTS))):
            continue
        if domains[knob] != (condition.otherwise,) and knob in narrowed:
            raise SpaceError(f"{knob} is narrowed to {list(domains[knob])}, but it means "
                             f"something only when {condition.needs}, which no configuration "
                             f"here has; it is {condition.otherwise}")
        domains[knob] = (condition.otherwise,)

    if domains["compile_mode"] == ("none",):
        domains["precision"] = tuple(p for p in domains["precision"] if p not in FP8_PRECISIONS
                                     or p == baseline.precision)

    micros, accums = narrowed.get("micro_batch_size"), narrowed.get("grad_accum_steps")
    fixed_accum = None
    if free_batch is None:
        target = global_batch if global_batch is not None else baseline.effective_batch_size
        if micros is None and accums is None:
            accums = tuple(a for a in range(target, 0, -1) if target % a == 0 and
                           (a <= max_grad_accum or a == baseline.grad_accum_steps))
        domains["micro_batch_size"] = _fixed_batch_micros(target, dataset_size, micros, accums)
    else:
        if accums is not None and len(accums) > 1:
            raise SpaceError("with --free-batch-size, grad_accum_steps is searched over the "
                             "range each micro-batch allows; fix it to one value or leave it out")
        fixed_accum = accums[0] if accums else None
        candidates = micros or tuple(sorted({*powers_of_two(min(free_batch[1], dataset_size)),
                                             baseline.micro_batch_size}))
        domains["micro_batch_size"] = _free_batch_micros(free_batch, dataset_size, candidates,
                                                         fixed_accum, max_grad_accum)
        target = None
    return SearchSpace(domains={k: domains[k] for k in _CATEGORICAL}, baseline=baseline,
                       global_batch=target, batch_range=free_batch, fixed_grad_accum=fixed_accum,
                       max_grad_accum=max_grad_accum if free_batch else None)


def user_values(info: DeviceInfo, fixes: Mapping[str, Any] | None,
                space_file: str | Path | None) -> dict[str, tuple]:
    """The values the user narrowed the space to (`--space`, then `--fix`: a fix must be one of
    the values the file lists for its knob), typed, each one `info`'s device runs. Nothing here
    needs the probe, so `opening` asks it first: bad input costs no probe."""
    narrowed: dict[str, tuple] = {}
    if space_file is not None:
        for knob, values in load_space_file(space_file).items():
            narrowed[knob] = _supported(knob, values, info, f"{space_file}: ")
    for knob, value in (fixes or {}).items():
        source = f"--fix {knob}={value}"
        if knob not in knob_names():
            raise SpaceError(f"{source}: {_unknown(knob)}")
        fixed = _typed_value(knob, value, source)
        # a fix picks one of the values the space file lists; any other value contradicts it
        if knob in narrowed and fixed not in narrowed[knob]:
            raise SpaceError(f"{source} contradicts {space_file}, which lists {knob}: "
                             f"{list(narrowed[knob])}; fix one of those values or drop one of "
                             "the two")
        narrowed[knob] = _supported(knob, [fixed], info, "--fix ")
    return narrowed


def load_space_file(path: str | Path) -> dict[str, list[Any]]:
    """Read a `--space` YAML file: knob -> list of values (a scalar is a one-value list).

    Values come back typed and valid for the knob; whether this device runs them is
    `build_space`'s question.
    """
    data = read_yaml(path, "space", SpaceError)
    if not isinstance(data, dict) or not data:
        raise SpaceError(f"space file {path} must be a mapping of knob: [values, ...], "
                         f"got {data!r}")
    out: dict[str, list[Any]] = {}
    for knob, values in data.items():
        if knob not in knob_names():
            raise SpaceError(f"space file {path}: {_unknown(knob)}")
        source = f"{path}: {knob}"
        values = values if isinstance(values, list) else [values]
        if not values:
            raise SpaceError(f"{source}: lists no values, which leaves the knob nothing to take")
        out[knob] = [_typed_value(knob, value, source) for value in values]
    return out


def _supported(knob: str, values: Sequence[Any], info: DeviceInfo, where: str) -> tuple:
    """The user's values, in their order without repeats; any the device refuses is an error
    (`where` the user said it: "--fix " or the space file's name)."""
    for value in values:
        reason = value_reason(knob, value, info)
        if reason is not None:
            raise SpaceError(f"{where}{knob}={value}: not on this device: {reason}")
    return tuple(dict.fromkeys(values))


def _fixed_batch_micros(target: int, dataset_size: int, micros: tuple | None,
                        accums: tuple | None) -> tuple[int, ...]:
    """Micro-batch sizes that keep micro * accum == target, within the dataset."""
    rejected = []
    if micros is not None:
        candidates = list(micros)
    elif accums is not None:
        candidates = []
        for accum in accums:
            if target % accum:
                rejected.append(f"grad_accum_steps={accum} does not divide {target}")
            else:
                candidates.append(target // accum)
    else:
        small = [d for d in range(1, math.isqrt(target) + 1) if target % d == 0]
        candidates = sorted({*small, *(target // d for d in small)})
    kept = []
    for micro in candidates:
        if target % micro:
            rejected.append(f"micro_batch_size={micro} does not divide {target}")
        elif micro > dataset_size:
            rejected.append(f"micro_batch_size={micro} is more than the dataset's "
                            f"{dataset_size} samples")
        elif accums is not None and target // micro not in accums:
            rejected.append(f"micro_batch_size={micro} needs grad_accum_steps="
                            f"{target // micro}, not one of {list(accums)}")
        else:
            kept.append(micro)
    if not kept:
        raise SpaceError(f"no micro_batch_size keeps the effective batch at {target}: "
                         + "; ".join(rejected)
                         + " (--global-batch-size or --free-batch-size change the batch)")
    return tuple(kept)


def _free_batch_micros(batch_range: tuple[int, int], dataset_size: int,
                       candidates: Sequence[int], accum: int | None,
                       max_grad_accum: int) -> tuple[int, ...]:
    """Micro-batch sizes for which some grad_accum_steps lands the product in range."""
    low, high = batch_range
    kept, rejected = [], []
    for micro in candidates:
        if micro > dataset_size:
            rejected.append(f"micro_batch_size={micro} is more than the dataset's "
                            f"{dataset_size} samples")
        elif accum is not None and not low <= micro * accum <= high:
            rejected.append(f"micro_batch_size={micro} x grad_accum_steps={accum} = "
                            f"{micro * accum}")
        elif math.ceil(low / micro) > min(high // micro, max_grad_accum):
            rejected.append(f"no grad_accum_steps puts micro_batch_size={micro} x "
                            f"grad_accum_steps in {low}:{high}")
        else:
            kept.append(micro)
    if not kept:
        raise SpaceError(f"no micro_batch_size puts the effective batch in --free-batch-size "
                         f"{low}:{high}: " + "; ".join(rejected))
    return tuple(kept)


def _typed_value(knob: str, value: Any, source: str) -> Any:
    """`value` as the knob's type (text is parsed as `--set` would), valid for the knob."""
    try:
        if isinstance(value, str):
            value = parse_value(knob, value)
        config_with(knob, value)
    except ConfigError as exc:
        problem = str(exc).removeprefix("invalid configuration: ")
        raise SpaceError(f"{source}: {problem}") from None
    return value


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _unknown(knob: Any) -> str:
    return f"unknown knob {str(knob)!r}; the knobs are: {', '.join(knob_names())}"
