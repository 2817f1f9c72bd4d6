"""The trial's training clock: the host clock less the time the script spent outside its
training (the evaluation it runs between epochs, the checkpoints it saves there), so that no
timed step or window counts what every configuration pays alike and autotune does not tune; and
torch.compile's work less what it compiled there (an evaluation's own graphs, which no timed
step waits for).

A script trial's loop watch (or its library's callbacks) says where the training pauses and
where it resumes; the measurement (`trial/window`, `trial/script/measuring`) reads `now()`,
`outside_s()` and `compiles()` where it would read the host clock and the compile count. A
trial is one process and one training, so the clock is the process's."""

from __future__ import annotations

import time

from autotune.trial.compile_events import CompileCount, compile_count

_outside_s = 0.0
_paused_at: float | None = None
_outside_compiles = CompileCount(0, 0)
_compiled_at_pause = CompileCount(0, 0)


def pause() -> None:
    """The training pauses here (its epoch's data ran out; an evaluation begins)."""
    global _paused_at, _compiled_at_pause
    if _paused_at is None:
        _paused_at = time.perf_counter()
        _compiled_at_pause = compile_count()


def resume() -> None:
    """The training resumes here (the next epoch asks its loader for batches)."""
    global _paused_at, _outside_s, _outside_compiles
    if _paused_at is not None:
        _outside_s += time.perf_counter() - _paused_at
        _outside_compiles = _outside_compiles + (compile_count() - _compiled_at_pause)
        _paused_at = None


def outside_s() -> float:
    """Seconds spent outside the training so far (a pause still open counted to now)."""
    open_s = time.perf_counter() - _paused_at if _paused_at is not None else 0.0
    return _outside_s + open_s


def compiles() -> CompileCount:
    """What torch.compile did in the training so far: the process's count less what it
    compiled outside the training (a pause still open counted to now)."""
    total = compile_count()
    outside = _outside_compiles
    if _paused_at is not None:
        outside = outside + (total - _compiled_at_pause)
    return total - outside


def now() -> float:
    """The host clock (`time.perf_counter`) less the time spent outside the training."""
    return time.perf_counter() - outside_s()
