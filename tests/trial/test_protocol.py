"""What crosses the process boundary reads back as it was written, typed."""

from __future__ import annotations

import json
from dataclasses import asdict

from autotune.trial.protocol import (
    LeftOut,
    LoaderRate,
    ProbeReport,
    TrialRequest,
    TrialResult,
    TrialStatus,
)


def test_a_result_read_back_from_json_has_its_status_typed() -> None:
    written = TrialResult(TrialStatus.OOM, "CUDA out of memory", {"peak_memory_bytes": 3})
    read = TrialResult(**json.loads(json.dumps(written.to_dict())))
    assert read == written and read.status is TrialStatus.OOM
    assert read.status == "oom" and f"{read.status}" == "oom"  # as the storage spells it
    request = TrialRequest(model_path="m.py", config={"micro_batch_size": 8}, device="cpu",
                           cpus=[0, 1], threads=2)
    assert TrialRequest(**json.loads(json.dumps(asdict(request)))) == request


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
