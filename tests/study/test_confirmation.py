"""The confirmation's outcome as the study stores it: it reads back as it was."""

from __future__ import annotations

import json

from autotune.study.confirmation import Confirmation

from .test_summary import _confirmation


def test_the_confirmation_reads_back_as_it_was_stored() -> None:
    outcome = _confirmation()
    stored = json.loads(json.dumps(outcome.to_json()))
    assert Confirmation.from_json(stored) == outcome
    assert stored["winner"]["config"]["precision"] == "bf16"  # plain data in the storage
    flaky = stored["candidates"][1]
    assert flaky["runs"][1] == {"status": "failed"} and not flaky["ok"]
    assert stored["repeats"] == stored["rounds"] == 3
