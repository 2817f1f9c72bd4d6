"""The confirmation in warm paired turns, end to end: a real study of a tiny model whose
candidates fit in memory together confirms in warm processes taking turns, many more rounds
than three fresh ones, and says so; each change of its best is taken back in the same turns.
The model is one where fused AdamW is a large win on any machine, so that the search surely
has a candidate to confirm, and a change that pays."""

from __future__ import annotations

import json

import pytest

from autotune.study.confirmation import PAYS, WARM_TURNS, Confirmation
from autotune.study.records import StudyKey
from autotune.study.results import load_study

from ..conftest import FAST, run_cli


@pytest.mark.slow
def test_a_study_confirms_in_warm_paired_turns_with_more_rounds_than_three(tmp_path) -> None:
    # each fresh round asked for is four warm ones at least
    done = run_cli("run", "--model", "tests/models/many_small_params.py", "--device", "cpu",
                   "--model-arg", "slow_layout=0", *FAST, "--studies-dir", str(tmp_path),
                   "--trials", "3", "--seed", "0", "--fix", "compile_mode=none",
                   "--fix", "num_workers=0", "--confirm-top", "1", "--confirm-repeats", "3",
                   "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = load_study("many_small_params", tmp_path).user_attrs[StudyKey.CONFIRMATION]
    confirmation = Confirmation.from_json(stored)
    assert confirmation.measured == WARM_TURNS
    assert confirmation.rounds >= 12
    assert len(confirmation.baseline.runs) == confirmation.rounds
    summary = json.loads(done.stdout)
    assert summary["confirmation_measured"] == WARM_TURNS
    assert summary["confirmation_repeats"] == (confirmation.answer_rounds or confirmation.rounds)
    # a turn leaves no trace: the winner's warm process was asked for one after the last turn
    trace = json.loads((tmp_path / "many_small_params" / "best-trace.json").read_text())
    assert any(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"])
    # fused AdamW is the change that pays: the answer keeps it, whatever rode along with it
    # (bf16, channels-last: dropped where they measure inside the noise)
    assert confirmation.winner.config.optimizer_impl == "fused"
    backs = {t.change: t for t in confirmation.taken_back}
    assert "fused AdamW" not in backs or backs["fused AdamW"].outcome == PAYS
    for back in confirmation.dropped:
        assert getattr(confirmation.winner.config, back.knobs[0]) == \
            getattr(confirmation.baseline.config, back.knobs[0])
    # a warm process for each configuration of the race (the best, the best less each of its
    # changes, the baseline), and after it one for each the short races added, no more: the
    # race's processes that a short race needs again stay warm
    logs = tmp_path / "many_small_params" / "logs"
    raced = sorted(p.name for p in logs.glob("confirm-warm-*.log"))
    assert raced == [f"confirm-warm-{i}.log" for i in range(len(raced))]
    assert len(raced) == 2 + sum(t.config is not None for t in confirmation.taken_back)
    assert len(list(logs.glob("minimal-warm-*.log"))) <= 1
    assert all(t.change in summary["verdict"] for t in confirmation.dropped)
