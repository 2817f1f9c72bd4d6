"""What people see: rich tables of measured figures, human units, and the phase of long work."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from autotune.measure import ProfileReport
from autotune.profiling import TABLE_TITLES, stats_table

# The keys `autotune bench --json` always carries (None where not measurable).
BENCH_KEYS = ("samples_per_sec", "step_time_median_s", "step_time_p90_s", "step_time_cv",
              "time_to_first_step_s", "peak_memory_bytes", "data_wait_fraction",
              "host_syncs_per_step", "device_idle_fraction", "mfu")


def format_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value < 1:
        return f"{value * 1000:.2f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def bench_record(result: Mapping[str, Any], device: str, config: Mapping[str, Any]) -> dict:
    """The flat JSON of one bench: status, config and every figure (None when absent)."""
    metrics = result.get("metrics") or {}
    record: dict[str, Any] = {"status": result["status"], "message": result.get("message", ""),
                              "device": device, "config": dict(config)}
    record.update({key: metrics.get(key) for key in BENCH_KEYS})
    record.update({k: v for k, v in metrics.items() if k not in record})
    record.update({"log_path": result.get("log_path"), "wall_s": result.get("wall_s")})
    return record


def bench_tables(record: Mapping[str, Any], title: str) -> Group:
    """The figures of one measurement, then its top operators."""
    figures = Table(title=title, show_header=False, title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_column("how it was measured", style="dim")
    steady = "steady" if record.get("steady") else "not steady: bound reached"
    rows = [
        ("samples/sec", f"{record['samples_per_sec']:.1f}",
         f"{record.get('window_samples')} samples over a {record.get('window_s', 0):.2f} s "
         f"window of {record.get('window_steps')} steps, data loading included"),
        ("step time median", format_seconds(record["step_time_median_s"]), "per optimizer step"),
        ("step time p90", format_seconds(record["step_time_p90_s"]), ""),
        ("step time CV", _percent(record["step_time_cv"]), "spread of step times"),
        ("time to first step", format_seconds(record["time_to_first_step_s"]),
         "compile and loader start-up included"),
        ("set-up", format_seconds(record.get("setup_s")), "model and loader build"),
        ("warm-up steps", str(record.get("warmup_steps")), steady),
        ("peak memory", format_bytes(record["peak_memory_bytes"]),
         "max reserved by the CUDA allocator" if str(record["device"]).startswith("cuda")
         else "peak RSS of the trial process"),
        ("data wait", _percent(record["data_wait_fraction"]), "of the window blocked on loader"),
        ("host syncs/step", _fmt(record["host_syncs_per_step"], "{:.1f}"),
         "profiler window after the timed one"),
        ("device idle", _percent(record["device_idle_fraction"]), "CUDA only"),
        ("MFU", _percent(record["mfu"]), "model FLOPs over the precision's peak (CUDA only)"),
    ]
    for row in rows:
        figures.add_row(*row)
    parts: list[Any] = [figures]
    operators = record.get("top_operators") or []
    if operators:
        ops = Table(title="top operators (profiler window)", title_justify="left")
        for name, justify in (("operator", "left"), ("calls", "right"), ("self", "right"),
                              ("total", "right"), ("share", "right")):
            ops.add_column(name, justify=justify)
        for op in operators:
            ops.add_row(op["name"], str(op["calls"]), format_seconds(op["self_time_s"]),
                        format_seconds(op["total_time_s"]), _percent(op["share"]))
        parts.append(ops)
    findings = record.get("findings") or []
    if findings:
        parts.append(findings_text(findings))
    return Group(*parts)


def findings_text(findings: Sequence[Mapping[str, Any]]) -> Text:
    """Numbered findings, the costliest first: what, what to do, and where in the code."""
    text = Text("findings (what to fix first)\n", style="bold")
    for i, finding in enumerate(findings, 1):
        text.append(f"{i}. {finding['title']}", style="bold yellow")
        text.append(f"  ({finding['share']:.0%} of the window)\n", style="dim")
        text.append(f"   {finding['advice']}\n")
        for line in finding["where"]:
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
        ("device idle", _percent(result.device_idle_fraction), "CUDA only"),
        ("data wait", _percent(result.data_wait_fraction), "of the window"),
    ):
        figures.add_row(*row)
    console.print(figures)
    for kind, stats in result.tables.items():
        console.print(stats_table(stats, TABLE_TITLES[kind]))
    if result.findings:
        console.print(findings_text([f.to_dict() for f in result.findings]))
    else:
        console.print("no finding: nothing above its threshold")
    for name, path in result.files.items():
        console.print(Text(f"{name}: {path}", style="dim"))


def config_table(config: Mapping[str, Any]) -> Table:
    table = Table(title="configuration", show_header=False, title_justify="left")
    table.add_column("knob", style="bold")
    table.add_column("value")
    for knob, value in config.items():
        table.add_row(knob, str(value))
    return table


def print_bench(record: Mapping[str, Any], console: Console, title: str) -> None:
    console.print(config_table(record["config"]))
    if record["status"] == "ok":
        console.print(bench_tables(record, title))
        if record.get("trace_path"):
            console.print(f"trace: {record['trace_path']} (open in https://ui.perfetto.dev)")
    else:
        console.print(Text.assemble((record["status"], "bold red"), ": ", record["message"]))
    console.print(Text(f"log: {record.get('log_path')}", style="dim"))


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


# -- studies -------------------------------------------------------------------------------

def short_config(config: Mapping[str, Any]) -> str:
    """The knobs that differ from PyTorch's defaults, compactly."""
    parts = [f"mb={config['micro_batch_size']}x{config['grad_accum_steps']}", config["precision"]]
    if config["activation_checkpointing"] != "none":
        parts.append(f"ckpt={config['activation_checkpointing']}")
    parts.append(config["optimizer_impl"])
    if config["num_workers"]:
        parts.append(f"workers={config['num_workers']}/pf={config['prefetch_factor']}"
                     + ("/persist" if config["persistent_workers"] else ""))
    if config["pin_memory"]:
        parts.append("pin")
    if config["compile_mode"] != "none":
        parts.append(f"compile={config['compile_mode']}")
    return " ".join(str(p) for p in parts)


def trial_row(trial: Any) -> tuple[str, ...]:
    attrs = trial.user_attrs
    sps = attrs.get("samples_per_sec")
    status = attrs.get("status", trial.state.name.lower())
    ok = status == "ok"
    message = "" if ok else attrs.get("message", "")
    if "duplicate_of" in attrs:
        status = f"repeat of #{attrs['duplicate_of']}"
    return (str(trial.number), short_config(attrs["config"]) if attrs.get("config") else "",
            f"{sps:.1f}" if sps and ok else "",
            format_bytes(attrs.get("peak_memory_bytes")) if attrs.get("peak_memory_bytes")
            else "", status, message.splitlines()[0][:60] if message else "")


class PlainView:
    """One line per event: for logs, CI and anything that is not a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None:
        where = f" on {device}" if device else ""
        self.console.print(f"trial {number} ({role}){where}: {short_config(config.to_dict())}",
                           markup=False, highlight=False)

    def phase(self, text: str, number: int | None = None) -> None:
        """Phases are only worth a line on a live display."""

    def trial_finished(self, trial: Any) -> None:
        number, config, sps, memory, status, reason = trial_row(trial)
        figures = f"{sps} samples/s, peak {memory}" if sps else reason
        self.console.print(f"trial {number}: {status}  {figures}", markup=False,
                           highlight=False)

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveView(PlainView):
    """A live panel: progress with ETA, the last trials, the best so far."""

    def __init__(self, console: Console, study: Any, budget: int | None,
                 timeout_s: float | None, measured: Callable[[], int]) -> None:
        super().__init__(console)
        self.study, self.measured = study, measured
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn() if budget else TextColumn(""),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 console=console)
        self.by_time = budget is None and timeout_s is not None
        total = timeout_s if self.by_time else budget
        self.task = self.progress.add_task("tuning", total=total,
                                           completed=0 if self.by_time else measured())
        self.started = time.monotonic()
        self.current = ""
        self.running: dict[int, str] = {}
        self.live = Live(self._render(), console=console, refresh_per_second=4,
                         transient=False)

    def _render(self) -> Group:
        if self.by_time:
            self.progress.update(self.task, completed=time.monotonic() - self.started)
        else:
            self.progress.update(self.task, completed=self.measured())
        table = Table(title="recent trials", title_justify="left", expand=True)
        for name, justify in (("#", "right"), ("configuration", "left"),
                              ("samples/s", "right"), ("peak mem", "right"),
                              ("status", "left"), ("reason", "left")):
            table.add_column(name, justify=justify, overflow="fold")
        finished = [t for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()]
        for trial in finished[-8:]:
            table.add_row(*trial_row(trial))
        feasible = [t for t in finished if t.user_attrs.get("constraint") == 0.0
                    and t.value is not None]
        best = max(feasible, key=lambda t: t.value, default=None)
        best_line = (Text(f"best so far: trial {best.number}, "
                          f"{best.user_attrs['samples_per_sec']:.1f} samples/s, "
                          f"{short_config(best.user_attrs['config'])}")
                     if best else Text("best so far: none yet"))
        running = [Text(line, style="dim") for _, line in sorted(self.running.items())]
        return Group(self.progress, table, best_line, *running, Text(self.current, style="dim"))

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None:
        where = f" on {device}" if device else ""
        self.running[number] = f"trial {number} ({role}){where}: {short_config(config.to_dict())}"
        self.live.update(self._render())

    def phase(self, text: str, number: int | None = None) -> None:
        if number in self.running:
            self.running[number] = f"{self.running[number].split(' — ')[0]} — {text}"
        else:
            self.progress.update(self.task, description=f"tuning: {text}")
        self.live.update(self._render())

    def trial_finished(self, trial: Any) -> None:
        self.running.pop(trial.number, None)
        self.current = ""
        self.live.update(self._render())

    def note(self, text: str) -> None:
        self.current = text
        self.live.update(self._render())

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.stop()


def _rate(value: float | None, spread: float | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f} ± {spread:.1f}" if spread is not None else f"{value:.1f}"


def summary_tables(summary: Mapping[str, Any]) -> Group:
    """Best beside baseline knob by knob, then the figures and the trial counts."""
    confirmed = summary["confirmed"]
    title = (f"study {summary['study']}: {summary.get('model')} on {summary.get('device')}")
    knobs = Table(title=title, title_justify="left")
    knobs.add_column("knob", style="bold")
    knobs.add_column("baseline")
    knobs.add_column("best")
    best, base = summary.get("best_config") or {}, summary.get("baseline_config") or {}
    for knob in base or best:
        a, b = base.get(knob), best.get(knob)
        knobs.add_row(knob, str(a), Text(str(b), style="bold green" if a != b else ""))
    how = (f"median of {summary.get('confirmation_repeats')} fresh runs, ± half the range"
           if confirmed else "single trial, not confirmed")
    figures = Table(show_header=False, title="result", title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_column("how", style="dim")
    speedup = summary.get("speedup")
    rows = [
        ("best samples/sec", _rate(summary.get("best_samples_per_sec"),
                                   summary.get("best_spread")), how),
        ("baseline samples/sec", _rate(summary.get("baseline_samples_per_sec"),
                                       summary.get("baseline_spread")), how),
        ("speedup", f"{speedup:.2f}x" if speedup else "n/a", "best / baseline"),
        ("peak memory (best)", format_bytes(summary.get("best_peak_memory_bytes")), ""),
        ("MFU (best)", _percent(summary.get("best_mfu")), "CUDA only"),
        ("tuning wall time", format_seconds(summary.get("tuning_wall_s")), "trials only"),
        ("trials", ", ".join(f"{k.lower()} {v}" for k, v in sorted(summary["trials"].items())),
         "by Optuna state"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())),
         "oom and over_memory count as infeasible"),
        ("retried", str(summary.get("retried_trials", 0)),
         "trials re-run because their tuner died (orphaned)"),
        *search_rows(summary),
    ]
    for row in rows:
        figures.add_row(*row)
    parts: list[Any] = [knobs, figures]
    for warning in summary.get("warnings", []):
        parts.append(Text(f"warning: {warning}", style="bold yellow"))
    return Group(*parts)


def search_rows(summary: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Time to train, compile payoff, memory-model accuracy and the DataLoader's own rates."""
    rows = []
    steps = summary.get("train_steps")
    if steps and summary.get("best_time_to_train_s"):
        rows.append((f"time for {steps:,} steps",
                     f"{format_seconds(summary['best_time_to_train_s'])} vs "
                     f"{format_seconds(summary.get('baseline_time_to_train_s'))}",
                     "best vs baseline, build, compile and warm-up included"))
    payoff = summary.get("compile_payoff")
    if payoff:
        even = payoff["break_even_steps"]
        rows.append(("compile break-even",
                     f"{even:,.0f} steps" if even is not None else "never",
                     f"trial {payoff['trial']}: {payoff['compile_s']:.1f} s at start-up for "
                     f"{payoff['gain']:+.0%} per step vs {payoff['reference']}"))
    memory = summary.get("memory_predictions")
    if memory:
        rows.append(("memory model error", f"{memory['median_abs_error']:.1%}",
                     f"median |measured - predicted| / measured over {memory['checked']} "
                     f"trials (max {memory['max_abs_error']:.1%})"))
    rates = summary.get("loader_rates")
    if rates:
        rows.append(("DataLoader alone", ", ".join(
            f"{r['num_workers']}w {r['samples_per_sec']:,.0f}/s" for r in rates),
            "samples/sec per workers setting, no model"))
    return rows


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The same summary as a markdown file for the study folder."""
    best, base = summary.get("best_config") or {}, summary.get("baseline_config") or {}
    speedup = summary.get("speedup")
    lines = [f"# autotune study `{summary['study']}`", "",
             f"- model: `{summary.get('model')}` {summary.get('model_args') or ''}",
             f"- device: {summary.get('device')}",
             f"- best samples/sec: {_rate(summary.get('best_samples_per_sec'), summary.get('best_spread'))}"  # noqa: E501
             + (" (confirmed: median of fresh runs ± half range)" if summary["confirmed"]
                else " (not confirmed)"),
             f"- baseline samples/sec: {_rate(summary.get('baseline_samples_per_sec'), summary.get('baseline_spread'))}",  # noqa: E501
             f"- speedup: {f'{speedup:.2f}x' if speedup else 'n/a'}",
             f"- peak memory of the best: {format_bytes(summary.get('best_peak_memory_bytes'))}",
             f"- MFU of the best: {_percent(summary.get('best_mfu'))}",
             f"- tuning wall time: {format_seconds(summary.get('tuning_wall_s'))}",
             f"- trials by state: {summary['trials']}; outcomes: {summary['statuses']}"]
    lines += [f"- {name}: {value} ({how})" for name, value, how in search_rows(summary)]
    lines.append("")
    lines += [f"> warning: {w}" for w in summary.get("warnings", [])]
    lines += ["", "| knob | baseline | best |", "|---|---|---|"]
    for knob in base or best:
        a, b = base.get(knob), best.get(knob)
        lines.append(f"| {knob} | {a} | {'**' + str(b) + '**' if a != b else b} |")
    return "\n".join(lines) + "\n"
