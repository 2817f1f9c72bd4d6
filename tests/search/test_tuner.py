"""`Tuner` and the study it opens (`opening`): what one run hands its trials."""

from __future__ import annotations

import hashlib
import json
import os
import time

import optuna
import pytest
import torch

from autotune.options import MeasureSettings, TuneOptions
from autotune.search import opening
from autotune.search.opening import probe_fingerprint
from autotune.search.runner import MeasureJob
from autotune.search.tuner import Tuner, announcement
from autotune.study.storage import open_storage, study_dir
from autotune.target import ModelFile, Script

from ..conftest import TINY_SOURCE
from .scripted import scripted


@pytest.mark.slow
@pytest.mark.whole_machine
def test_parallel_trials_run_on_their_own_share_of_the_cores(write_model, tmp_path) -> None:
    """Each parallel worker's trial (threads and DataLoader workers alike) keeps to its own
    cores; a trial that runs alone, as confirmation does, has them all."""
    seen = tmp_path / "cores.jsonl"
    model = write_model(TINY_SOURCE + f'''
import os, json
_build_model = build_model
def build_model():  # runs in each trial (the fork server imported the file once)
    with open({str(seen)!r}, "a") as f:
        f.write(json.dumps(sorted(os.sched_getaffinity(0))) + "\\n")
    return _build_model()
''')
    tuner = Tuner(TuneOptions(model_path=str(model), device="cpu", workers=2,
                              studies_dir=str(tmp_path / "studies"),
                              settings=MeasureSettings(window_steps=2, window_seconds=0.1,
                                                       profile_steps=0)))
    seen.unlink()  # the probe built the model too
    try:
        for slot in (0, 1, None):
            result = tuner.runner.measure(tuner.baseline,
                                          MeasureJob("trial", 120, "cpu", slot=slot))
            assert result.status == "ok", result.message
    finally:
        tuner.close()
    first, second, alone = (json.loads(line) for line in seen.read_text().splitlines())
    everything = sorted(os.sched_getaffinity(0))
    assert first and second and not set(first) & set(second)
    assert sorted(first + second) == everything
    assert alone == everything


def test_a_study_whose_creator_died_before_recording_it_is_recorded_by_the_next(
        write_model, tmp_path, monkeypatch) -> None:
    """A tuner killed between creating a study and recording what it is for leaves a bare
    study: the next tuner waits a moment for the record (`RECORD_WAIT_S`), then probes and
    records the study itself."""
    monkeypatch.setattr(opening, "RECORD_WAIT_S", 1.0)
    model = write_model(TINY_SOURCE)
    studies = tmp_path / "studies"
    optuna.create_study(study_name="model", storage=open_storage(None, study_dir(studies,
                                                                                "model")))
    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", studies_dir=str(studies)))
    try:
        attrs = tuner.study.user_attrs
    finally:
        tuner.close()
    assert attrs["identity"]["model_path"] == str(model.resolve())
    assert attrs["probe"]["report"]["dataset_size"] == 256
    assert attrs["device_names"] == [attrs["device_name"]]


def test_the_fingerprint_follows_the_file_its_arguments_and_the_machine(write_model) -> None:
    path = write_model(TINY_SOURCE)
    first = probe_fingerprint(ModelFile(str(path)), "cpu A")
    assert probe_fingerprint(ModelFile(str(path)), "cpu A") == first
    assert probe_fingerprint(ModelFile(str(path), {"dim": 4}), "cpu A") != first
    assert probe_fingerprint(ModelFile(str(path)), "cpu B") != first
    script = probe_fingerprint(Script(str(path), ("--bf16",)), "cpu A")
    assert script != first  # the same file as a training script: another probe
    assert probe_fingerprint(Script(str(path), ("--fp16",)), "cpu A") != script
    assert probe_fingerprint(Script(str(path), ("--bf16",), {"micro_batch_size": "--batch"}),
                             "cpu A") != script
    path.write_text(TINY_SOURCE + "\n# edited\n")
    assert probe_fingerprint(ModelFile(str(path)), "cpu A") != first


def test_a_studys_stored_fingerprint_still_matches_its_target(write_model) -> None:
    """A study keeps its cached probe while its fingerprint matches: the digest is the one
    studies stored before targets were typed (the file's bytes, its sorted model arguments,
    a script's arguments and named flags, the device and torch)."""
    path = write_model(TINY_SOURCE)

    def stored(model_args: list, *script: list) -> str:
        digest = hashlib.sha256(path.read_bytes())
        for part in [model_args, *script]:
            digest.update(repr(part).encode())
        digest.update(f"cpu A|{torch.__version__}".encode())
        return digest.hexdigest()

    assert probe_fingerprint(ModelFile(str(path), {"dim": 4}), "cpu A") == \
        stored([("dim", 4)])
    assert probe_fingerprint(Script(str(path), ("--bf16",)), "cpu A") == \
        stored([], ["script", "--bf16"])
    assert probe_fingerprint(Script(str(path), (), {"micro_batch_size": "--batch"}),
                             "cpu A") == stored([], ["script"], [("micro_batch_size", "--batch")])


def test_the_announcement_says_when_the_run_ends_what_it_does_and_why_it_grew() -> None:
    ends = time.monotonic() + 1800
    said = announcement(ends, "a trial takes about 30.00 s here", "the default budget grows")
    clocks = {time.strftime("%H:%M", time.localtime(time.time() + s)) for s in (1795, 1800)}
    assert any(said.startswith(f"this run ends by {c} (in 30.0 min): a trial takes about")
               for c in clocks), said
    assert said.endswith("; the default budget grows")
    assert announcement(ends, "a plan", "").endswith(": a plan")
