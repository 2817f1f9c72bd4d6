"""A trial in its own process: every way it can end comes back classified, the parent survives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.isolation import TrialRequest, run_isolated

from .conftest import FAST, TINY_SOURCE

SETTINGS = {"window_steps": 3, "window_seconds": 0.2, "window_max_seconds": 1,
            "warmup_max_seconds": 5, "profile_steps": 0}


def request(path: Path, **overrides) -> TrialRequest:
    fields = {"config": TrainConfig(micro_batch_size=8).to_dict(), "settings": SETTINGS,
              **overrides}
    return TrialRequest(model_path=str(path), device="cpu", **fields)


def with_loss(body: str) -> str:
    return TINY_SOURCE + "\n\ndef loss_fn(model, batch):\n" + \
        "".join(f"    {line}\n" for line in body.splitlines())


def test_ok_trial_reports_metrics_and_keeps_its_log(write_model, tmp_path) -> None:
    log = tmp_path / "logs" / "trial.log"
    result = run_isolated(request(write_model(TINY_SOURCE)), 120, log)
    assert result.status == "ok", result.message
    assert result.metrics["samples_per_sec"] > 0
    assert result.log_path == str(log) and "autotune trial: timing" in log.read_text()


def test_exception_in_loss_is_error_with_the_users_message(write_model) -> None:
    path = write_model(with_loss("raise ValueError('labels out of range: 12 >= 10')"))
    result = run_isolated(request(path), 120)
    assert result.status == "error"
    assert not result.bad_input
    assert "ValueError: labels out of range: 12 >= 10" in result.message
    assert "Traceback" in Path(result.log_path).read_text()


def test_segfault_is_crash(write_model) -> None:
    path = write_model(with_loss("import ctypes\nctypes.string_at(0)"))
    result = run_isolated(request(path), 120)
    assert result.status == "crash"
    assert "SIGSEGV" in result.message


def test_hang_is_timeout_and_its_workers_die_too(write_model) -> None:
    path = write_model(with_loss("import time\ntime.sleep(600)"))
    config = TrainConfig(micro_batch_size=8, num_workers=1).to_dict()
    start = time.monotonic()
    result = run_isolated(request(path, config=config), 6)
    assert result.status == "timeout"
    assert time.monotonic() - start < 20
    leftovers = subprocess.run(["pgrep", "-f", str(path.parent)], capture_output=True,
                               text=True).stdout.split()
    assert leftovers == []


def test_killed_from_outside_is_crash(write_model, tmp_path) -> None:
    """As the kernel's OOM killer does: SIGKILL with no chance to write a result."""
    pid_file = tmp_path / "pid"
    path = write_model(with_loss(f"import os, pathlib, time\n"
                                 f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
                                 "time.sleep(600)"))

    def kill_when_started(phase: str) -> None:
        if phase.startswith("first step"):
            deadline = time.monotonic() + 30
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

    result = run_isolated(request(path), 120, on_phase=kill_when_started)
    assert result.status == "crash"
    assert "SIGKILL" in result.message


OOM_SOURCE = '''
import torch
from torch import nn

def build_model(width=2048):
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4)])

def build_dataset(width=2048):
    return torch.utils.data.TensorDataset(torch.zeros(16384, 1, dtype=torch.int8))

def loss_fn(model, batch):
    x = torch.randn(batch[0].shape[0], model[0][0].in_features)
    return model(x).square().mean()
'''


def test_memory_limit_makes_large_batches_oom(write_model) -> None:
    """800 MiB fits torch, 64 MiB of weights and their Adam state, not 1 GiB of activations."""
    path = write_model(OOM_SOURCE)
    limit = 800 * 2**20
    small = run_isolated(request(path, config=TrainConfig(micro_batch_size=4).to_dict(),
                                 memory_limit_bytes=limit), 120)
    assert small.status == "ok", small.message
    big = run_isolated(request(path, config=TrainConfig(micro_batch_size=16384).to_dict(),
                               memory_limit_bytes=limit), 120)
    assert big.status == "oom", big.message
    assert "allocate" in big.message


def test_cli_exit_codes_for_failed_trials(write_model, capsys) -> None:
    path = write_model(with_loss("raise ValueError('boom')"))
    assert main(["bench", "--model", str(path), "--device", "cpu", "--json", *FAST]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "error" and "boom" in record["message"]
    assert record["samples_per_sec"] is None


@pytest.mark.slow
def test_trial_stops_when_its_tuner_dies(write_model, tmp_path) -> None:
    """A trial must never outlive the process that started it (it would hold the GPU)."""
    pid_file = tmp_path / "pid"
    path = write_model(with_loss(f"import os, pathlib, time\n"
                                 f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
                                 "time.sleep(600)"))
    script = ("import sys; from autotune.isolation import TrialRequest, run_isolated; "
              f"run_isolated(TrialRequest(model_path={str(path)!r}, "
              "config={'micro_batch_size': 8}, device='cpu'), 600)")
    tuner = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    trial_pid = int(pid_file.read_text())
    tuner.kill()
    tuner.wait()
    deadline = time.monotonic() + 5
    while _alive(trial_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(trial_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_cpu_thread_share_reaches_the_trial(tmp_path) -> None:
    """Parallel CPU trials get their share of the CPUs, pinned, and as many intra-op threads;
    the measurement records both."""
    model = tmp_path / "threads.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Linear(2, 1)\n"
        "def build_dataset():\n"
        "    print('threads', torch.get_num_threads(), flush=True)\n"
        "    return torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1))\n"
        "def loss_fn(model, batch):\n"
        "    return nn.functional.mse_loss(model(batch[0]), batch[1])\n")
    request = TrialRequest(model_path=str(model), config={"micro_batch_size": 8},
                           device="cpu", settings={"window_steps": 1, "window_seconds": 0,
                                                   "window_max_seconds": 1,
                                                   "profile_steps": 0}, threads=1, cpus=[0])
    result = run_isolated(request, 120, tmp_path / "trial.log")
    assert result.status == "ok", result.message
    assert "threads 1" in Path(result.log_path).read_text()
    assert result.metrics["cpu_threads"] == 1 and result.metrics["cpu_affinity"] == [0]
