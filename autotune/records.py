"""Plain records of a study's trials, and what compiling paid for itself: shared by the
summary (`tuner`) and the report page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from autotune.report import short_config


def trial_records(study: optuna.Study) -> list[dict[str, Any]]:
    """One plain record per trial that has a configuration, in trial order."""
    records = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        if "config" not in attrs:
            continue
        records.append({
            "number": t.number, "status": attrs.get("status", t.state.name.lower()),
            "config": attrs["config"], "samples_per_sec": attrs.get("samples_per_sec"),
            "score": t.value if attrs.get("constraint") == 0.0 else None,
            "peak_memory_bytes": attrs.get("peak_memory_bytes"),
            "time_to_first_step_s": attrs.get("time_to_first_step_s"),
            "step_time_median_s": attrs.get("step_time_median_s"),
            "start": t.datetime_start.timestamp() if t.datetime_start else None,
            "end": t.datetime_complete.timestamp() if t.datetime_complete else None,
            "duplicate": "duplicate_of" in attrs, "role": attrs.get("role", "search")})
    return records


def _twin_key(config: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(v for k, v in sorted(config.items()) if k != "compile_mode")


def compile_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each measured compiled configuration: what compiling cost at start-up, what it
    gains per step, and the training steps after which it has paid for itself.

    The reference is the same configuration uncompiled when it was measured, else the fastest
    uncompiled one with the same precision and micro-batch, else with the same precision; a
    compiled trial with none of these is left out rather than credited with precision's gain.
    """
    ok = [r for r in records if r["status"] == "ok" and not r["duplicate"]
          and r["samples_per_sec"] and r["time_to_first_step_s"] is not None]
    plain = [r for r in ok if r["config"]["compile_mode"] == "none"]
    rows = []
    for rec in ok:
        config = rec["config"]
        if config["compile_mode"] == "none":
            continue
        ref, how = _reference(rec, plain)
        if ref is None:
            continue
        compile_s = rec["time_to_first_step_s"] - ref["time_to_first_step_s"]
        gain = rec["samples_per_sec"] / ref["samples_per_sec"] - 1
        per_step = config["micro_batch_size"] * config["grad_accum_steps"]
        saved = per_step * (1 / ref["samples_per_sec"] - 1 / rec["samples_per_sec"])
        rows.append({
            "label": f"#{rec['number']} {config['compile_mode']}", "trial": rec["number"],
            "config": short_config(config), "reference": f"#{ref['number']} ({how})",
            "compile_s": compile_s, "gain": gain,
            "break_even_steps": max(0.0, compile_s) / saved if saved > 0 else None})
    return rows


def _reference(rec: Mapping[str, Any],
               plain: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, str]:
    config = rec["config"]
    twin = [r for r in plain if _twin_key(r["config"]) == _twin_key(config)]
    if twin:
        return max(twin, key=lambda r: r["samples_per_sec"]), "same knobs, uncompiled"
    same = [r for r in plain if r["config"]["precision"] == config["precision"]]
    near = [r for r in same if r["config"]["micro_batch_size"] == config["micro_batch_size"]]
    if near:
        return max(near, key=lambda r: r["samples_per_sec"]), "same precision and micro-batch"
    if same:
        return max(same, key=lambda r: r["samples_per_sec"]), "same precision"
    return None, ""
