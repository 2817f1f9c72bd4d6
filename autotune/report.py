"""What people see: rich tables of measured figures, human units, and the phase of long work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

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
    return Group(*parts)


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
