"""The confirmation's outcome as the study stores it: it reads back as it was."""

from __future__ import annotations

import json
from dataclasses import replace

from autotune.config import TrainConfig
from autotune.study.confirmation import (
    NOISE,
    NOT_SHOWN,
    PAYS,
    UNJUDGED,
    Confirmation,
    TakenBack,
)

from .test_summary import _confirmation


def test_the_confirmation_reads_back_as_it_was_stored() -> None:
    outcome = _confirmation()
    stored = json.loads(json.dumps(outcome.to_json()))
    assert Confirmation.from_json(stored) == outcome
    assert stored["winner"]["config"]["precision"] == "bf16"  # plain data in the storage
    flaky = stored["candidates"][1]
    assert flaky["runs"][1] == {"status": "failed"} and not flaky["ok"]
    assert stored["repeats"] == stored["rounds"] == 3


def test_a_confirmation_stored_before_changes_were_taken_back_still_reads() -> None:
    """A study confirmed before the answer's changes were each taken back stored none of the
    new keys: it reads back with none taken back, and its rounds as they were."""
    stored = json.loads(json.dumps(_confirmation().to_json()))
    for key in ("taken_back", "taken_from", "answer_rounds", "measured"):
        stored.pop(key)
    old = Confirmation.from_json(stored)
    assert old.taken_back == () and old.taken_from is None and old.dropped == ()
    assert old.in_rounds == "3 paired rounds"


def test_the_changes_taken_back_read_back_and_say_what_they_cost() -> None:
    backs = (TakenBack("torch.compile", ("compile_mode",),
                       TrainConfig(micro_batch_size=32), NOISE, 0.996, (0.98, 1.012), 24),
             TakenBack("2 loader workers", ("num_workers", "prefetch_factor",
                                            "persistent_workers", "pin_memory"),
                       TrainConfig(), PAYS, 0.31, (0.30, 0.32), 5),
             TakenBack("fused AdamW", ("optimizer_impl",), None, UNJUDGED,
                       why="the search space holds no configuration without it"))
    outcome = replace(_confirmation(), taken_back=backs, answer_rounds=12)
    stored = json.loads(json.dumps(outcome.to_json()))
    assert Confirmation.from_json(stored) == outcome
    assert backs[0].describe() == ("taking back torch.compile cost 0.4% [-1.2%, +2.0%], "
                                   "inside the noise: dropped")
    assert backs[1].describe() == ("taking back 2 loader workers cost 69.0% [+68.0%, +70.0%], "
                                   "it pays: kept")
    assert backs[2].describe().startswith("fused AdamW was not taken back (the search space")
    # a figure of one round has no interval, and says so where the interval would be
    once = TakenBack("bf16", ("precision",), TrainConfig(), NOT_SHOWN, 0.14, None, 1)
    assert once.describe() == ("taking back bf16 cost 86.0% [1 round: no interval], not shown "
                               "to pay here: left out")
    assert outcome.dropped == backs[:1] and outcome.unjudged == ()
    assert outcome.in_rounds == "12 paired rounds"
