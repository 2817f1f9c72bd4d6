"""Findings in words: host syncs named by line, copies and hot operators named by function, and
`autotune profile` writing a trace and a memory timeline."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib.image
import pytest
import torch

from autotune.config import TrainConfig, from_baseline
from autotune.diagnosis import SYNC_METHODS, trace_host_syncs
from autotune.measure import MeasureSettings, profile_config
from autotune.profiling import memory_categories
from autotune.workload import load_workload

from .conftest import TEST_MODELS, run_cli

SYNC_MODEL = TEST_MODELS / "sync_loss.py"
ATTENTION_MODEL = TEST_MODELS / "naive_attention.py"


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_sync_tracer_names_the_users_lines_and_restores_torch() -> None:
    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    x = torch.ones(3)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], foreach=False)

    def step() -> None:
        value = x.sum().item()
        print(x, end="", file=io.StringIO())  # repr reads every element: one site, not three
        if x.sum() > value:
            pass
        x.cpu()  # a CPU tensor: no copy, no sync
        opt.step()  # the optimizer's own .item() calls are torch's, not the user's

    sites = trace_host_syncs(step, steps=2)
    found = {(s.call, s.line): s.calls_per_step for s in sites}
    here = Path(__file__)
    assert found == {
        (".item()", _line_of(here, "value = x.sum().item()")): 1.0,
        ("print(tensor)", _line_of(here, 'print(x, end=""')): 1.0,
        ("bool(tensor) / if tensor", _line_of(here, "if x.sum() > value")): 1.0,
    }
    assert all(s.file == str(here) and s.function == "step" for s in sites)
    assert {name: getattr(torch.Tensor, name) for name in SYNC_METHODS} == originals


class _Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(float(torch.tensor(index)))  # a host read while loading data


def test_sync_tracer_leaves_data_loading_and_host_tensors_out() -> None:
    loader = iter(torch.utils.data.DataLoader(_Items(), batch_size=4))
    sites = trace_host_syncs(lambda: next(loader).sum().item())
    assert [s.call for s in sites] == [".item()"]  # the read in data loading is not a sync
    loader = iter(torch.utils.data.DataLoader(_Items(), batch_size=4))
    # On a GPU run, reading a tensor that lives on the host waits for nothing.
    assert trace_host_syncs(lambda: next(loader).sum().item(), device_type="cuda") == []


def _profile(model: Path, tmp_path: Path, **knobs: object):
    workload = load_workload(model, {})
    config = TrainConfig.from_dict(knobs, base=from_baseline(workload.baseline, "cpu"))
    # One intra-op thread: on a busy machine OpenMP's spinning threads would inflate the
    # matmuls' share and blur what each test looks for.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return profile_config(workload, config, torch.device("cpu"), tmp_path, steps=2,
                              settings=MeasureSettings(warmup_max_steps=3))
    finally:
        torch.set_num_threads(threads)


def test_item_in_a_loop_gets_a_sync_finding_naming_that_line(tmp_path) -> None:
    report = _profile(SYNC_MODEL, tmp_path)
    syncs = [f for f in report.findings if f.kind == "host_sync"]
    assert len(syncs) == 1
    line = _line_of(SYNC_MODEL, ".abs().item()")
    assert any(f"sync_loss.py:{line} in loss_fn" in where and "16 per step" in where
               for where in syncs[0].where), syncs[0].where
    assert report.host_syncs_per_step >= 16  # the profiler counted them as well


def test_naive_attention_is_blamed_on_its_forward(tmp_path) -> None:
    report = _profile(ATTENTION_MODEL, tmp_path)
    blamed = [f for f in report.findings if f.kind in ("copies", "hot_operator")]
    assert blamed, [f.title for f in report.findings]
    forward = _line_of(ATTENTION_MODEL, "def forward(self, x: torch.Tensor)")
    assert any(f"naive_attention.py:{forward}" in where for f in blamed for where in f.where)
    assert report.tables["cpu"] and report.tables["input shape"]
    assert all(not op.name.startswith("<") for op in report.tables["cpu"])  # operators only


def test_memory_categories_hold_parameters_and_optimizer_state() -> None:
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 64)
    with torch.profiler.profile(record_shapes=True, profile_memory=True,
                                with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    times, series = memory_categories(prof, torch.device("cpu"))
    assert times[0] == 0 and times == sorted(times)
    weights = 64 * 64 * 4 + 64 * 4
    assert series["parameter"][0] == weights  # held from the start
    assert max(series["optimizer_state"]) >= 2 * weights  # AdamW's two moments


@pytest.mark.slow
def test_profile_command_writes_trace_memory_image_and_findings(tmp_path) -> None:
    out = tmp_path / "prof"
    done = run_cli("profile", "--model", str(SYNC_MODEL), "--device", "cpu", "--steps", "2",
                   "--set", "micro_batch_size=8", "--out", str(out))
    assert done.returncode == 0, done.stderr
    line = _line_of(SYNC_MODEL, ".abs().item()")
    assert f"sync_loss.py:{line}" in done.stdout
    for title in ("samples/sec", "self CPU total", "Top operators by self CPU time",
                  "Top operators by input shape", "findings (what to fix first)"):
        assert title in done.stdout
    traces = list((out / "trace").glob("*.pt.trace.json"))  # TensorBoard's plugin's naming
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in events)
    image = (out / "memory.png").read_bytes()
    assert image.startswith(b"\x89PNG\r\n\x1a\n")
    assert matplotlib.image.imread(io.BytesIO(image), format="png").shape[0] > 100
    saved = json.loads((out / "profile.json").read_text())
    assert saved["config"]["micro_batch_size"] == 8
    assert any(f["kind"] == "host_sync" for f in saved["findings"])
    assert f"sync_loss.py:{line}" in (out / "profile.txt").read_text()


def test_profile_rejects_bad_input_with_exit_2(tmp_path) -> None:
    done = run_cli("profile", "--model", str(SYNC_MODEL), "--device", "cpu",
                   "--set", "precision=fp64", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "precision" in done.stderr and "Traceback" not in done.stderr
