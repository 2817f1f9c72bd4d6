"""The confirmation in warm paired turns, end to end: a real study of a tiny model whose
candidates fit in memory together confirms in warm processes taking turns, many more rounds
than three fresh ones, and says so."""

from __future__ import annotations

import json

import pytest

from autotune.study.confirmation import WARM_TURNS, Confirmation
from autotune.study.records import StudyKey
from autotune.study.results import load_study

from .test_run import run_study


@pytest.mark.slow
def test_a_study_confirms_in_warm_paired_turns_with_more_rounds_than_three(tmp_path) -> None:
    # one fresh round asked for is four warm ones at least
    done = run_study(tmp_path, "--trials", "3", "--seed", "0", "--confirm-top", "1",
                     "--confirm-repeats", "1", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = load_study("mlp", tmp_path).user_attrs[StudyKey.CONFIRMATION]
    confirmation = Confirmation.from_json(stored)
    assert confirmation.measured == WARM_TURNS
    assert confirmation.rounds > 3
    assert len(confirmation.baseline.runs) == confirmation.rounds
    summary = json.loads(done.stdout)
    assert summary["confirmation_measured"] == WARM_TURNS
    assert summary["confirmation_repeats"] == confirmation.rounds
    logs = sorted(p.name for p in (tmp_path / "mlp" / "logs").glob("confirm-warm-*.log"))
    assert logs == ["confirm-warm-0.log", "confirm-warm-1.log"]
