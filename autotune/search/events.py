"""What the search tells whoever watches it: the `StudyView` protocol the tuner, its workers and
the confirmation talk to, and `SilentView`, which tells nobody. The faces a person sees
(`autotune.show.views`) implement it; the search never imports them."""

from __future__ import annotations

from typing import Any, Protocol

from autotune.study.records import TrialRecord


class StudyView(Protocol):
    """What the tuner tells the person watching."""

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None: ...
    def phase(self, text: str, number: int | None = None) -> None: ...
    def trial_finished(self, record: TrialRecord) -> None: ...
    def note(self, text: str) -> None: ...
    def time_left(self, text: str) -> None: ...


class SilentView:
    """Tells nobody: for benchmarks and tests that drive the tuner themselves."""

    def trial_started(self, number: int, config: Any, role: str, device: str = "") -> None:
        """Nobody is watching."""

    def phase(self, text: str, number: int | None = None) -> None:
        """Nobody is watching."""

    def trial_finished(self, record: TrialRecord) -> None:
        """Nobody is watching."""

    def note(self, text: str) -> None:
        """Nobody is watching."""

    def time_left(self, text: str) -> None:
        """Nobody is watching."""
