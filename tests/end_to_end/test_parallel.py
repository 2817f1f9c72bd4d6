"""Several tuners on one study: local processes on the embedded journal and on a real PostgreSQL
server, a tuner killed or frozen mid-trial, the storage lost mid-study, and passwords kept out of
everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.hardware import core_shares
from autotune.study.records import trial_records
from autotune.study.results import load_study

from ..conftest import CONFIRM_ONCE, FAST, ROOT, run_cli

TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256", "--fix", "compile_mode=none"]
FINISHED = (TrialState.COMPLETE, TrialState.FAIL)


class TunerProcess:
    """`autotune run` in the background, its output in files: a pipe nobody reads while the
    test waits would fill and stop the tuner mid-write."""

    def __init__(self, studies: Path, *args: str, workload: Sequence[str] = TINY_MLP,
                 env: dict[str, str] | None = None) -> None:
        logs = studies.with_name(f"{studies.name}-tuners")
        logs.mkdir(exist_ok=True)
        self.out_path, self.err_path = (logs / f"{time.monotonic_ns()}.{kind}"
                                        for kind in ("out", "err"))
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autotune", "run", *workload, *FAST, "--studies-dir",
                 str(studies), "--confirm-top", "1", *CONFIRM_ONCE, *args],
                cwd=ROOT, stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})})
        self.pid = self.process.pid

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def output(self) -> tuple[str, str]:
        return self.out_path.read_text(), self.err_path.read_text()

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Wait for the tuner to end; its stdout and stderr."""
        self.process.wait(timeout=timeout)
        return self.output()

    @property
    def returncode(self) -> int | None:
        return self.process.poll()


def study_of(studies: Path, storage: str | None) -> optuna.Study:
    return load_study("mlp", studies, storage)


def wait_for(predicate, timeout: float = 300, what: str = "the condition",
             tuners: tuple[TunerProcess, ...] = (), seen=lambda: None) -> object:
    """The predicate's first true value; fails at once if one of `tuners` ends first, and at
    the timeout with what `seen()` describes, so a failure on CI explains itself."""
    deadline = time.monotonic() + timeout
    while True:
        with_value = predicate()
        if with_value:
            return with_value
        for tuner in tuners:
            assert tuner.returncode is None, \
                f"tuner {tuner.pid} ended ({tuner.returncode}) before {what}: {tuner.output()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}; saw {seen()}"
        time.sleep(0.2)


def trial_states(studies: Path, storage: str | None) -> list[tuple]:
    """Each trial's number, state, owner and status, as the tests' failure messages show."""
    try:
        trials = study_of(studies, storage).get_trials(deepcopy=False)
    except Exception as exc:
        return [f"no study: {exc}"]
    return [(t.number, t.state.name, t.user_attrs.get("owner"), t.user_attrs.get("status"))
            for t in trials]


def running_trial_of(studies: Path, storage: str | None, pid: int, after: int = 0):
    """A trial that process `pid` is measuring, once at least `after` trials completed."""
    try:
        trials = study_of(studies, storage).get_trials(deepcopy=False)
    except Exception:
        return None  # the study is not created yet
    if sum(t.state == TrialState.COMPLETE for t in trials) < after:
        return None
    return next((t for t in trials if t.state == TrialState.RUNNING and "config" in t.user_attrs
                 and t.user_attrs.get("owner", "").endswith(f":{pid}")), None)


def check_accounted(study: optuna.Study, budget: int, lost: int, confirmed: bool = True) -> None:
    trials = study.get_trials(deepcopy=False)
    assert all(t.state in FINISHED for t in trials), Counter(t.state.name for t in trials)
    measured = [t for t in trials if t.state == TrialState.COMPLETE
                and "duplicate_of" not in t.user_attrs
                and t.user_attrs.get("status") != "oom_predicted"]
    # Each assertion says what it saw, so that a rare failure on CI explains itself (one on
    # PostgreSQL, 2026-11-23, did not come back in 4 runs).
    assert len(measured) >= budget, [(t.number, t.state.name, t.user_attrs.get("status"))
                                     for t in trials]
    orphan = study.trials[lost]
    assert orphan.state == TrialState.FAIL and orphan.user_attrs["status"] == "orphaned", \
        (orphan.state.name, orphan.user_attrs)
    reruns = [t for t in trials if t.user_attrs.get("requeued_from") == lost]
    assert len(reruns) == 1 and reruns[0].state == TrialState.COMPLETE, \
        [(t.number, t.state.name, t.user_attrs) for t in reruns]
    assert reruns[0].params == orphan.params
    if confirmed:
        assert study.user_attrs["confirmation"]["winner"] is not None, \
            study.user_attrs["confirmation"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["journal", "postgres"])
def test_tuners_share_a_study_and_rerun_a_killed_ones_trial(backend, tmp_path, request) -> None:
    """Four processes on the embedded journal, three on PostgreSQL; one SIGKILLed mid-trial."""
    storage = request.getfixturevalue("postgres").url if backend == "postgres" else None
    count, budget = (4, 12) if backend == "journal" else (3, 12)
    extra = ["--storage", storage] if storage else []
    tuners = []
    for _ in range(count):  # started a moment apart, as people do
        tuners.append(TunerProcess(tmp_path, "--trials", str(budget), *extra))
        time.sleep(1.0)
    victim = tuners[1]
    trial = wait_for(lambda: running_trial_of(tmp_path, storage, victim.pid, after=2),
                     what="the victim to be mid-trial", tuners=tuple(tuners),
                     seen=lambda: trial_states(tmp_path, storage))
    victim.send_signal(signal.SIGKILL)
    for tuner in tuners:
        out, err = tuner.communicate(timeout=600)
        if tuner is not victim:
            assert tuner.returncode == 0, err
    check_accounted(study_of(tmp_path, storage), budget, trial.number)
    shown = run_cli("show", "mlp", "--studies-dir", str(tmp_path), *extra)
    assert "retried" in shown.stdout


# A model whose bf16 steps are ten times slower than fp32 where DISAGREE=1, as on a busy or
# bf16-emulating machine, and whose dataset takes 8 s to build there: that tuner's probe ends
# well after the other's has created the study.
DISAGREEING_MODEL = """
import os
import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8}


def slow() -> bool:
    return os.environ.get("DISAGREE") == "1"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x, y):
        half = torch.is_autocast_enabled("cpu")
        time.sleep(0.2 if half and slow() else 0.02)
        return nn.functional.mse_loss(self.layer(x).sum(dim=1), y)


def build_model():
    return Net()


def build_dataset():
    if slow():
        time.sleep(8)
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g),
                                          torch.randn(256, generator=g))
"""


@pytest.mark.slow
def test_tuners_whose_probes_disagree_join_one_study_with_its_creators_probe(
        tmp_path, write_model) -> None:
    """Two tuners started together on a new study: their probes time bf16 differently (a busy
    machine does that). The one that finds the study created while it probed joins it with
    the study's probe, rather than refusing the study's space as another's."""
    model = write_model(DISAGREEING_MODEL, "disagree.py")
    workload = ["--model", str(model), "--device", "cpu", "--fix", "compile_mode=none"]
    studies = tmp_path / "studies"
    tuners = [TunerProcess(studies, "--trials", "2", workload=workload, env={"DISAGREE": flag})
              for flag in ("0", "1")]
    outputs = [" ".join(tuner.communicate(timeout=600)[0].split()) for tuner in tuners]
    for tuner in tuners:
        assert tuner.returncode == 0, tuner.output()
    joined = [out for out in outputs if "another tuner created this study while" in out]
    assert len(joined) == 1, outputs
    creator = outputs[1 - outputs.index(joined[0])]
    report = load_study("disagree", studies).user_attrs["probe"]["report"]
    bf16_left_out = any(item["value"] == "bf16" for item in report["left_out"])
    assert bf16_left_out == ("left out: precision=bf16" in creator), (report, creator)
    assert bf16_left_out != ("left out: precision=bf16" in joined[0].split("decide the space")[0]
                             ), "the two probes agreed: the test did not make them disagree"


@pytest.mark.slow
def test_a_frozen_tuner_loses_its_trial_by_heartbeat(tmp_path) -> None:
    """A tuner that stops beating (SIGSTOP: as a lost node looks to the others) has its trial
    failed and re-run by the other; resumed, it learns its result was taken over."""
    beat = ["--heartbeat-interval", "0.5", "--trials", "5"]
    frozen = TunerProcess(tmp_path, *beat)
    trial = wait_for(lambda: running_trial_of(tmp_path, None, frozen.pid),
                     what="a trial of the first tuner")
    frozen.send_signal(signal.SIGSTOP)
    try:
        other = TunerProcess(tmp_path, *beat)
        out, err = other.communicate(timeout=600)
        assert other.returncode == 0, err
        assert "lost its tuner (no heartbeat" in " ".join(out.split())
    finally:
        frozen.send_signal(signal.SIGCONT)
    out, err = frozen.communicate(timeout=600)
    assert frozen.returncode == 0, err
    study = study_of(tmp_path, None)
    # Five trials of a tiny model may all screen below the baseline (CI, 2026-11-25): then
    # there is nothing to confirm, which is not what this test is about.
    check_accounted(study, 5, trial.number, confirmed=False)
    assert "no heartbeat" in study.trials[trial.number].user_attrs["message"]


@pytest.mark.slow
def test_workers_option_runs_trials_at_once(tmp_path) -> None:
    done = run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--trials", "4",
                   "--workers", "2", "--confirm-repeats", "0", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "disturb each other's timings" in " ".join(done.stdout.split())
    trials = study_of(tmp_path, None).get_trials(deepcopy=False)
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials
                   if t.user_attrs.get("status") in ("ok", "screened"))
    assert len(spans) >= 4
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), \
        "some trials overlapped in time"
    # Each ran pinned to its own share of the cores, so the other was not its contention.
    shares = core_shares(2)
    measured = [r.measurement for r in trial_records(study_of(tmp_path, None)) if r.measurement]
    assert measured and all(list(m.cpu_affinity) in shares
                            and m.cpu_threads == len(m.cpu_affinity) for m in measured)


@pytest.mark.slow
def test_storage_briefly_down_mid_study(postgres, tmp_path) -> None:
    tuner = TunerProcess(tmp_path, "--storage", postgres.url, "--trials", "4",
                        "--study", "outage")
    wait_for(lambda: _completed(postgres.url, "outage") >= 1, what="a first trial")
    postgres.stop()
    time.sleep(3)
    postgres.start()
    out, err = tuner.communicate(timeout=600)
    assert tuner.returncode == 0, err
    study = optuna.load_study(study_name="outage", storage=postgres.url)
    assert all(t.state in FINISHED for t in study.trials)
    assert _completed(postgres.url, "outage") >= 4


@pytest.mark.slow
def test_storage_down_too_long_is_a_clear_error(postgres, tmp_path) -> None:
    tuner = TunerProcess(tmp_path, "--storage", postgres.url, "--trials", "20",
                        "--study", "lost", "--storage-retry-seconds", "2")
    wait_for(lambda: _completed(postgres.url, "lost") >= 1, what="a first trial")
    postgres.stop()
    try:
        out, err = tuner.communicate(timeout=300)
    finally:
        postgres.start()
    assert tuner.returncode == 1
    message = " ".join(err.split())
    assert "unreachable for" in message and "run the same command to continue" in message
    assert "Traceback" not in err and postgres.password not in out + err
    assert _completed(postgres.url, "lost") >= 1  # what finished is still there


def _completed(url: str, name: str) -> int:
    """Polled: each call's connections are closed, or a long wait uses up the server's."""
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        return sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    except KeyError:
        return 0
    finally:
        storage.engine.dispose()


@pytest.mark.slow
def test_password_appears_nowhere(postgres, tmp_path) -> None:
    url, secret = postgres.url, postgres.password
    outputs = [run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--storage",
                       url, "--study", "secret", "--trials", "2", *CONFIRM_ONCE,
                       timeout=600)]
    assert outputs[0].returncode == 0, outputs[0].stderr
    report = tmp_path / "report.html"
    for command in (["studies"], ["show", "secret"], ["show", "secret", "--json"],
                    ["export", "secret", "--format", "torch"],
                    ["export", "secret", "--format", "hf", "-o", str(tmp_path / "hf.json")],
                    ["report", "secret", "-o", str(report)]):
        done = run_cli(*command, "--studies-dir", str(tmp_path), "--storage", url)
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done)
    wrong = url.replace(f":{postgres.port}/", ":1/")  # nothing listens there
    for command in (["run", *TINY_MLP, "--trials", "1"], ["studies"], ["show", "x"],
                    ["report", "x"]):
        done = run_cli(*command, "--studies-dir", str(tmp_path), "--storage", wrong)
        assert done.returncode == 2, (command, done.stderr)
        assert "cannot open storage" in done.stderr and "Traceback" not in done.stderr
        outputs.append(done)
    for done in outputs:
        assert secret not in done.stdout + done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert report in written and any(p.suffix == ".log" for p in written)
    for path in written:
        assert secret not in path.read_text(errors="replace"), path


