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

from ..conftest import CONFIRM_ONCE, FAST, ROOT, TINY_MLP, cli, run_cli
from .conftest import copy_of

pytestmark = pytest.mark.slow

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
    if confirmed:  # (once missing on a CI run 1.6x slower than usual: say what ran)
        assert (study.user_attrs.get("confirmation") or {}).get("winner") is not None, (
            study.user_attrs.get("confirmation"),
            [(t.number, t.state.name, t.user_attrs.get("status"), t.value) for t in trials])


class SharedStudy:
    """Tuners that shared one study on PostgreSQL: the study's folder, its storage's URL, where
    the tuners' output went, and the trial the killed one was measuring."""

    def __init__(self, studies: Path, url: str, lost: int) -> None:
        self.studies, self.url, self.lost = studies, url, lost
        self.outputs = studies.with_name(f"{studies.name}-tuners")


@pytest.fixture(scope="module")
def shared_on_postgres(postgres, tmp_path_factory) -> SharedStudy:
    """Three tuners on one study on a real PostgreSQL server, started a moment apart as people
    do; the second SIGKILLed mid-trial once two trials are done, the others finish. Its trial
    is found silent after 3 heartbeats of 2 s, while the others still have trials to start (at
    the default 10 s, 6 trials could all be done before: CI, 91f83ca)."""
    studies = tmp_path_factory.mktemp("shared") / "studies"
    tuners = []
    for _ in range(3):
        tuners.append(TunerProcess(studies, "--trials", "8", "--heartbeat-interval", "2",
                                   "--storage", postgres.url))
        time.sleep(1.0)
    victim = tuners[1]
    trial = wait_for(lambda: running_trial_of(studies, postgres.url, victim.pid, after=2),
                     what="the victim to be mid-trial", tuners=tuple(tuners),
                     seen=lambda: trial_states(studies, postgres.url))
    victim.send_signal(signal.SIGKILL)
    for tuner in tuners:
        _, err = tuner.communicate(timeout=600)
        if tuner is not victim:
            assert tuner.returncode == 0, err
    return SharedStudy(studies, postgres.url, trial.number)


def test_tuners_share_a_study_and_rerun_a_killed_ones_trial(
        shared_on_postgres: SharedStudy) -> None:
    shared = shared_on_postgres
    check_accounted(study_of(shared.studies, shared.url), 8, shared.lost)
    shown = cli("show", "mlp", "--studies-dir", str(shared.studies), "--storage", shared.url)
    assert "retried" in shown.stdout


# A model whose bf16 steps are ten times slower than fp32 where DISAGREE=1, as on a busy or
# bf16-emulating machine, and whose dataset takes 8 s to build there the first time, in that
# tuner's probe: its probe ends well after the other's has created the study.
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
    probed = os.path.join(os.path.dirname(__file__), "probed")
    if slow() and not os.path.exists(probed):  # the probe's build, not the trials'
        time.sleep(8)
        open(probed, "w").close()
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g),
                                          torch.randn(256, generator=g))
"""


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


def test_a_frozen_tuner_loses_its_trial_by_heartbeat(mlp_template: Path, tmp_path) -> None:
    """Two tuners on one journal: one stops beating (SIGSTOP: as a lost node looks to the
    others) and has its trial failed and re-run by the other; resumed, it learns its result
    was taken over."""
    studies = copy_of(mlp_template, tmp_path)
    beat = ["--heartbeat-interval", "0.5", "--trials", "5"]
    frozen = TunerProcess(studies, *beat)
    trial = wait_for(lambda: running_trial_of(studies, None, frozen.pid),
                     what="a trial of the first tuner")
    frozen.send_signal(signal.SIGSTOP)
    try:
        other = TunerProcess(studies, *beat)
        out, err = other.communicate(timeout=600)
        assert other.returncode == 0, err
        assert "lost its tuner (no heartbeat" in " ".join(out.split())
    finally:
        frozen.send_signal(signal.SIGCONT)
    out, err = frozen.communicate(timeout=600)
    assert frozen.returncode == 0, err
    study = study_of(studies, None)
    # Five trials of a tiny model may all screen below the baseline (CI, 2026-11-25): then
    # there is nothing to confirm, which is not what this test is about.
    check_accounted(study, 5, trial.number, confirmed=False)
    assert "no heartbeat" in study.trials[trial.number].user_attrs["message"]


def test_workers_option_runs_trials_at_once(tmp_path) -> None:
    done = run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--trials", "3",
                   "--workers", "2", "--confirm-repeats", "0", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "disturb each other's timings" in " ".join(done.stdout.split())
    trials = study_of(tmp_path, None).get_trials(deepcopy=False)
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials
                   if t.user_attrs.get("status") in ("ok", "screened"))
    assert len(spans) >= 3
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), \
        "some trials overlapped in time"
    # Each ran pinned to its own share of the cores, so the other was not its contention.
    shares = core_shares(2)
    measured = [r.measurement for r in trial_records(study_of(tmp_path, None)) if r.measurement]
    assert measured and all(list(m.cpu_affinity) in shares
                            and m.cpu_threads == len(m.cpu_affinity) for m in measured)


def test_storage_down_briefly_is_waited_for_and_too_long_is_a_clear_error(postgres,
                                                                          tmp_path) -> None:
    """A server back within --storage-retry-seconds: the run goes on. One that stays away
    longer: the run ends with one line that says so and what to do, never the password, and
    what finished is still there."""
    tuner = TunerProcess(tmp_path, "--storage", postgres.url, "--trials", "20",
                         "--study", "outage", "--storage-retry-seconds", "10")
    wait_for(lambda: _completed(postgres.url, "outage") >= 1, what="a first trial",
             tuners=(tuner,))
    postgres.stop()
    time.sleep(3)
    postgres.start()
    survived = _completed(postgres.url, "outage")
    wait_for(lambda: _completed(postgres.url, "outage") > survived,
             what="a trial after the server came back", tuners=(tuner,))
    postgres.stop()
    try:
        out, err = tuner.communicate(timeout=300)
    finally:
        postgres.start()
    assert tuner.returncode == 1
    message = " ".join(err.split())
    assert "unreachable for" in message and "run the same command to continue" in message
    assert "Traceback" not in err and postgres.password not in out + err
    states = Counter(t.state for t in optuna.load_study(study_name="outage",
                                                        storage=postgres.url).trials)
    assert states[TrialState.COMPLETE] >= 2  # what finished is still there
    # the brief outage cost no trial; the long one leaves the trial it stopped running, and
    # the expert's next trial where it was queued before the server went (the next run's)
    assert set(states) <= {TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING}, states
    assert states[TrialState.RUNNING] <= 1 and states[TrialState.WAITING] <= 1, states


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


def test_password_appears_nowhere(shared_on_postgres: SharedStudy, postgres,
                                  tmp_path: Path) -> None:
    """Not in what the tuners printed, nor in any command's output, nor in any file written:
    logs, exports, the report. A server that is not there is one clear line too."""
    url, secret, studies = postgres.url, postgres.password, shared_on_postgres.studies
    report = tmp_path / "report.html"
    outputs = []
    for command in (["studies"], ["show", "mlp"], ["show", "mlp", "--json"],
                    ["export", "mlp", "--format", "torch"],
                    ["export", "mlp", "--format", "hf", "-o", str(tmp_path / "hf.json")],
                    ["report", "mlp", "-o", str(report)]):
        done = cli(*command, "--studies-dir", str(studies), "--storage", url)
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done)
    wrong = url.replace(f":{postgres.port}/", ":1/")  # nothing listens there
    for command in (["run", *TINY_MLP, "--trials", "1"], ["studies"], ["show", "x"],
                    ["report", "x"]):
        done = cli(*command, "--studies-dir", str(tmp_path), "--storage", wrong)
        assert done.returncode == 2, (command, done.stderr)
        assert "cannot open storage" in done.stderr and "Traceback" not in done.stderr
        outputs.append(done)
    for done in outputs:
        assert secret not in done.stdout + done.stderr
    written = [p for folder in (studies, shared_on_postgres.outputs, tmp_path)
               for p in folder.rglob("*") if p.is_file()]
    assert report in written and any(p.suffix == ".log" for p in written)
    assert any(p.suffix == ".err" for p in written)  # what the tuners printed
    for path in written:
        assert secret not in path.read_text(errors="replace"), path
