"""A trial in its own process: every way it can end comes back classified, the parent survives.

Each fault runs twice: in a new interpreter, and forked from a fork server that has imported
torch and the model file (what the tuner uses); both must end the same way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.forkserver import ForkServer
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile, Script
from autotune.trial.protocol import (
    FIRST_STEP,
    SCRIPT_STARTUP,
    ProbeSettings,
    TrialRequest,
    TrialResult,
)

from ..conftest import FAST, ROOT, TINY_SOURCE

LAUNCHERS = ["fresh", "forked"]

SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.2, window_max_seconds=1,
                           warmup_max_seconds=5, profile_steps=0)


def request(path: Path, **overrides) -> TrialRequest:
    fields = {"target": ModelFile(str(path)), "config": TrainConfig(micro_batch_size=8).to_dict(),
              "settings": SETTINGS, **overrides}
    return TrialRequest(device="cpu", **fields)


def isolated(launcher: str, request: TrialRequest, limit: float,
             log: Path | None = None, **kwargs) -> TrialResult:
    """`run_isolated` in a new interpreter, or forked from a fork server of the model file."""
    if launcher == "fresh":
        return run_isolated(request, limit, log, **kwargs)
    server_log = Path(request.target.path).with_suffix(".forkserver.log")
    with ForkServer(request.target.path, server_log, 120) as server:
        return run_isolated(request, limit, log, server=server, **kwargs)


def with_loss(body: str) -> str:
    return TINY_SOURCE + "\n\ndef loss_fn(model, batch):\n" + \
        "".join(f"    {line}\n" for line in body.splitlines())


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ok_trial_reports_metrics_and_keeps_its_log(launcher, write_model, tmp_path) -> None:
    log = tmp_path / "logs" / "trial.log"
    result = isolated(launcher, request(write_model(TINY_SOURCE)), 120, log)
    assert result.status == "ok", result.message
    assert result.measurement.samples_per_sec > 0
    assert result.log_path == str(log)
    # each phase with when it began in the trial, in order: where a trial's time went
    began = [float(m) for m in re.findall(r"^autotune trial: .+ \(at ([\d.]+) s\)$",
                                          log.read_text(), re.MULTILINE)]
    assert "autotune trial: timing (at " in log.read_text() and began == sorted(began)
    assert len(began) >= 4


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_exception_in_loss_is_error_with_the_users_message(launcher, write_model) -> None:
    path = write_model(with_loss("raise ValueError('labels out of range: 12 >= 10')"))
    result = isolated(launcher, request(path), 120)
    assert result.status == "error"
    assert not result.bad_input
    assert "ValueError: labels out of range: 12 >= 10" in result.message
    assert "Traceback" in Path(result.log_path).read_text()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_segfault_is_crash(launcher, write_model) -> None:
    path = write_model(with_loss("import ctypes\nctypes.string_at(0)"))
    result = isolated(launcher, request(path), 120)
    assert result.status == "crash"
    assert "SIGSEGV" in result.message


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_hang_is_timeout_that_says_where_it_struck_and_its_workers_die_too(launcher,
                                                                          write_model) -> None:
    """A compile in the first step that outlasts the limit is worth a second try, so the
    timeout says it struck there (the limit leaves a loaded machine time to get there)."""
    path = write_model(with_loss("import time\ntime.sleep(600)"))
    config = TrainConfig(micro_batch_size=8, num_workers=1).to_dict()
    start = time.monotonic()
    result = isolated(launcher, request(path, config=config), 12)
    assert result.status == "timeout"
    assert result.phase == FIRST_STEP and FIRST_STEP in result.message
    assert time.monotonic() - start < 30
    leftovers = subprocess.run(["pgrep", "-f", str(path.parent)], capture_output=True,
                               text=True).stdout.split()
    assert leftovers == []


def test_the_result_says_in_which_phase_the_trial_ended(write_model) -> None:
    result = run_isolated(request(write_model(with_loss("raise ValueError('boom')"))), 120)
    assert result.status == "error" and result.phase == FIRST_STEP


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_killed_from_outside_is_crash(launcher, write_model, tmp_path) -> None:
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

    result = isolated(launcher, request(path), 120, on_phase=kill_when_started)
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


# What a trial's process holds before it allocates anything (VmData: heap and private mappings,
# what the CPU memory limit counts): torch's own is ~0.2 GiB in a CPU build of torch and ~0.75
# GiB in a CUDA build.
IMPORTED_DATA = """
import autotune.trial.child, torch
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
           if line.startswith("VmData:")))
"""


@pytest.fixture(scope="module")
def imported_data_bytes() -> int:
    done = subprocess.run([sys.executable, "-c", IMPORTED_DATA], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return int(done.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_memory_limit_makes_large_batches_oom(launcher, write_model,
                                              imported_data_bytes) -> None:
    """600 MiB beyond what the process holds with torch imported fits 64 MiB of weights and
    their Adam state, not 1 GiB of activations (a fixed 800 MiB left a CUDA build of torch
    no room for the weights)."""
    path = write_model(OOM_SOURCE)
    limit = imported_data_bytes + 600 * 2**20
    small = isolated(launcher, request(path, config=TrainConfig(micro_batch_size=4).to_dict(),
                                       memory_limit_bytes=limit), 120)
    assert small.status == "ok", small.message
    big = isolated(launcher, request(path, config=TrainConfig(micro_batch_size=16384).to_dict(),
                                     memory_limit_bytes=limit), 120)
    assert big.status == "oom", big.message
    assert "allocate" in big.message


CUBLAS_CREATE = "`cublasCreate(handle)`"




def test_a_cublas_allocation_failure_in_a_trial_is_an_oom_result(write_model) -> None:
    path = write_model(with_loss(
        f"raise RuntimeError('CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
        f"{CUBLAS_CREATE}')"))
    result = run_isolated(request(path), 120)
    assert result.status == "oom", result.message


ENV_SOURCE = TINY_SOURCE + """
import os
print("visible", os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"),
      flush=True)
"""


def test_a_cuda_trial_is_started_seeing_its_gpu_alone(write_model, monkeypatch) -> None:
    """`--devices cuda:1` under CUDA_VISIBLE_DEVICES=<uuid>,<uuid>: the child sees the second
    GPU alone, by its UUID, and is told to use cuda:0. (Without CUDA here the trial then
    fails; what matters is how it was started.)"""
    second = "GPU-66666666-7777-8888-9999-000000000000"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-11111111-2222-3333-4444-555555555555,"
                                               f"{second}")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    path = write_model(ENV_SOURCE)
    result = run_isolated(TrialRequest(ModelFile(str(path)), device="cuda:1",
                                       config=TrainConfig(micro_batch_size=8).to_dict()), 120)
    log = Path(result.log_path).read_text()
    assert f"visible {second} PCI_BUS_ID" in log
    assert "on cuda:0" in log


@pytest.mark.slow
def test_a_process_group_is_started_seeing_its_own_gpus(write_model, monkeypatch) -> None:
    """`--devices cuda:2,cuda:3 --nproc-per-node 2` under four visible GPUs: each rank sees
    those two alone, by their entries here (each rank then fails without CUDA)."""
    gpus = [f"GPU-{i}1111111-2222-3333-4444-555555555555" for i in range(4)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(gpus))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    path = write_model(TINY_SOURCE)
    result = run_isolated(TrialRequest(
        ModelFile(str(path)), device="cuda:2", nproc_per_node=2,
        group_devices=["cuda:2", "cuda:3"],
        config=TrainConfig(micro_batch_size=8, parallelism="ddp").to_dict()), 120)
    log = Path(result.log_path).read_text()
    # every rank that got as far as saying it (torchrun ends the other when one fails)
    seen = [line.split("GPUs visible: ")[1] for line in log.splitlines()
            if "GPUs visible: " in line]
    assert seen and set(seen) == {f"{gpus[2]},{gpus[3]}"}


def test_cli_exit_codes_for_failed_trials(write_model, capsys) -> None:
    path = write_model(with_loss("raise ValueError('boom')"))
    assert main(["bench", "--model", str(path), "--device", "cpu", "--json", *FAST]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "error" and "boom" in record["message"]
    assert record["samples_per_sec"] is None


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_trial_stops_when_its_tuner_dies(launcher, write_model, tmp_path) -> None:
    """A trial must never outlive the process that started it (it would hold the GPU)."""
    pid_file = tmp_path / "pid"
    path = write_model(with_loss(f"import os, pathlib, time\n"
                                 f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
                                 "time.sleep(600)"))
    script = ("from tests.search.test_isolation import isolated; "
              "from autotune.target import ModelFile; "
              "from autotune.trial.protocol import TrialRequest; "
              f"isolated({launcher!r}, TrialRequest(ModelFile({str(path)!r}), "
              "config={'micro_batch_size': 8}, device='cpu'), 600)")
    tuner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
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
    """Parallel trials get their share of the cores, pinned, and as many intra-op threads; the
    measurement records both."""
    model = tmp_path / "threads.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Linear(2, 1)\n"
        "def build_dataset():\n"
        "    print('threads', torch.get_num_threads(), flush=True)\n"
        "    import os\n"
        "    print('cores', sorted(os.sched_getaffinity(0)), flush=True)\n"
        "    return torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1))\n"
        "def loss_fn(model, batch):\n"
        "    return nn.functional.mse_loss(model(batch[0]), batch[1])\n")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    request = TrialRequest(ModelFile(str(model)), config={"micro_batch_size": 8},
                           device="cpu", threads=1, cpus=[cpu],
                           settings=MeasureSettings(window_steps=1, window_seconds=0,
                                                    profile_steps=0))
    result = run_isolated(request, 120, tmp_path / "trial.log")
    assert result.status == "ok", result.message
    assert "threads 1" in Path(result.log_path).read_text()
    assert f"cores [{cpu}]" in Path(result.log_path).read_text()
    assert result.measurement.cpu_threads == 1 and result.measurement.cpu_affinity == (cpu,)


# --- a process group: every rank's end, every rank killed --------------------------------------

def on_rank(rank: int, body: str, pid_dir: Path | None = None) -> str:
    """A loss function that runs `body` on one rank of a group, after its first step (so the
    other rank is inside a collective by then); each rank writes its pid to `pid_dir`."""
    pids = ("import pathlib\n"
            f"pathlib.Path({str(pid_dir)!r}, os.environ['RANK']).write_text(str(os.getpid()))\n"
            if pid_dir else "")
    return with_loss(
        "import os, torch\nglobal calls\ncalls = globals().get('calls', 0) + 1\n" + pids +
        f"if calls > 1 and os.environ['RANK'] == '{rank}':\n" +
        "".join(f"    {line}\n" for line in body.splitlines()) +
        "return model(*batch)")


def group_request(path: Path) -> TrialRequest:
    return request(path, nproc_per_node=2,
                   config=TrainConfig(micro_batch_size=8, parallelism="ddp").to_dict())


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.slow
def test_a_process_group_trial_measures_every_rank(write_model) -> None:
    result = run_isolated(group_request(write_model(TINY_SOURCE)), 180)
    assert result.status == "ok", result.message
    m = result.measurement
    assert m.world_size == 2 and len(m.rank_samples_per_sec) == 2
    # the group's rate is every rank's samples over the slowest rank's window
    assert sum(m.rank_samples_per_sec) >= m.samples_per_sec * 0.999
    assert m.peak_memory_bytes == max(m.rank_peak_memory_bytes)
    assert result.config.parallelism == "ddp"


@pytest.mark.slow
@pytest.mark.parametrize(("rank", "code", "status", "message"), [
    (1, "torch.empty(2**46, dtype=torch.uint8)", "oom", "rank 1 of 2: "),
    (0, "os.kill(os.getpid(), 9)", "crash", "rank 0 of 2 died with no result"),
])
def test_a_rank_that_fails_alone_decides_the_trial_and_is_named(rank, code, status, message,
                                                                 write_model) -> None:
    result = run_isolated(group_request(write_model(on_rank(rank, code))), 180)
    assert result.status == status, result.message
    assert result.message.startswith(message)


@pytest.mark.slow
def test_a_rank_hanging_in_a_collective_is_a_timeout_with_every_rank_killed(write_model,
                                                                            tmp_path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # rank 1 sleeps; rank 0 waits for it in DDP's gradient all_reduce
    path = write_model(on_rank(1, "import time\ntime.sleep(600)", pid_dir))
    start = time.monotonic()
    result = run_isolated(group_request(path), 18)
    assert result.status == "timeout"
    assert "killed with all 2 ranks" in result.message
    assert time.monotonic() - start < 33
    pids = [int(p.read_text()) for p in pid_dir.iterdir()]
    assert len(pids) == 2 and _wait_gone(pids, 2) == []


@pytest.mark.slow
def test_every_rank_stops_when_its_tuner_dies(write_model, tmp_path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    path = write_model(on_rank(1, "import time\ntime.sleep(600)", pid_dir))
    script = ("from tests.search.test_isolation import group_request; "
              "from autotune.search.isolation import run_isolated; "
              f"from pathlib import Path; run_isolated(group_request(Path({str(path)!r})), 600)")
    tuner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(list(pid_dir.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in pid_dir.iterdir()]
    tuner.kill()
    tuner.wait()
    assert len(pids) == 2 and _wait_gone(pids, 10) == []


def _sleeping_script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("from pathlib import Path\nimport time\n"
                      "Path('started.txt').write_text('yes')\ntime.sleep(600)\n")
    return script


@pytest.mark.parametrize("ending", ["watch", "stop"])
def test_a_scripts_scratch_folder_and_the_trials_files_go_however_it_ends(
        ending: str, tmp_path: Path, monkeypatch) -> None:
    """The script runs in a scratch folder inside the trial's folder in the temp directory;
    a watch that ends it (the probe's start-up limit) or an interruption leaves neither."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    script = _sleeping_script(tmp_path)
    stop = threading.Event()

    def started() -> bool:
        return any(temp.glob("autotune-trial-*/scratch/autotune-script-*/cwd/started.txt"))

    def watch(phase: str, elapsed: float) -> bool:
        if started():
            stop.set()
        return ending == "watch" and started()

    given = request(script, target=Script(str(script)), settings=ProbeSettings(candidates={}))
    if ending == "watch":
        result = run_isolated(given, 120, tmp_path / "probe.log", watch=watch)
        assert result.status == "timeout" and result.phase == SCRIPT_STARTUP
    else:
        with pytest.raises(KeyboardInterrupt):
            run_isolated(given, 120, tmp_path / "probe.log", watch=watch, stop=stop)
    assert list(temp.iterdir()) == []
    assert not (tmp_path / "started.txt").exists()
