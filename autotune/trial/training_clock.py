"""The trial's training clock: the host clock less the time the script spent outside its
training (the evaluation it runs between epochs, the checkpoints it saves there), so that no
timed step or window counts what every configuration pays alike and autotune does not tune.

A script trial's loop watch (or its library's callbacks) says where the training pauses and
where it resumes; the measurement (`trial/window`, `trial/script/measuring`) reads `now()`
and `outside_s()` where it would read the host clock. A trial is one process and one
training, so the clock is the process's."""

from __future__ import annotations

import time

_outside_s = 0.0
_paused_at: float | None = None


def pause() -> None:
    """The training pauses here (its epoch's data ran out; an evaluation begins)."""
    global _paused_at
    if _paused_at is None:
        _paused_at = time.perf_counter()


def resume() -> None:
    """The training resumes here (the next epoch asks its loader for batches)."""
    global _paused_at, _outside_s
    if _paused_at is not None:
        _outside_s += time.perf_counter() - _paused_at
        _paused_at = None


def outside_s() -> float:
    """Seconds spent outside the training so far (a pause still open counted to now)."""
    open_s = time.perf_counter() - _paused_at if _paused_at is not None else 0.0
    return _outside_s + open_s


def now() -> float:
    """The host clock (`time.perf_counter`) less the time spent outside the training."""
    return time.perf_counter() - outside_s()
