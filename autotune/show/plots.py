"""Figures for the HTML study report and the profile command, as PNG bytes.

Built on matplotlib's object API (no pyplot), so drawing touches no global state and needs no GUI.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

from autotune.study.records import TrialRecord
from autotune.study.summary import CompileRow
from autotune.trial.protocol import TrialStatus as S

PRECISION_COLORS = {"fp32": "#4c72b0", "tf32": "#55a868", "bf16": "#dd8452", "fp16": "#c44e52"}
_OTHER_COLOR = "#7f7f7f"
_CHECKPOINT_MARKERS = {"none": "o", "selective": "s", "full": "^"}
_CATEGORY_COLORS = {
    "parameter": "#4c72b0", "optimizer_state": "#dd8452", "activation": "#55a868",
    "gradient": "#c44e52", "temporary": "#8172b3", "input": "#937860",
    "autograd_detail": "#da8bc3", "unknown": "#8c8c8c", "allocated": "#4c72b0",
}
_EXTRA_COLORS = ("#ccb974", "#64b5cd", "#1b9e77", "#e7298a", "#66a61e", "#a6761d")
_EVALUATOR_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
_GIB = 1024 ** 3
_MIB = 1024 ** 2
_DPI = 110
_NO_TRIALS = "no measured trials"
# Outcomes with no rate, drawn in a strip below the rates.
_STRIP = (S.OOM, S.OOM_PREDICTED, S.UNSUPPORTED)


def _to_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            color="#555555", fontsize="large")
    ax.set_xticks([])
    ax.set_yticks([])


def _num(value: Any) -> float | None:
    """A finite float, or None for missing, non-numeric, boolean or non-finite values."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _micro_batch(record: TrialRecord) -> int | None:
    return record.config.micro_batch_size if record.config else None


def _precision(record: TrialRecord) -> str:
    return record.config.precision if record.config else "other"


def _color(precision: str) -> str:
    return PRECISION_COLORS.get(precision, _OTHER_COLOR)


def _fresh(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Records that were actually run or decided on, not reused repeats of earlier trials."""
    return [r for r in records if not r.duplicate]


def _precision_order(precisions: Iterable[str]) -> list[str]:
    present = set(precisions)
    known = [p for p in PRECISION_COLORS if p in present]
    return known + sorted(present - set(known))


def _log2_axis(ax: Axes, values: Iterable[int]) -> None:
    ticks = sorted(set(values))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)


def _memory_unit(largest_bytes: float) -> tuple[float, str]:
    return (_GIB, "GiB") if largest_bytes >= _GIB else (_MIB, "MiB")


def _precision_handles(precisions: Iterable[str]) -> list[Line2D]:
    return [Line2D([], [], color=_color(p), marker="o", linestyle="-", label=p)
            for p in _precision_order(precisions)]


def _legend_outside(ax: Axes, handles: list[Any]) -> None:
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize="small", frameon=False)


def throughput_vs_micro_batch(records: Sequence[TrialRecord]) -> bytes:
    """Samples/sec against micro-batch size per precision; trials without a rate in a strip."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Samples/sec vs micro-batch size")
    ok: list[tuple[str, int, float]] = []
    over: list[tuple[str, int, float]] = []
    strip: list[tuple[str, int, str]] = []
    for record in _fresh(records):
        mbs, status = _micro_batch(record), record.status
        if mbs is None:
            continue
        sps = _num(record.samples_per_sec)
        if status == S.OK and sps is not None:
            ok.append((_precision(record), mbs, sps))
        elif status == S.OVER_MEMORY and sps is not None:
            over.append((_precision(record), mbs, sps))
        elif status in _STRIP:
            strip.append((_precision(record), mbs, status))
    if not (ok or over or strip):
        _empty(ax, _NO_TRIALS)
        return _to_png(fig)

    precisions = _precision_order(p for p, _, _ in ok + over + strip)
    for precision in precisions:
        color = _color(precision)
        points = [(m, s) for p, m, s in ok if p == precision]
        if points:
            ax.scatter([m for m, _ in points], [s for _, s in points], color=color, s=30,
                       alpha=0.8, zorder=3)
            best: dict[int, float] = {}
            for m, s in points:
                best[m] = max(s, best.get(m, s))
            sizes = sorted(best)
            ax.plot(sizes, [best[m] for m in sizes], color=color, linewidth=1.5, zorder=2)
        hollow = [(m, s) for p, m, s in over if p == precision]
        if hollow:
            ax.scatter([m for m, _ in hollow], [s for _, s in hollow], marker="^",
                       facecolors="none", edgecolors=color, s=45, linewidths=1.3, zorder=3)

    # Trials without a throughput sit in a strip below zero, nudged apart per precision.
    for index, precision in enumerate(precisions):
        color = _color(precision)
        nudge = 2 ** (0.08 * (index - (len(precisions) - 1) / 2))
        styles = {
            S.OOM: {"marker": "x", "color": color},
            S.OOM_PREDICTED: {"marker": "D", "facecolors": "none", "edgecolors": color},
            S.UNSUPPORTED: {"marker": "s", "facecolors": "#bbbbbb", "edgecolors": color},
        }
        for status, style in styles.items():
            sizes = [m * nudge for p, m, s in strip if p == precision and s == status]
            if sizes:
                ax.scatter(sizes, [0.035] * len(sizes), s=35, linewidths=1.2, zorder=3,
                           transform=ax.get_xaxis_transform(), **style)

    top = max((s for _, _, s in ok + over), default=1.0) * 1.08
    ax.set_ylim(-0.1 * top, top)
    if not (ok or over):  # only the strip: the rate axis has no scale to show
        ax.set_yticks([])
    ax.axhline(0, color="#cccccc", linewidth=0.8, zorder=1)
    _log2_axis(ax, [m for _, m, _ in ok + over + strip])
    ax.set_xlabel("micro-batch size")
    ax.set_ylabel("samples/sec")
    ax.grid(True, alpha=0.3)

    kinds = [
        (bool(ok), Line2D([], [], color="black", marker="o", linestyle="",
                          label="measured (fits)")),
        (bool(over), Line2D([], [], color="black", marker="^", markerfacecolor="none",
                            linestyle="", label="over memory (ran, does not fit)")),
        (any(s == S.OOM for *_, s in strip),
         Line2D([], [], color="black", marker="x", linestyle="", label="out of memory")),
        (any(s == S.OOM_PREDICTED for *_, s in strip),
         Line2D([], [], color="black", marker="D", markerfacecolor="none", linestyle="",
                label="predicted OOM (not run)")),
        (any(s == S.UNSUPPORTED for *_, s in strip),
         Line2D([], [], color="black", marker="s", markerfacecolor="#bbbbbb", linestyle="",
                label="unsupported")),
    ]
    _legend_outside(ax, _precision_handles(precisions) + [h for shown, h in kinds if shown])
    return _to_png(fig)


def memory_vs_micro_batch(records: Sequence[TrialRecord], capacity_bytes: int | None,
                          limit_bytes: int | None) -> bytes:
    """Peak memory against micro-batch size, with the device capacity and the allowed limit."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Peak memory vs micro-batch size")
    capacity, limit = _num(capacity_bytes), _num(limit_bytes)
    points: list[tuple[str, str, int, float, bool]] = []
    ooms: list[tuple[str, int]] = []
    for record in _fresh(records):
        mbs, status = _micro_batch(record), record.status
        if mbs is None:
            continue
        peak = _num(record.peak_memory_bytes)
        if status in (S.OK, S.OVER_MEMORY) and peak is not None:
            checkpointing = record.config.activation_checkpointing
            points.append((_precision(record), checkpointing, mbs, peak, status == S.OK))
        elif status == S.OOM:
            ooms.append((_precision(record), mbs))
    if not (points or ooms):
        _empty(ax, _NO_TRIALS)
        return _to_png(fig)

    peaks = [peak for *_, peak, _ in points]
    scale, unit = _memory_unit(max(peaks + [v for v in (capacity, limit) if v is not None]
                                   + [0.0]))
    for precision, checkpointing, mbs, peak, fits in points:
        color = _color(precision)
        ax.scatter([mbs], [peak / scale], marker=_CHECKPOINT_MARKERS.get(checkpointing, "D"),
                   facecolors=color if fits else "none", edgecolors=color, s=40,
                   linewidths=1.2, alpha=0.85, zorder=3)
    lines: list[Any] = []
    if capacity is not None:
        lines.append(ax.axhline(capacity / scale, color="black", linewidth=1.4,
                                label="device capacity"))
    if limit is not None:
        lines.append(ax.axhline(limit / scale, color="black", linewidth=1.2, linestyle="--",
                                label="allowed (headroom)"))
    oom_y = capacity if capacity is not None else max(peaks, default=limit)
    if oom_y is None:  # no memory figure at all: the OOM marks float at the top, unscaled
        ax.set_yticks([])
    for precision in _precision_order(p for p, _ in ooms):
        sizes = [m for p, m in ooms if p == precision]
        if oom_y is None:
            ax.scatter(sizes, [0.9] * len(sizes), marker="x", color=_color(precision), s=50,
                       transform=ax.get_xaxis_transform(), zorder=4)
        else:
            ax.scatter(sizes, [oom_y / scale] * len(sizes), marker="x",
                       color=_color(precision), s=50, zorder=4)

    _log2_axis(ax, [m for *_, m, _, _ in points] + [m for _, m in ooms])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("micro-batch size")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.grid(True, alpha=0.3)
    used_checkpointing = {c for _, c, *_ in points}
    shapes = [Line2D([], [], color="black", marker=_CHECKPOINT_MARKERS.get(c, "D"), linestyle="",
                     label=f"checkpointing: {c}") for c in sorted(used_checkpointing)]
    extra = []
    if any(not fits for *_, fits in points):
        extra.append(Line2D([], [], color="black", marker="o", markerfacecolor="none",
                            linestyle="", label="over memory (hollow)"))
    if ooms:
        extra.append(Line2D([], [], color="black", marker="x", linestyle="",
                            label="out of memory"))
    precisions = [p for p, *_ in points] + [p for p, _ in ooms]
    _legend_outside(ax, _precision_handles(precisions) + shapes + extra + lines)
    return _to_png(fig)


def _draw_best(ax: Axes, trials: list[tuple[float, float | None]], color: str) -> bool:
    """Step line of the running best along ordered (x, score or None) pairs, each score a dot."""
    scored = [(x, score) for x, score in trials if score is not None]
    if not scored:
        return False
    xs, best, current = [], [], None
    for x, score in trials:
        if score is not None and (current is None or score > current):
            current = score
        xs.append(x)
        best.append(math.nan if current is None else current)  # NaN: no line before the first
    ax.step(xs, best, where="post", color=color, linewidth=1.8, label="best so far")
    ax.scatter([x for x, _ in scored], [s for _, s in scored], color=color, alpha=0.3, s=18,
               label="trial score")
    ax.set_ylabel("score (samples/sec)")
    ax.grid(True, alpha=0.3)
    return True


def _ok_score(record: TrialRecord) -> float | None:
    return _num(record.score) if record.status == S.OK else None


def best_so_far(records: Sequence[TrialRecord]) -> bytes:
    """Best score so far, by trial number (left) and by minutes of wall time (right)."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    by_number, by_time = fig.subplots(1, 2)
    by_number.set_title("Best so far by trial")
    by_time.set_title("Best so far by wall time")
    fresh = _fresh(records)

    numbered = sorted(fresh, key=lambda r: r.number)
    if _draw_best(by_number, [(r.number, _ok_score(r)) for r in numbered], "#4c72b0"):
        by_number.set_xlabel("trial number")
        by_number.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_number.legend(loc="best", fontsize="small")
    else:
        _empty(by_number, _NO_TRIALS)

    ended = sorted((r for r in fresh if r.end is not None), key=lambda r: r.end)
    starts = [r.start for r in fresh if r.start is not None]
    origin = min(starts, default=ended[0].end if ended else None)
    timed = [((r.end - origin) / 60, _ok_score(r)) for r in ended]
    if _draw_best(by_time, timed, "#55a868"):
        by_time.set_xlim(left=0)
        by_time.set_xlabel("wall time (minutes since the first trial started)")
    else:
        _empty(by_time, "no finished trials with a time")
    return _to_png(fig)


def importance_bars(importances: dict[str, dict[str, float]]) -> bytes:
    """Grouped horizontal bars of each parameter's importance, one colour per evaluator."""
    cleaned = {
        str(name): {str(p): v for p, v in ((p, _num(v)) for p, v in values.items())
                    if v is not None}
        for name, values in (importances or {}).items() if isinstance(values, Mapping)
    }
    evaluators = [name for name, values in cleaned.items() if values]
    params: set[str] = set().union(*(cleaned[name] for name in evaluators))
    fig = Figure(figsize=(7, max(3.0, 1.5 + 0.3 * len(params) * max(1, len(evaluators)))),
                 layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Parameter importance")
    if not params:
        _empty(ax, "no importance data")
        return _to_png(fig)

    first = cleaned[evaluators[0]]
    # Bars are drawn bottom-up: reverse the ranking so that the most important ends up on top.
    order = sorted(params, key=lambda p: (-first.get(p, -math.inf), p))[::-1]
    height = 0.8 / len(evaluators)
    for index, name in enumerate(evaluators):
        offset = ((len(evaluators) - 1) / 2 - index) * height
        ax.barh([y + offset for y in range(len(order))],
                [cleaned[name].get(p, 0.0) for p in order], height=height * 0.95,
                color=_EVALUATOR_COLORS[index % len(_EVALUATOR_COLORS)], label=name)
    ax.set_yticks(range(len(order)), labels=order)
    largest = max(v for name in evaluators for v in cleaned[name].values())
    ax.set_xlim(0, max(1.0, largest * 1.05))
    ax.set_xlabel("importance (share of explained variance)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return _to_png(fig)


def compile_payoff(rows: Sequence[CompileRow]) -> bytes:
    """Extra start-up time of compiling against the steady-state gain it buys, with break-even."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Compile time vs steady-state gain")
    points = []
    for row in rows:
        cost, gain = _num(row.compile_s), _num(row.gain)
        if cost is not None and gain is not None:
            points.append((row.label, cost, gain * 100, _num(row.break_even_steps)))
    if not points:
        _empty(ax, "no compile measurements")
        return _to_png(fig)

    scale, unit = (60.0, "min") if max(c for _, c, _, _ in points) >= 120 else (1.0, "s")
    ax.axhline(0, color="black", linewidth=1.0)
    for label, cost, gain, steps in points:
        color = "#c44e52" if steps is None else "#55a868"
        ax.scatter([cost / scale], [gain], color=color, s=45, zorder=3)
        verdict = "never pays off" if steps is None else f"pays off after {steps:,.0f} steps"
        ax.annotate(f"{label}\n{verdict}" if label else verdict, (cost / scale, gain),
                    xytext=(6, 6), textcoords="offset points", fontsize="small")
    ax.margins(x=0.25, y=0.2)
    ax.set_xlabel(f"extra start-up time from compiling ({unit})")
    ax.set_ylabel("steady-state gain (%)")
    ax.grid(True, alpha=0.3)
    return _to_png(fig)


def memory_timeline(times_s: list[float], series: dict[str, list[int]],
                    title: str = "Memory timeline") -> bytes:
    """Stacked memory in use over time (measured from the first sample), one band per category."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    times = [_num(t) for t in times_s or []]
    bands = {
        str(name): [_num(v) or 0.0 for v in values]
        for name, values in (series or {}).items()
        if isinstance(values, (list, tuple)) and any(_num(v) for v in values)
    }
    # Samples without a time, or beyond the shortest band, cannot be placed.
    length = min([len(times)] + [len(values) for values in bands.values()])
    keep = sorted((i for i in range(length) if times[i] is not None), key=lambda i: times[i])
    bands = {name: [values[i] for i in keep] for name, values in bands.items()
             if any(values[i] for i in keep)}
    if not keep or not bands:
        _empty(ax, "no memory samples")
        return _to_png(fig)

    start = times[keep[0]]
    span = times[keep[-1]] - start
    time_scale, time_unit = (1000.0, "ms") if span < 2 else (1.0, "s")
    xs = [(times[i] - start) * time_scale for i in keep]
    total = max(sum(values[i] for values in bands.values()) for i in range(len(keep)))
    scale, unit = _memory_unit(total)
    extra = iter(_EXTRA_COLORS * (len(bands) // len(_EXTRA_COLORS) + 1))
    colors = [_CATEGORY_COLORS.get(name) or next(extra) for name in bands]
    heights = [[v / scale for v in values] for values in bands.values()]
    if len(xs) == 1:  # a single sample has no area: show it as one stacked bar
        bottom = 0.0
        for color, (value,) in zip(colors, heights):
            ax.bar(xs, [value], bottom=bottom, color=color, width=0.6)
            bottom += value
        ax.set_xticks(xs)
    else:
        ax.stackplot(xs, *heights, colors=colors, alpha=0.85)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_ylabel(f"memory in use ({unit})")
    ax.grid(True, alpha=0.3)
    # Top band first, as the stack reads.
    _legend_outside(ax, [Patch(color=color, alpha=0.85, label=name)
                         for name, color in reversed(list(zip(bands, colors)))])
    return _to_png(fig)
