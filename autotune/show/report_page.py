"""`autotune report`: one self-contained HTML page per study, from its storage alone.

Images are inline PNGs and the styles are in the page, so it opens anywhere, offline, and can be
mailed to a colleague as one file.
"""

from __future__ import annotations

import base64
import html
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import optuna
from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator
from optuna.trial import FrozenTrial

from autotune.formatting import (
    format_bytes,
    format_percent,
    format_rate,
    format_seconds,
    mfu_figure,
    short_config,
)
from autotune.show import plots
from autotune.show.report import (
    check_rows,
    diagnosis_lines,
    group_rows,
    knob_rows,
    left_out_lines,
    speedup_text,
    taken_back_rows,
    tuned,
)
from autotune.study.confirmation import WARM_TURNS, CandidateSummary, Run, stored_confirmation
from autotune.study.records import StudyKey, TrialRecord, trial_records
from autotune.study.results import compile_rows, study_summary
from autotune.study.summary import CompileRow, StudySummary

MIN_TRIALS_FOR_IMPORTANCE = 4
_EVALUATORS = {"fANOVA": lambda: FanovaImportanceEvaluator(seed=0),
               "PED-ANOVA": PedAnovaImportanceEvaluator}


def _measured(trial: FrozenTrial) -> bool:
    record = TrialRecord.of(trial)
    return record.feasible and not record.duplicate


def param_importances(study: optuna.Study) -> tuple[dict[str, dict[str, float]], str]:
    """Importance of each knob for samples/sec, over the measured feasible trials only, so it
    says what each knob bought rather than what ran out of memory; plus a note."""
    trials = [t for t in study.get_trials(deepcopy=False) if _measured(t) and t.params]
    if len(trials) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, (f"{len(trials)} measured feasible trials: importance needs at least "
                    f"{MIN_TRIALS_FOR_IMPORTANCE}")
    feasible = optuna.create_study(direction="maximize")
    feasible.add_trials(trials)
    results: dict[str, dict[str, float]] = {}
    notes = []
    for name, make in _EVALUATORS.items():
        try:
            results[name] = dict(optuna.importance.get_param_importances(
                feasible, evaluator=make()))
        except (ValueError, RuntimeError) as exc:
            notes.append(f"{name}: {exc}")
    note = f"over {len(trials)} measured feasible trials"
    return results, "; ".join([note, *notes])


# -- the page -------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;margin-top:2em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.changed td{background:#eaf7ea;font-weight:600}
.muted{color:#666;font-size:.9em} img{max-width:100%;border:1px solid #eee}
.finding{border-left:4px solid #dd8452;padding:.3em .8em;margin:.8em 0;background:#fdf8f4}
.finding pre{margin:.3em 0;white-space:pre-wrap;font-size:.88em}
.headline{font-size:1.15em;background:#f4f8fc;padding:.6em 1em;border-radius:4px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
           numeric: Iterable[int] = ()) -> str:
    numeric = set(numeric)
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _confirmed(entry: CandidateSummary | None, figure: Callable[[Run], float | None]
               ) -> float | None:
    """The median of one figure over a candidate's confirmation runs."""
    values = [v for r in (entry.ok_runs() if entry else []) if (v := figure(r)) is not None]
    return statistics.median(values) if values else None


def _headline(summary: StudySummary) -> str:
    """The verdict, then where the best's figure comes from."""
    if not summary.best_config:
        return f"<b>{_e(summary.verdict)}</b>."
    runs = "warm turns" if summary.confirmation and \
        summary.confirmation.confirmation_measured == WARM_TURNS else "fresh runs"
    how = f"confirmed by paired rounds of {runs}" if summary.confirmed else \
        "single trial, not confirmed"
    return (f"<b>{_e(summary.verdict)}</b>.<br>Best: {_e(short_config(summary.best_config))} "
            f"at {format_rate(summary.best_samples_per_sec)} samples/sec ({how}) against the "
            f"baseline's {format_rate(summary.baseline_samples_per_sec)}: "
            f"{_e(speedup_text(summary))}.")


def _best_vs_baseline(study: optuna.Study, summary: StudySummary) -> str:
    rows = []
    for knob, a, b in knob_rows(summary):
        cls = ' class="changed"' if a != b else ""
        rows.append(f"<tr{cls}><td>{_e(knob)}</td><td>{_e(a)}</td><td>{_e(b)}</td></tr>")
    knobs = ("<table><tr><th>knob</th><th>baseline</th><th>best</th></tr>"
             f"{''.join(rows)}</table>")
    confirmation = stored_confirmation(study.user_attrs.get(StudyKey.CONFIRMATION)) \
        if summary.confirmed else None
    winner = confirmation.winner if confirmation else None
    baseline = confirmation.baseline if confirmation else None
    runs = "warm turns" if confirmation and confirmation.measured == WARM_TURNS else "fresh runs"
    how = (f"median of {confirmation.rounds} paired rounds of {runs} ± half their "
           "range; the speedup's 95% interval from the rounds' paired ratios"
           if confirmation else "from the search trials; not confirmed")
    mfu_value, mfu_how = mfu_figure(summary.best_mfu, summary.device_type,
                                    summary.best_mfu_basis)
    figures = _table(["figure", "baseline", "best"], [
        ("samples/sec", format_rate(summary.baseline_samples_per_sec,
                                    baseline.spread if baseline else None),
         format_rate(summary.best_samples_per_sec, summary.best_spread)),
        ("speedup", "1.00x", speedup_text(summary)),
        ("peak memory", format_bytes(baseline.peak_memory_bytes if baseline else None),
         format_bytes(summary.best_peak_memory_bytes)),
        ("MFU", mfu_figure(_confirmed(baseline, lambda r: r.mfu), summary.device_type)[0],
         mfu_value),
        ("step time (median)",
         format_seconds(_confirmed(baseline, lambda r: r.step_time_median_s)),
         format_seconds(_confirmed(winner, lambda r: r.step_time_median_s))),
    ], numeric=(1, 2))
    group = summary.process_group
    ranks = _table(["process group (best trial)", "figure", "how"], group_rows(group)) \
        if group else ""
    backs = taken_back_rows(summary)
    ranks += _table(["each change taken back", "cost", "what it showed"], backs) \
        if backs else ""
    checked = check_rows(summary)
    ranks += _table(["checked beyond speed", "figure", "what it showed"], checked) \
        if checked else ""
    warnings = "".join(f'<p class="muted">{_e(line)}</p>' for line in [
        *(f"warning: {w}" for w in summary.warnings), *left_out_lines(summary),
        *(f"verified {v.describe()}" for v in summary.verifications)])
    return (f"{knobs}{figures}{ranks}<p class='muted'>{_e(how)}. MFU: {_e(mfu_how)}.</p>"
            f"{warnings}")


def _operators_and_findings(study: optuna.Study, summary: StudySummary) -> str:
    number = summary.best_trial
    if number is None and summary.best_config is not None:
        return ("<p>The answer has no search trial of its own (the confirmation took changes "
                "back from the race's best to make it): no profiler window to show here; its "
                "trace is best-trace.json in the study folder.</p>")
    if number is None:
        return "<p>No best configuration yet.</p>"
    m = TrialRecord.of(study.trials[number]).measurement
    ops = m.top_operators if m else ()
    parts = [f"<p>{_e(line)}</p>" for line in diagnosis_lines(summary)]
    parts.append(f"<p class='muted'>From trial #{number}'s profiler window (after its timed "
                 "window, so the profiler did not slow the figure above).</p>")
    findings = m.findings if m else ()
    if findings:
        for i, f in enumerate(findings, 1):
            where = "\n".join(f.where)
            parts.append(
                f'<div class="finding"><b>{i}. {_e(f.title)}</b> '
                f'<span class="muted">({f.share:.0%} of the window)</span>'
                f"<br>{_e(f.advice)}" + (f"<pre>{_e(where)}</pre>" if where else "")
                + "</div>")
    else:
        parts.append("<p>No finding: no copy-, sync-, loader- or launch-bound pattern above its "
                     "threshold in this configuration.</p>")
    if ops:
        kind = "device" if m.device_idle_fraction is not None else "CPU"
        parts.append(_table(
            ["operator", "calls", f"self {kind} (ms)", "total (ms)", "share"],
            [(o.name, o.calls, f"{o.self_time_s * 1e3:.3f}", f"{o.total_time_s * 1e3:.3f}",
              f"{o.share:.1%}") for o in ops],
            numeric=(1, 2, 3, 4)))
    confirmation = stored_confirmation(study.user_attrs.get(StudyKey.CONFIRMATION))
    if confirmation and confirmation.winner.trace:
        parts.append("<p class='muted'>Trace: best-trace.json in the study folder (open it "
                     "in ui.perfetto.dev or chrome://tracing).</p>")
    return "".join(parts)


def _compile_section(rows: Sequence[CompileRow]) -> str:
    if not rows:
        return "<p>No compiled configuration was measured with an uncompiled reference.</p>"
    table = _table(
        ["trial", "configuration", "reference", "compile time", "steady gain", "pays off after"],
        [(r.label, r.config, r.reference, format_seconds(r.compile_s), f"{r.gain * 100:+.1f}%",
          "never" if r.break_even_steps is None else f"{r.break_even_steps:,.0f} steps")
         for r in rows], numeric=(3, 4, 5))
    return (_img(plots.compile_payoff(rows), "compile time vs gain") + table +
            "<p class='muted'>Compile time: the extra time to the first optimizer step over the "
            "reference (compilation, and any re-compiles it triggers there). A run shorter "
            "than the break-even step count is faster without compile.</p>")


def _trials_table(records: Sequence[TrialRecord]) -> str:
    return _table(
        ["#", "status", "configuration", "samples/sec", "peak memory", "other CPU use"],
        [(r.number, r.label + (" (repeat)" if r.duplicate else "")
          + (" (disturbed)" if r.disturbed else ""), short_config(r.config),
          format_rate(r.samples_per_sec), format_bytes(r.peak_memory_bytes),
          format_percent(r.measurement.other_cpu_share if r.measurement else None))
         for r in records],
        numeric=(3, 4, 5))


def build_report(study: optuna.Study) -> str:
    """The whole page as one HTML string."""
    summary = study_summary(study)
    records = [r for r in trial_records(study) if r.config]
    memory = study.user_attrs.get(StudyKey.MEMORY) or {}
    importances, importance_note = param_importances(study)
    compile_table = compile_rows(records)
    title = f"autotune study {study.study_name}"
    sections = [
        ("a. Samples/sec vs micro-batch size",
         _img(plots.throughput_vs_micro_batch(records), "samples/sec vs micro-batch") +
         "<p class='muted'>Each point is one measured trial; crosses at the bottom ran out of "
         "memory, hollow markers were over the allowed memory or predicted not to fit.</p>"),
        ("b. Peak memory vs micro-batch size",
         _img(plots.memory_vs_micro_batch(records, memory.get("capacity_bytes"),
                                          memory.get("limit_bytes")), "peak memory") +
         f"<p class='muted'>Capacity {format_bytes(memory.get('capacity_bytes'))}; allowed "
         f"{format_bytes(memory.get('limit_bytes'))} (headroom "
         f"{format_percent(memory.get('headroom'))}). On CPU, peak memory is the trial "
         "process's peak resident set.</p>"),
        ("c. Best so far", _img(plots.best_so_far(records), "best so far") +
         "<p class='muted'>Objective: samples/sec less the stall penalty.</p>"),
        ("d. Parameter importance",
         (_img(plots.importance_bars(importances), "parameter importance")
          if importances else "") + f"<p class='muted'>{_e(importance_note)}.</p>"),
        ("e. Best vs baseline", _best_vs_baseline(study, summary)),
        ("f. Where the best configuration spends its time",
         _operators_and_findings(study, summary)),
        ("g. Compile: time vs gain", _compile_section(compile_table)),
        ("All trials", _trials_table(records)),
    ]
    body = "".join(f"<h2>{_e(name)}</h2>{content}" for name, content in sections)
    meta = (f"{_e(tuned(summary))} on "
            f"{_e(summary.device)} · {len(records)} trials · tuning "
            f"{format_seconds(summary.tuning_wall_s)} · report written "
            f"{time.strftime('%Y-%m-%d %H:%M')}")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}"
            f"</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>"
            f"<p class='muted'>{meta}</p><p class='headline'>{_headline(summary)}</p>"
            f"{body}</body></html>")
