"""What crosses a boundary reads back as it was written, typed; records older than their version
still read."""

from __future__ import annotations

import json

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.target import ModelFile, Script
from autotune.trial.protocol import (
    MEASUREMENT_VERSION,
    Finding,
    LeftOut,
    LoaderRate,
    LossRunSettings,
    Measurement,
    OperatorStat,
    ProbeReport,
    ProbeSettings,
    ProfileSettings,
    StudyIdentity,
    TrialRequest,
    TrialResult,
    TrialStatus,
    UnsupportedSetting,
    WarmTurn,
    WorkKind,
    WorstBatchSettings,
)


def _measurement(**changes: object) -> Measurement:
    figures = dict(samples_per_sec=120.0, window_s=1.0, window_steps=10, window_samples=80,
                   step_time_median_s=0.1, time_to_first_step_s=0.5, setup_s=1.0,
                   warmup_steps=3, warmup_s=0.3, steady=True, peak_memory_bytes=2**20,
                   cpu_affinity=(0, 1),
                   top_operators=(OperatorStat("aten::mm", 30, 0.2, 0.25, 0.4),),
                   work_shares={WorkKind.MATMUL: 0.6, WorkKind.ELEMENTWISE: 0.4},
                   kernels_per_step=812.0,
                   findings=(Finding("host_sync", 0.1, "16 host syncs", "avoid .item()",
                                     ("model.py:12 in loss_fn",)),))
    return Measurement(**{**figures, **changes})


def test_a_result_read_back_from_json_has_its_records_typed() -> None:
    written = TrialResult(TrialStatus.OK, "measured", measurement=_measurement(),
                          config=TrainConfig(micro_batch_size=8, precision="bf16"),
                          log_path="trial.log", wall_s=3.5, rank=1, ended_at=12.0)
    read = TrialResult.from_json(json.loads(json.dumps(written.to_json())))
    assert read == written and read.status is TrialStatus.OK
    assert isinstance(read.measurement.findings[0], Finding)
    assert read.measurement.top_operators[0].name == "aten::mm"
    assert list(read.measurement.work_shares) == [WorkKind.MATMUL, WorkKind.ELEMENTWISE]
    assert read.config.precision == "bf16"
    unsupported = TrialResult(TrialStatus.UNSUPPORTED, "no fused AdamW here",
                              unsupported=UnsupportedSetting("optimizer_impl", "fused"))
    assert TrialResult.from_json(json.loads(json.dumps(unsupported.to_json()))) == unsupported
    assert f"{read.status}" == "ok"  # as the storage spells it
    request = TrialRequest(ModelFile("m.py", {"dim": 8}), config={"micro_batch_size": 8},
                           device="cpu", cpus=[0, 1], threads=2)
    assert TrialRequest.from_json(json.loads(json.dumps(request.to_json()))) == request


def test_a_request_for_a_script_crosses_the_pipe_as_a_script() -> None:
    """The request file a trial's process (or a warm process) reads: its target comes back
    a `Script`, with its arguments and the flags named for its knobs."""
    request = TrialRequest(Script("/w/train.py", ("--output_dir", "out", "--bf16"),
                                  {"micro_batch_size": "--batch"}),
                           config={"micro_batch_size": 8}, device="cpu",
                           settings=ProbeSettings(candidates={}), scratch_dir="/tmp/s",
                           script_baseline={"library": "transformers"})
    read = TrialRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert read == request and isinstance(read.target, Script)
    assert read.target.args == ("--output_dir", "out", "--bf16")
    assert read.target.flags == {"micro_batch_size": "--batch"}
    model = TrialRequest(ModelFile("/w/train.py"), config={}, device="cpu")
    assert TrialRequest.from_json(json.loads(json.dumps(model.to_json()))) != request


@pytest.mark.parametrize("settings", [
    MeasureSettings(window_steps=3, screen_below=12.5, profile_steps=0),
    ProbeSettings(candidates={"precision": ("fp32", "bf16"), "num_workers": (0, 2)}),
    ProfileSettings(out="/tmp/profile", steps=5, top=15, warmup_max_seconds=60.0),
    WorstBatchSettings((42, 7, 7), 50, steps=2, steady=3, max_steps=12),
    LossRunSettings(seed=1, steps=120)],
    ids=["measure", "probe", "profile", "worst_batch", "loss_run"])
def test_a_request_of_each_job_reads_back_with_its_settings_typed(settings) -> None:
    """The request file carries the job's name and its settings as plain data; read back, the
    settings are the job's own type again, and the job is the one they name."""
    request = TrialRequest(ModelFile("m.py"), config={}, device="cpu", settings=settings)
    data = json.loads(json.dumps(request.to_json()))
    assert isinstance(data["settings"], dict) and data["job"] == request.job
    read = TrialRequest.from_json(data)
    assert read == request and type(read.settings) is type(settings)
    assert read.job == {MeasureSettings: "measure", ProbeSettings: "probe",
                        ProfileSettings: "profile", WorstBatchSettings: "worst_batch",
                        LossRunSettings: "loss_run"}[type(settings)]


def test_a_request_whose_settings_have_an_unknown_field_or_job_is_refused() -> None:
    """A field the job does not take is refused by name, never passed on unread."""
    data = TrialRequest(ModelFile("m.py"), config={}, device="cpu").to_json()
    with pytest.raises(ValueError, match="the measure job's settings have no windw_steps"):
        TrialRequest.from_json({**data, "settings": {**data["settings"], "windw_steps": 3}})
    # a measurement's settings sent as the probe's: each field it does not take is named
    with pytest.raises(ValueError, match=r"probe job's settings have no .*window_steps.* "
                                         r"\(they are candidates, loader_seconds, "
                                         r"startup_limit_s\)"):
        TrialRequest.from_json({**data, "job": "probe"})
    with pytest.raises(ValueError, match="job 'train'; this autotune runs measure, probe"):
        TrialRequest.from_json({**data, "job": "train"})


def test_a_result_of_another_format_is_refused_with_a_reason() -> None:
    data = TrialResult(TrialStatus.OOM, "CUDA out of memory").to_json()
    with pytest.raises(ValueError, match="format 0"):
        TrialResult.from_json({**data, "version": 0})


def test_a_measurement_stored_before_it_had_a_version_still_reads() -> None:
    # Studies written before typed records kept each figure as a trial attribute of its own,
    # among the bookkeeping ones, lists where tuples are now, and without the newer fields.
    attrs = {"status": "ok", "config": {"micro_batch_size": 8}, "samples_per_sec": 50.0,
             "window_s": 2.0, "window_steps": 4, "cpu_affinity": [0],
             "findings": [{"kind": "loader", "share": 0.3, "title": "loader-bound",
                           "advice": "add workers", "where": ["build_dataset"]}]}
    m = Measurement.from_json(attrs)
    assert m.samples_per_sec == 50.0 and m.cpu_affinity == (0,)
    assert m.findings[0].where == ("build_dataset",)
    assert m.measure_wall_s is None and not m.disturbed  # fields it lacked: their defaults
    assert Measurement.from_json(m.to_json()) == m
    with pytest.raises(ValueError, match="upgrade autotune"):
        Measurement.from_json({**m.to_json(), "version": MEASUREMENT_VERSION + 1})


def test_time_to_train_counts_start_up_so_compile_pays_only_on_long_runs() -> None:
    plain = _measurement(window_steps=10, window_s=1.0)
    compiled = _measurement(time_to_first_step_s=30.0, window_s=0.5)
    assert plain.time_to_train_s(1) == pytest.approx(1.5)
    assert plain.time_to_train_s(104) == pytest.approx(1.5 + 0.3 + 100 * 0.1)
    assert plain.time_to_train_s(100) < compiled.time_to_train_s(100)
    assert plain.time_to_train_s(10_000) > compiled.time_to_train_s(10_000)


def test_a_study_identity_is_stored_as_studies_always_stored_it() -> None:
    one = StudyIdentity(ModelFile("/m.py", {"dim": 8}), "cpu")
    assert one.to_json() == {"model_path": "/m.py", "model_args": {"dim": 8},
                             "device_type": "cpu"}
    group = StudyIdentity(ModelFile("/m.py"), "cuda", nproc_per_node=2)
    assert StudyIdentity.from_json(json.loads(json.dumps(group.to_json()))) == group
    assert StudyIdentity.from_json(one.to_json()) == one != group


@pytest.mark.parametrize(("stored", "target"), [
    ({"model_path": "/w/m.py", "model_args": {"dim": 8}, "device_type": "cpu"},
     ModelFile("/w/m.py", {"dim": 8})),
    ({"model_path": "/w/m.py", "model_args": {}, "device_type": "cuda", "nproc_per_node": 2},
     ModelFile("/w/m.py")),
    ({"model_path": "/w/train.py", "model_args": {}, "device_type": "cpu",
      "script_args": ["--output_dir", "out"]},
     Script("/w/train.py", ("--output_dir", "out"))),
    ({"model_path": "/w/train.py", "model_args": {}, "device_type": "cpu", "script_args": [],
      "script_flags": {"micro_batch_size": "--batch_size"}},
     Script("/w/train.py", (), {"micro_batch_size": "--batch_size"})),
], ids=["model-file", "model-file-group", "script", "script-named-flags"])
def test_an_identity_stored_before_typed_targets_reads_as_its_target(stored, target) -> None:
    """A study made before the target had a type resumes after: its stored identity reads
    as the right kind of target and writes back exactly what it stored."""
    identity = StudyIdentity.from_json(json.loads(json.dumps(stored)))
    assert identity.target == target and type(identity.target) is type(target)
    assert identity.to_json() == stored


def test_a_probe_report_reads_back_with_what_it_left_out() -> None:
    report = ProbeReport(baseline={"micro_batch_size": 8}, dataset_size=100, state_bytes=4096,
                         parameters=256,
                         left_out=[LeftOut("precision", "bf16", "9.8x slower than fp32"),
                                   LeftOut("num_workers", 2, "the dataset cannot be pickled")],
                         loader_rates=[LoaderRate(0, None, 1000.0)], step_s={"fp32": 0.1})
    assert ProbeReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    assert report.left_out_values() == {"precision": {"bf16": "9.8x slower than fp32"},
                                        "num_workers": {2: "the dataset cannot be pickled"}}
    assert report.left_out[0].describe() == "precision=bf16: 9.8x slower than fp32"


def test_a_script_studys_identity_holds_its_arguments() -> None:
    script = StudyIdentity(Script("/train.py", ("--bf16",)), "cpu")
    assert StudyIdentity.from_json(json.loads(json.dumps(script.to_json()))) == script
    # another argument, none, other named flags, or the same file as a model file: another
    # study
    assert script != StudyIdentity(Script("/train.py", ("--fp16",)), "cpu")
    assert script != StudyIdentity(Script("/train.py"), "cpu")
    assert script != StudyIdentity(Script("/train.py", ("--bf16",), {"micro_batch_size": "--b"}),
                                   "cpu")
    assert script != StudyIdentity(ModelFile("/train.py"), "cpu")
    assert "script_args" not in StudyIdentity(ModelFile("/m.py"), "cpu").to_json()
    assert script.describe() == "/train.py --bf16 on cpu"


def test_a_warm_turn_reads_back_through_json_as_the_record_it_was() -> None:
    """A warm process's answer crosses the pipe as one JSON line and is typed at once."""
    turn = WarmTurn(samples=96, seconds=0.48, peak_memory_bytes=3 << 20, disturbed=True,
                    loss_finite=True)
    back = WarmTurn.from_json(json.loads(json.dumps(turn.to_json())))
    assert back == turn and back.samples_per_sec == pytest.approx(200.0)
    # a line from an older warm process, without the newer fields, still reads
    assert WarmTurn.from_json({"samples": 8, "seconds": 0.5}).disturbed is False
