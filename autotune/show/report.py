"""What people see in the terminal: rich tables of one measurement, a profile, a study's summary
and its trials, and the same summary as markdown for the study folder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from autotune.config import CHECKS, VERDICT, TrainConfig, numerics_changes
from autotune.formatting import (
    format_bytes,
    format_disturbance,
    format_percent,
    format_rate,
    format_seconds,
    mfu_basis,
    mfu_figure,
    short_config,
)
from autotune.show.export.config_file import yaml_file
from autotune.study.confirmation import WARM_TURNS
from autotune.study.records import TrialRecord
from autotune.study.summary import ProcessGroupFigures, StudySummary
from autotune.target import ModelFile, Script
from autotune.trial.protocol import (
    Finding,
    Measurement,
    OperatorStat,
    ProfileReport,
    TrialResult,
    TrialStatus,
)

# The keys `autotune bench --json` always carries (None where not measurable).
BENCH_KEYS = ("samples_per_sec", "step_time_median_s", "step_time_p90_s", "step_time_cv",
              "step_time_precision", "time_to_first_step_s", "peak_memory_bytes",
              "data_wait_fraction", "host_syncs_per_step", "device_idle_fraction", "mfu",
              "other_cpu_share", "disturbed", "cpu_threads", "cpu_affinity")
# The MFU a tuned dense step reaches on one GPU (llm.c's GPT-2 124M up to ~60% on A100s; Llama-3
# 8B at 57.8% on one H200): short of it, the answer's step is said as the account of the rest.
REACHABLE_MFU = 0.5


def bench_json(result: TrialResult, device: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """`autotune bench --json`: status, config and every figure (None when absent)."""
    config = result.config.to_dict() if result.config else dict(knobs)
    figures = result.measurement.to_json() if result.measurement else {}
    figures.pop("version", None)
    record: dict[str, Any] = {"status": result.status.value, "message": result.message,
                              "device": device, "config": config,
                              **{key: figures.get(key) for key in BENCH_KEYS}}
    record.update({k: v for k, v in figures.items() if k not in record})
    if result.unsupported is not None:
        record.update(unsupported_knob=result.unsupported.knob,
                      unsupported_value=result.unsupported.value,
                      unsupported_together=result.unsupported.together)
    record.update({"log_path": result.log_path, "wall_s": result.wall_s})
    return record


def bench_tables(m: Measurement, device: str, title: str) -> Group:
    """The figures of one measurement, then its top operators."""
    figures = Table(title=title, show_header=False, title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_column("how it was measured", style="dim")
    steady = "steady" if m.steady else "not steady: bound reached"
    rows = [
        ("samples/sec", f"{m.samples_per_sec:.1f}",
         f"{m.window_samples} samples over a {m.window_s:.2f} s window of {m.window_steps} "
         "steps, data loading included"),
        ("step time median", format_seconds(m.step_time_median_s), "per optimizer step"),
        ("step time p90", format_seconds(m.step_time_p90_s), ""),
        ("step time CV", format_percent(m.step_time_cv), "spread of step times"),
        ("median known within", _fmt(m.step_time_precision, "±{:.1%}"),
         "95% interval of the median step time (order statistics)"),
        ("time to first step", format_seconds(m.time_to_first_step_s),
         "compile and loader start-up included"),
        ("set-up", format_seconds(m.setup_s), "model and loader build"),
        ("warm-up steps", str(m.warmup_steps), steady),
        ("peak memory", format_bytes(m.peak_memory_bytes),
         "max reserved by the CUDA allocator" if device.startswith("cuda")
         else "peak RSS of the trial process"),
        ("data wait", format_percent(m.data_wait_fraction), "of the window blocked on loader"),
        ("host syncs/step", _fmt(m.host_syncs_per_step, "{:.1f}"),
         "profiler window after the timed one"),
        ("device idle", format_percent(m.device_idle_fraction), "CUDA only"),
        ("MFU", *mfu_figure(m.mfu, device, mfu_basis(m.flops_per_sample, m.flops_source,
                                                     m.peak_flops, m.peak_flops_source))),
        ("CPU threads", _fmt(m.cpu_threads, "{}"),
         f"intra-op threads, on CPUs {_cpu_list(m.cpu_affinity)}"),
        ("other processes", format_percent(m.other_cpu_share), _contention_how(m)),
    ]
    for row in rows:
        figures.add_row(*row)
    parts: list[Any] = [figures]
    if m.top_operators:
        parts.append(stats_table(m.top_operators, "top operators (profiler window)"))
    if m.findings:
        parts.append(findings_text(m.findings))
    return Group(*parts)


def findings_text(findings: Sequence[Finding]) -> Text:
    """Numbered findings, the costliest first: what, what to do, and where in the code."""
    text = Text("findings (what to fix first)\n", style="bold")
    for i, finding in enumerate(findings, 1):
        text.append(f"{i}. {finding.title}", style="bold yellow")
        text.append(f"  ({finding.share:.0%} of the window)\n", style="dim")
        text.append(f"   {finding.advice}\n")
        for line in finding.where:
            text.append(f"   {line}\n", style="cyan")
    return text


def print_profile(result: ProfileReport, console: Console, title: str) -> None:
    """Everything `autotune profile` found, in the order a performance engineer reads it."""
    console.print(config_table(result.config))
    figures = Table(title=title, show_header=False, title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_column("how it was measured", style="dim")
    window = f"{result.steps} steps, {result.window_s:.3f} s under the profiler"
    for row in (
        ("samples/sec", f"{result.samples_per_sec:.1f}", f"{window} (its overhead included)"),
        ("self CPU total", format_seconds(result.self_cpu_total_s), "all operators"),
        ("self device total", format_seconds(result.self_device_total_s), "CUDA kernels"),
        ("host syncs/step", f"{result.host_syncs_per_step:.1f}", "outside loader/optimizer"),
        ("device idle", format_percent(result.device_idle_fraction), "CUDA only"),
        ("data wait", format_percent(result.data_wait_fraction), "of the window"),
    ):
        figures.add_row(*row)
    console.print(figures)
    for kind, stats in result.tables.items():
        console.print(stats_table(stats, OPERATOR_TABLE_TITLES[kind]))
    if result.findings:
        console.print(findings_text(result.findings))
    else:
        console.print("no finding: nothing above its threshold")
    for name, path in result.files.items():
        console.print(Text(f"{name}: {path}", style="dim"))


def device_line(info: Any) -> str:
    """The first line of a run: where it measures, and on CPU that its numbers are CPU ones."""
    if info.type == "cpu":
        return (f"autotune on cpu: {info.name}, {info.cpu_count} cores, no GPU: these are CPU "
                "numbers (on a GPU the best configuration and its speedup differ)")
    return (f"autotune on {info.torch_device}: {info.name}, "
            f"{format_bytes(info.total_memory_bytes)}")


def config_table(config: TrainConfig) -> Table:
    table = Table(title="configuration", show_header=False, title_justify="left")
    table.add_column("knob", style="bold")
    table.add_column("value")
    for knob, value in config.to_dict().items():
        table.add_row(knob, str(value))
    return table


def print_bench(result: TrialResult, device: str, console: Console, title: str) -> None:
    if result.config is not None:
        console.print(config_table(result.config))
    if result.status == TrialStatus.OK and result.measurement is not None:
        console.print(bench_tables(result.measurement, device, title))
        if result.measurement.trace_path:
            console.print(f"trace: {result.measurement.trace_path} (open in "
                          "https://ui.perfetto.dev)")
    else:
        console.print(Text.assemble((result.status.value, "bold red"), ": ", result.message))
    console.print(Text(f"log: {result.log_path}", style="dim"))


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def _cpu_list(cpus: Sequence[int] | None) -> str:
    """0-3,6 for [0, 1, 2, 3, 6]."""
    if not cpus:
        return "n/a"
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _contention_how(m: Measurement) -> str:
    """Whether the window was disturbed, and how often it was measured again."""
    again = m.windows_remeasured
    retried = f"; re-measured {again} time{'s' if again != 1 else ''}" if again else ""
    if m.disturbed:
        slow, others = m.device_slowdowns, m.device_other_processes
        extra = (f", {others} other process(es) on the device" if others else "") + \
            (f", device clocks held back ({', '.join(slow)})" if slow else "")
        steady = (f"; a steady load (at least {m.machine_load:.0%} in every window): the "
                  "machine's state, not measured again"
                  if m.steady_load and m.machine_load is not None else "")
        return f"DISTURBED: share of the trial's CPUs{extra}{retried}{steady}; the rate is low"
    return f"share of the trial's CPUs in the window{retried}"


OPERATOR_TABLE_TITLES = {"device": "Top operators by self device time",
                         "cpu": "Top operators by self CPU time",
                         "input shape": "Top operators by input shape"}


def stats_table(stats: Sequence[OperatorStat], title: str) -> Table:
    """Operator statistics as a rich table."""
    table = Table(title=title)
    table.add_column("Operator", overflow="fold")
    table.add_column("Calls", justify="right")
    table.add_column("Self (ms)", justify="right")
    table.add_column("Total (ms)", justify="right")
    table.add_column("Share (%)", justify="right")
    for stat in stats:
        table.add_row(stat.name, str(stat.calls), f"{stat.self_time_s * 1e3:.3f}",
                      f"{stat.total_time_s * 1e3:.3f}", f"{stat.share * 100:.1f}")
    return table


# -- studies -------------------------------------------------------------------------------

def trial_row(record: TrialRecord, reason_width: int | None = 60) -> tuple[str, ...]:
    """One trial in a line: number, configuration, samples/sec, peak memory, status, reason (its
    first line, cut to `reason_width` for a table)."""
    ok = record.status == TrialStatus.OK
    message = "" if ok else record.message
    if record.disturbed and not message:
        message = format_disturbance(record.measurement.other_cpu_share,
                                     record.measurement.steady_load)
    status = f"repeat of #{record.duplicate_of}" if record.duplicate else record.label
    sps = record.samples_per_sec
    return (str(record.number), short_config(record.config) if record.config else "",
            f"{sps:.1f}" if sps and ok else "",
            format_bytes(record.peak_memory_bytes) if record.peak_memory_bytes else "",
            status, message.splitlines()[0][:reason_width] if message else "")


def trials_table(records: Iterable[TrialRecord], title: str = "recent trials") -> Table:
    table = Table(title=title, title_justify="left", expand=True)
    for name, justify in (("#", "right"), ("configuration", "left"), ("samples/s", "right"),
                          ("peak mem", "right"), ("status", "left"), ("reason", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for record in records:
        table.add_row(*trial_row(record))
    return table


def studies_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """`autotune studies`: one row per study."""
    table = Table(title="studies", title_justify="left")
    columns = ("study", "trials", "created", "confirmed", "model")
    for name in columns:
        table.add_column(name)
    for row in rows:
        if row.get("error"):
            table.add_row(row["study"], "-", "-", "-",
                          Text(f"cannot be read: {row['error']}", style="red"))
        else:
            table.add_row(*(str(row[k]) for k in columns))
    return table


def tuned(summary: StudySummary) -> str:
    """What the study tuned, in a line: the model file with its arguments, or the script with
    its own."""
    return summary.target.describe() if summary.target else "(not recorded)"


def summary_tables(summary: StudySummary) -> Group:
    """Best beside baseline knob by knob, then the figures and the trial counts."""
    title = f"study {summary.study}: {tuned(summary)} on {summary.device}"
    knobs = Table(title=title, title_justify="left")
    knobs.add_column("knob", style="bold")
    knobs.add_column("baseline")
    knobs.add_column("best")
    for knob, a, b in knob_rows(summary):
        knobs.add_row(knob, str(a), Text(str(b), style="bold green" if a != b else ""))
    figures = Table(show_header=False, title="result", title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_column("how", style="dim")
    for row in result_rows(summary):
        figures.add_row(*row)
    parts: list[Any] = [Text(summary.verdict, style="bold")]
    if summary.script_answer is not None:
        parts += [Text("in your script's terms:", style="bold"),
                  *(Text(f"  {line}", style="bold green") for line in summary.script_lines())]
    parts += [Text(line) for line in diagnosis_lines(summary)]
    parts += [knobs, figures]
    for line in left_out_lines(summary):
        parts.append(Text(line, style="dim"))
    for warning in summary.warnings:
        parts.append(Text(f"warning: {warning}", style="bold yellow"))
    for verification in summary.verifications:
        parts.append(Text(f"verified {verification.describe()}",
                          style="green" if verification.holds else "bold yellow"))
    return Group(*parts)


def knob_rows(summary: StudySummary) -> list[tuple[str, Any, Any]]:
    """(knob, baseline's value, best's value) for the knobs that apply to the study."""
    base = summary.baseline_config.to_dict() if summary.baseline_config else {}
    best = summary.best_config.to_dict() if summary.best_config else {}
    return [(knob, base.get(knob), best.get(knob)) for knob in summary.knobs]


def speedup_text(summary: StudySummary) -> str:
    """The speedup with its interval, and whether it is a difference at all; where your
    settings were kept, the interval is the closest other configuration's and says so."""
    confirmed = summary.confirmation
    interval = confirmed.speedup_ci if confirmed else None
    if not summary.speedup:
        return "n/a"
    if interval and summary.best_config == summary.baseline_config:
        holds_one = interval[0] <= 1.0 <= interval[1]
        return (f"1.00x: your settings kept; the closest other "
                f"[{interval[0]:.2f}-{interval[1]:.2f}]"
                + (", no measurable difference" if holds_one else ""))
    text = f"{summary.speedup:.2f}x" + (f" [{interval[0]:.2f}-{interval[1]:.2f}]"
                                        if interval else "")
    if confirmed and confirmed.no_measurable_difference:
        return text + ": no measurable difference"
    if summary.difference_unknown:
        return text + ": not known (too few paired rounds for an interval)"
    return text


def result_rows(summary: StudySummary) -> list[tuple[str, str, str]]:
    """(figure, value, how it was measured): the answer, then how the study went."""
    confirmed = summary.confirmation
    runs = "warm turns" if confirmed and confirmed.confirmation_measured == WARM_TURNS \
        else "fresh runs"
    how = (f"median of {confirmed.confirmation_repeats} paired rounds of {runs}, ± half "
           "the range" if confirmed else "single trial, not confirmed")
    rows = [
        ("best samples/sec", format_rate(summary.best_samples_per_sec, summary.best_spread),
         how),
        ("baseline samples/sec", format_rate(summary.baseline_samples_per_sec,
                                             confirmed.baseline_spread if confirmed else None),
         how),
        ("speedup", speedup_text(summary),
         "best / baseline, paired by round, 95% interval" if confirmed else "best / baseline"),
    ]
    search = confirmed.best_search_samples_per_sec if confirmed else None
    if search and summary.best_samples_per_sec:
        gap = summary.best_samples_per_sec / search - 1
        rows.append(("in the search", format_rate(search),
                     f"the same configuration's search trial; confirmed {gap:+.0%} (the "
                     "search keeps its luckiest figures)"))
    fastest = confirmed.fastest_config if confirmed else None
    # the race's best the answer drops changes of is a row of its own (`taken_back_rows`)
    if confirmed and fastest and fastest not in (summary.best_config,
                                                 confirmed.taken_from_config):
        interval = confirmed.fastest_speedup_ci
        rows.append(("fastest measured", short_config(fastest),
                     f"{confirmed.fastest_speedup:.2f}x"
                     + (f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "")
                     + (" of the baseline, too few paired rounds to tell it from "
                        if summary.difference_unknown else
                        " of the baseline, no measurable difference from ")
                     + ("the race's best (below), which changes fewer knobs"
                        if confirmed.taken_from_config else
                        "the best, which changes fewer knobs")))
    rows += taken_back_rows(summary)
    rows += group_rows(summary.process_group)
    worst = confirmed.worst_batch if confirmed else None
    rows += [
        ("peak memory (best)", format_bytes(summary.best_peak_memory_bytes),
         "the largest rank's" if summary.process_group else
         "the larger of its rounds' and its worst batch's" if worst else ""),
        *check_rows(summary),
        ("MFU (best)", *mfu_figure(summary.best_mfu, summary.device_type,
                                   summary.best_mfu_basis)),
        ("tuning wall time", format_seconds(summary.tuning_wall_s), "trials only"),
        ("trials", ", ".join(f"{k.lower()} {v}" for k, v in sorted(summary.trials.items())),
         "by Optuna state"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items())),
         "oom and over_memory count as infeasible"),
        ("retried", str(summary.retried_trials),
         "trials queued to run again: their tuner died (orphaned), or their compile ran "
         "out of time"),
        *_time_rows(summary),
        ("queued", _trial_numbers(summary.queued_trials),
         "not under way: they run when the same command runs again"),
        ("disturbed", _trial_numbers(summary.disturbed_trials),
         "trials timed while other processes used the CPUs; never ranked above a clean one"),
    ]
    return rows + search_rows(summary)


def taken_back_rows(summary: StudySummary) -> list[tuple[str, str, str]]:
    """Each change of the race's recommendation taken back: what it cost (the speed lost
    without it, with its 95% interval) and whether the answer keeps it."""
    confirmed = summary.confirmation
    if confirmed is None or not confirmed.taken_back:
        return []
    rows = []
    if confirmed.taken_from_config is not None:
        rows.append(("the race's best", short_config(confirmed.taken_from_config),
                     "the answer is it less the changes dropped below"))
    for back in confirmed.taken_back:
        cost = back.cost_text() if back.ratio is not None else "not measured"
        rows.append((f"without {back.change}", cost,
                     f"speed lost, paired by round, 95% interval: {back.outcome_text()}"))
    return rows


def check_rows(summary: StudySummary) -> list[tuple[str, str, str]]:
    """What the confirmation checked of the answer beyond its speed (`study.checks`): its
    worst batch's peak and the memory it leaves, its loss against your settings' (with their
    seed-to-seed spread), or why each was not checked; and each configuration ruled out."""
    confirmed = summary.confirmation
    checks = confirmed.checks if confirmed else None
    if checks is None:
        return []
    rows = []
    worst = confirmed.worst_batch
    if worst is not None:
        headroom = worst.headroom_bytes
        rows.append(("worst batch (best)", format_bytes(worst.peak_memory_bytes)
                     if worst.peak_memory_bytes else worst.outcome,
                     f"peak on a micro-batch of {worst.batch()} ({checks.sizes})"
                     + (f"; {format_bytes(headroom)} of {format_bytes(worst.capacity_bytes)} "
                        "left" if headroom is not None else "")))
    else:
        rows.append(("worst batch (best)", "not checked", checks.worst_batch_missing()))
    loss = confirmed.loss_check
    if loss is not None:
        rows.append(("loss (best)", f"{loss.delta:+.1%}" if loss.delta is not None else
                     "not finite", loss.describe("its")))
    elif checks.loss_note or (summary.best_config and summary.baseline_config and
                              numerics_changes(summary.best_config, summary.baseline_config)):
        rows.append(("loss (best)", "not checked", checks.loss_missing()))
    if len(checks.baseline_losses) >= 2:
        first, second = checks.baseline_losses[:2]
        rows.append(("loss (your settings)", f"{first:.4g} | {second:.4g}",
                     f"after {checks.loss_steps} steps from two seeds: a spread of "
                     f"{checks.spread:.1%}, what a loss is compared against"))
    elif checks.baseline_losses:
        rows.append(("loss (your settings)", f"{checks.baseline_losses[0]:.4g}",
                     f"after {checks.loss_steps} steps from one seed, what a loss is compared "
                     "against (a second seed, for their spread, runs only where a loss is "
                     "beyond the floor)"))
    rows += [("ruled out", short_config(out.config), out.why)
             for out in confirmed.ruled_out]
    return rows


def group_rows(group: ProcessGroupFigures | None) -> list[tuple[str, str, str]]:
    """The best trial's ranks, when trials are process groups."""
    if group is None:
        return []
    straggler = f"rank {group.straggler_rank} held the others back (>10% slower at its own " \
        "work)" if group.straggler_rank is not None else "no straggler"
    return [
        ("ranks (best)", " | ".join(format_rate(r) for r in group.rank_samples_per_sec),
         f"samples/sec of each of {group.world_size} ranks in its search trial; the group's "
         f"is their sum over the slowest window; {straggler}"),
        ("rank peak memory", " | ".join(format_bytes(b) for b in group.rank_peak_memory_bytes),
         "each rank's"),
        ("communication (best)", format_percent(group.communication_fraction),
         "share of the profiled step with a collective in flight, overlapped or not"),
    ]


def diagnosis_lines(summary: StudySummary) -> list[str]:
    """Where the step's time goes, your settings' and the answer's (`study/bottleneck`), and
    the answer's by kind of work, said as the account of its MFU where that is short of what a
    tuned step reaches."""
    lines = []
    if summary.diagnosis is not None:
        lines.append(f"your settings' step: {summary.diagnosis.describe()}")
    if summary.answer_diagnosis is not None:
        lines.append(f"the answer's step: {summary.answer_diagnosis.describe(first=False)}")
        if work := summary.answer_diagnosis.describe_work():
            lines.append(f"{_mfu_gap(summary)}the answer's {work}")
    return lines


def _mfu_gap(summary: StudySummary) -> str:
    mfu = summary.best_mfu
    if summary.device_type != "cuda" or mfu is None or mfu >= REACHABLE_MFU:
        return ""
    return f"MFU {mfu:.0%}, short of the {REACHABLE_MFU:.0%} a tuned step reaches: "


def left_out_lines(summary: StudySummary) -> list[str]:
    """The knob values the capability probe kept out of the search, each with its reason."""
    return [f"left out: {item.describe()}" for item in summary.left_out]


def _time_rows(summary: StudySummary) -> list[tuple[str, str, str]]:
    """Where the baseline trial's wall time went, phase by phase (where it was recorded)."""
    probe = [("probe", format_seconds(summary.probe_s),
              "once per study, before the baseline, within the first run's budget")] \
        if summary.probe_s else []
    number = summary.baseline_trial.number if summary.baseline_trial else None
    times = next((t for t in summary.trial_times if t.trial == number), None)
    if times is None:
        return probe
    p = times.phases
    parts = [("start", times.process_start_s), ("build", p.build_s),
             ("first step", p.first_step_s), ("warm-up", p.warmup_s),
             ("screening", p.screen_s), ("window", p.window_s),
             ("re-measured", p.remeasure_s), ("sync tracing", p.sync_tracing_s),
             ("profiling", p.profile_s)]
    shown = ", ".join(f"{name} {format_seconds(s)}" for name, s in parts if s)
    return [*probe, (f"baseline trial #{number}", f"{format_seconds(times.wall_s)}: {shown}",
                     "a confirmation run is priced from its start, build, first step, "
                     "warm-up and one short window")]


def _trial_numbers(numbers: Sequence[int]) -> str:
    if not numbers:
        return "none"
    shown = ", ".join(f"#{n}" for n in numbers[:8])
    return f"{len(numbers)}: {shown}" + (", ..." if len(numbers) > 8 else "")


def search_rows(summary: StudySummary) -> list[tuple[str, str, str]]:
    """Time to train, compile payoff, memory-model accuracy and the DataLoader's own rates."""
    rows = []
    steps, confirmed = summary.train_steps, summary.confirmation
    if steps and confirmed and confirmed.best_time_to_train_s:
        rows.append((f"time for {steps:,} steps",
                     f"{format_seconds(confirmed.best_time_to_train_s)} vs "
                     f"{format_seconds(confirmed.baseline_time_to_train_s)}",
                     "best vs baseline, build, compile and warm-up included"))
    payoff = summary.compile_payoff
    if payoff:
        even = payoff.break_even_steps
        rows.append(("compile break-even",
                     f"{even:,.0f} steps" if even is not None else "never",
                     f"trial {payoff.trial}: {payoff.compile_s:.1f} s at start-up for "
                     f"{payoff.gain:+.0%} per step vs {payoff.reference}"))
    memory = summary.memory_predictions
    if memory:
        rows.append(("memory model error", f"{memory.median_abs_error:.1%}",
                     f"median |measured - predicted| / measured over {memory.checked} "
                     f"trials (max {memory.max_abs_error:.1%})"))
    if summary.loader_rates:
        rows.append(("DataLoader alone", ", ".join(
            f"{r.num_workers}w {r.samples_per_sec:,.0f}/s" for r in summary.loader_rates),
            "samples/sec per workers setting, no model"))
    return rows


def summary_markdown(summary: StudySummary) -> str:
    """The same summary as a markdown file for the study folder."""
    lines = [f"# autotune study `{summary.study}`", "", f"**{summary.verdict}**", ""]
    match summary.target:
        case Script(path, args):
            lines += ["In your script's terms:", "", "```",
                      *summary.script_lines(), "```", "",
                      f"- script: `{path}` `{' '.join(args)}`"]
        case ModelFile(path, args):
            lines.append(f"- model: `{path}` {args or ''}")
    lines.append(f"- device: {summary.device}")
    lines += [f"- {line}" for line in diagnosis_lines(summary)]
    lines += [f"- {name}: {value}" + (f" ({how})" if how else "")
              for name, value, how in result_rows(summary)]
    lines += [f"- {line}" for line in left_out_lines(summary)]
    lines += [f"- verified {v.describe()}" for v in summary.verifications]
    lines.append("")
    lines += [f"> warning: {w}" for w in summary.warnings]
    lines += ["", "| knob | baseline | best |", "|---|---|---|"]
    for knob, a, b in knob_rows(summary):
        lines.append(f"| {knob} | {a} | {'**' + str(b) + '**' if a != b else b} |")
    return "\n".join(lines) + "\n"


def write_study_files(summary: StudySummary, directory: Path) -> StudySummary:
    """best.yaml, best.json and summary.md in the study folder; returns the summary naming
    every file of the study there (best-trace.json too, when the confirmation kept one)."""
    if summary.best_config:
        best = summary.best_config
        (directory / "best.yaml").write_text(yaml_file(best, summary.nproc_per_node,
                                                       summary.check_lines()))
        checks = {CHECKS: summary.check_lines()} if summary.check_lines() else {}
        (directory / "best.json").write_text(json.dumps(
            {**best.to_dict(), VERDICT: summary.verdict, **checks}, indent=2) + "\n")
    (directory / "summary.md").write_text(summary_markdown(summary))
    return replace(summary, files={name: str(directory / name) for name in
                                   ("best.yaml", "best.json", "summary.md", "best-trace.json")
                                   if (directory / name).exists()})
