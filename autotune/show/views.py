"""What the person watching a study sees while it runs: the search's `StudyView`
(`autotune.search.events`) as one line per event, or as a live terminal panel."""

from __future__ import annotations

import time
from collections.abc import Callable
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
)
from rich.text import Text

from autotune.formatting import short_config
from autotune.show.report import trial_row, trials_table
from autotune.study.records import TrialRecord, rankable, trial_records


class PlainView:
    """One line per event, never wrapped (a log is read with grep): for logs, CI and anything
    that is not a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None:
        where = f" on {device}" if device else ""
        self.console.print(f"trial {number} ({role}){where}: {short_config(config)}",
                           markup=False, highlight=False, soft_wrap=True)

    def phase(self, text: str, number: int | None = None) -> None:
        """Phases are only worth a line on a live display."""

    def trial_finished(self, record: TrialRecord) -> None:
        number, _, sps, memory, status, reason = trial_row(record, reason_width=None)
        figures = f"{sps} samples/s, peak {memory}" if sps else reason
        if sps and reason:
            figures += f", {reason}"
        self.console.print(f"trial {number}: {status}  {figures}", markup=False,
                           highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def time_left(self, text: str) -> None:
        self.note(text)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveView(PlainView):
    """A live panel: progress, the time left (the tuner's forecast: search and confirmation),
    the last trials, the best so far."""

    def __init__(self, console: Console, study: Any, budget: int | None,
                 time_budget: Callable[[], float | None], measured: Callable[[], int]) -> None:
        super().__init__(console)
        self.study, self.measured, self.time_budget = study, measured, time_budget
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn() if budget else TextColumn(""),
                                 TimeElapsedColumn(), console=console)
        self.by_time = budget is None and time_budget() is not None
        total = time_budget() if self.by_time else budget
        self.task = self.progress.add_task("tuning", total=total,
                                           completed=0 if self.by_time else measured())
        self.started = time.monotonic()
        self.current = self.left = ""
        self.running: dict[int, str] = {}
        self.live = Live(self._render(), console=console, refresh_per_second=4,
                         transient=False)

    def _render(self) -> Group:
        if self.by_time:  # the budget may grow (a slow model's answer needs room)
            self.progress.update(self.task, completed=time.monotonic() - self.started,
                                 total=self.time_budget())
        else:
            self.progress.update(self.task, completed=self.measured())
        finished = [r for r in trial_records(self.study) if r.finished]
        best = max(rankable(finished), key=lambda r: r.score, default=None)
        best_line = (Text(f"best so far: trial {best.number}, {best.samples_per_sec:.1f} "
                          f"samples/s, {short_config(best.config)}")
                     if best else Text("best so far: none yet"))
        running = [Text(line, style="dim") for _, line in sorted(self.running.items())]
        return Group(self.progress, Text(self.left), trials_table(finished[-8:]), best_line,
                     *running, Text(self.current, style="dim"))

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None:
        where = f" on {device}" if device else ""
        self.running[number] = f"trial {number} ({role}){where}: {short_config(config)}"
        self.live.update(self._render())

    def phase(self, text: str, number: int | None = None) -> None:
        if number in self.running:
            self.running[number] = f"{self.running[number].split(' — ')[0]} — {text}"
        else:
            self.progress.update(self.task, description=f"tuning: {text}")
        self.live.update(self._render())

    def trial_finished(self, record: TrialRecord) -> None:
        self.running.pop(record.number, None)
        self.current = ""
        self.live.update(self._render())

    def note(self, text: str) -> None:
        self.current = text
        self.live.update(self._render())

    def time_left(self, text: str) -> None:
        self.left = text
        self.live.update(self._render())

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.stop()
