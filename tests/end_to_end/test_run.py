"""`autotune run` end to end: real studies of real trials on tiny models, a real journal file on
disk; the answer and its files, the forecast, resume, SIGKILL, Ctrl-C, SIGTERM, a torn journal,
a stranger's load."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.hardware import usable_cpus
from autotune.study.records import TrialRecord, trial_records
from autotune.study.results import load_study
from autotune.study.storage import open_storage
from autotune.trial.protocol import TrialStatus

from ..conftest import FAST, ROOT, TINY_MLP, cli, run_cli
from .conftest import TEMPLATE, SearchStudy, copy_of

pytestmark = pytest.mark.slow


def run_study(studies: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli("run", *TINY_MLP, "--studies-dir", str(studies), *FAST, *args,
                   timeout=timeout)


def trials_of(studies: Path, name: str = "mlp") -> list[optuna.trial.FrozenTrial]:
    return load_study(name, studies).get_trials(deepcopy=False)


def records_of(studies: Path, name: str = "mlp") -> list[TrialRecord]:
    return trial_records(load_study(name, studies))


def test_a_search_finds_a_configuration_at_least_as_fast_and_writes_its_answer(
        mlp_search: SearchStudy) -> None:
    studies, summary = mlp_search.studies, mlp_search.run.summary()
    # Unconfirmed only where every searched trial was stopped at screening (a slow stretch of
    # the machine): then nothing raced the baseline, which is kept.
    assert summary["confirmed"] or summary["verdict"] == \
        "kept your settings: no configuration measured faster in the search"
    assert summary["best_samples_per_sec"] >= summary["baseline_samples_per_sec"]
    assert summary["speedup"] >= 1.0
    assert summary["trials"]["COMPLETE"] >= 5
    assert TrainConfig.load(studies / "mlp" / "best.yaml").to_dict() == summary["best_config"]
    assert (studies / "mlp" / "summary.md").read_text().startswith("# autotune study `mlp`")
    # The trace comes from the confirmation's first fresh round: none where nothing raced
    assert (studies / "mlp" / "best-trace.json").exists() == summary["confirmed"]
    # The verdict first, in words, in --json and in best.json (which still loads as a config)
    assert summary["verdict"]
    best_json = studies / "mlp" / "best.json"
    assert json.loads(best_json.read_text())["verdict"] == summary["verdict"]
    assert TrainConfig.load(best_json).to_dict() == summary["best_config"]
    # --no-loss-check checks nothing and says so (where something raced: the checks are the
    # confirmation's)
    if summary["confirmed"]:
        assert summary["loss_check"] is None
        assert summary["checks"]["loss_note"] == "off (--no-loss-check)"
        if summary["best_config"]["precision"] == "bf16":
            assert "loss was not checked: off (--no-loss-check)" in summary["verdict"]

    trials = trials_of(studies)
    assert trials[0].user_attrs["role"] == "baseline"
    assert trials[0].user_attrs["config"] == summary["baseline_config"]
    ok = [r for r in records_of(studies) if r.status == TrialStatus.OK]
    assert all(Path(r.log_path).exists() for r in ok)
    assert all(r.samples_per_sec > 0 and r.measurement.step_time_p90_s > 0 for r in ok)
    searched = [t for t in trials if t.user_attrs.get("role") != "baseline"]
    assert all(t.user_attrs["config"]["micro_batch_size"] *
               t.user_attrs["config"]["grad_accum_steps"] == 256 for t in searched)


def test_show_reads_back_what_the_run_answered(mlp_search: SearchStudy) -> None:
    summary = mlp_search.run.summary()
    shown = cli("show", "mlp", "--studies-dir", str(mlp_search.studies), "--json")
    assert shown.returncode == 0, shown.stderr
    again = json.loads(shown.stdout)
    for key in ("study", "best_config", "best_samples_per_sec", "best_spread",
                "baseline_config", "baseline_samples_per_sec", "speedup", "trials",
                "oom_trials", "verdict"):
        assert again[key] == summary[key], key


def test_the_answer_exports_and_the_study_is_listed(mlp_search: SearchStudy,
                                                    tmp_path: Path) -> None:
    studies, best = mlp_search.studies, mlp_search.run.summary()["best_config"]
    exported = tmp_path / "best-export.yaml"
    done = cli("export", "mlp", "--studies-dir", str(studies), "--format", "yaml", "-o",
                   str(exported))
    assert done.returncode == 0, done.stderr
    assert TrainConfig.load(exported).to_dict() == best
    hf = cli("export", "mlp", "--studies-dir", str(studies), "--format", "hf")
    assert hf.returncode == 0, hf.stderr
    namespace: dict = {}
    exec(compile(hf.stdout, "hf-export", "exec"), namespace)
    assert namespace["training_args"]["per_device_train_batch_size"] == best["micro_batch_size"]
    listed = cli("studies", "--studies-dir", str(studies))
    assert listed.returncode == 0 and "mlp" in listed.stdout


def test_verify_measures_the_answer_again_and_records_it(mlp_search: SearchStudy,
                                                         tmp_path: Path) -> None:
    studies = copy_of(mlp_search.studies, tmp_path)
    verified = run_cli("verify", "mlp", "--studies-dir", str(studies), "--rounds", "2", *FAST)
    if not mlp_search.run.summary()["confirmed"]:
        assert verified.returncode == 2 and "nothing to verify" in verified.stderr
        return
    assert verified.returncode in (0, 1), verified.stderr
    assert verified.stdout.startswith("verified ") and "fresh paired rounds" in verified.stdout
    assert "verifying: round 2 of 2, " in verified.stderr
    checked = json.loads(cli("show", "mlp", "--studies-dir", str(studies),
                                 "--json").stdout)["verifications"]
    assert len(checked) == 1 and checked[0]["rounds"] == 2
    assert (checked[0]["holds"] is False) == (verified.returncode == 1)


def _seconds(text: str) -> float:
    """A duration as `formatting.format_seconds` writes it."""
    number, unit = text.split()
    return float(number) * {"ms": 0.001, "s": 1.0, "min": 60.0}[unit]


def test_the_time_left_told_after_the_baseline_is_within_half_again_of_the_real_end(
        mlp_search: SearchStudy) -> None:
    """The first forecast, right after the baseline, against the moment the run ended: search
    trials, confirmation rounds and the rest of the run all priced at the baseline's trial."""
    run = mlp_search.run
    told = [(at, _seconds(line.split(" left: ")[0][6:])) for at, line in run.lines
            if line.startswith("about ") and " left: " in line]
    assert len(told) >= 4, run.stderr  # after the baseline, then after every trial
    at, forecast = told[0]
    assert run.ended - at <= forecast * 1.5, (forecast, run.ended - at, run.stderr)
    study = load_study("mlp", mlp_search.studies)
    if "confirmation" not in study.user_attrs:
        # every trial was screened below the baseline: nothing raced it, and the run ended
        # without the confirmation rounds forecast, early but never late
        statuses = {t.user_attrs.get("status") for t in trials_of(mlp_search.studies)
                    if t.user_attrs.get("role") != "baseline"}
        assert statuses == {"screened"}, (statuses, run.stderr)
        return
    # the forecast prices the best's changes taken back (up to four, as the plan reserves room
    # for them): where the confirmation raced none of them (an answer inside the noise), or
    # some could not be (no configuration without the change in the space: its runs never
    # start), it ends sooner than that price by as much as those runs, never later
    taken_back = study.user_attrs["confirmation"].get("taken_back")
    if taken_back and all(change["rounds"] for change in taken_back):
        assert forecast / 1.5 <= run.ended - at, (forecast, run.ended - at, run.stderr)


def test_a_resumed_run_continues_the_study_and_says_when_the_machine_changed(
        mlp_template: Path, tmp_path: Path) -> None:
    """A cloud VM that comes back on another host: the resumed run warns before any trial, and
    `show` lists both machines with the same warning. The study goes on where it was: no
    number taken twice, no second baseline."""
    studies = copy_of(mlp_template, tmp_path)
    study = load_study("mlp", studies)
    here = study.user_attrs["device_name"]
    assert study.user_attrs["device_names"] == [here]
    study.set_user_attr("device_names", ["Older CPU (AVX2)"])

    resumed = run_study(studies, "--trials", "3", "--confirm-repeats", "0")
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join((resumed.stdout + resumed.stderr).split())
    assert f"measured on Older CPU (AVX2); this machine is {here}" in said
    shown = json.loads(cli("show", "mlp", "--studies-dir", str(studies), "--json").stdout)
    assert shown["devices"] == ["Older CPU (AVX2)", here]
    assert any("measured on 2 machines" in w for w in shown["warnings"])
    trials = trials_of(studies)
    assert [t.number for t in trials] == list(range(len(trials))), "no number taken twice"
    assert sum(t.user_attrs.get("role") == "baseline" for t in trials) == 1
    measured = [t for t in trials if t.state.name == "COMPLETE"
                and "duplicate_of" not in t.user_attrs]
    assert len(measured) >= 3

    again = run_study(studies, "--trials", "4", "--confirm-repeats", "0")
    assert "this machine is" not in again.stdout + again.stderr, "warned once per new machine"


def _wait_for(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def _start_study(studies: Path, trials: int) -> subprocess.Popen:
    """TEMPLATE's study run on in the background to `trials` trials."""
    return subprocess.Popen([sys.executable, "-m", "autotune", "run", *TEMPLATE,
                             "--studies-dir", str(studies), "--trials", str(trials)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_at_a_terminal)


def _ctrl_c_as_at_a_terminal() -> None:
    """A shell's background job (CI started with `&`, say) inherits SIGINT ignored, and Python
    keeps it ignored: the tuner gets the disposition a process started at a terminal has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _mid_trial_2(studies: Path) -> bool:
    """The run on from TEMPLATE's two trials has started trial 2."""
    return (studies / "mlp" / "logs" / "trial-2.log").exists()


def test_sigkill_of_the_tuner_loses_no_trial(mlp_template: Path, tmp_path: Path) -> None:
    studies = copy_of(mlp_template, tmp_path)
    tuner = _start_study(studies, 4)
    _wait_for(lambda: _mid_trial_2(studies))
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    before = {t.number: t.value for t in trials_of(studies) if t.state.name == "COMPLETE"}
    assert len(before) >= 2
    running = [t.number for t in trials_of(studies) if t.state.name == "RUNNING"]
    assert running, "the killed tuner left its trial RUNNING"
    time.sleep(1.5)  # the orphaned trial process notices its parent is gone and exits

    rerun = _start_study(studies, 4)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"trial {running[0]} lost its tuner (its process exited): re-queued" in \
        " ".join((out + err).split())
    after = trials_of(studies)
    for number, value in before.items():
        assert after[number].state.name == "COMPLETE" and after[number].value == value
    assert after[running[0]].state.name == "FAIL"
    assert any(t.user_attrs.get("requeued_from") == running[0] for t in after)
    measured = [t for t in after if t.state.name == "COMPLETE" and
                "duplicate_of" not in t.user_attrs]
    assert len(measured) >= 4


def test_a_journal_torn_mid_record_is_repaired_and_the_study_continues(
        mlp_template: Path, tmp_path: Path) -> None:
    """The tuner killed in the middle of writing trial 1's COMPLETE (cut there, as a kill or a
    full disk would): the next run repairs the journal with one warning, keeps trial 0, takes
    trial 1 for orphaned and runs on."""
    studies = copy_of(mlp_template, tmp_path)
    journal = studies / "mlp" / "journal.log"
    data = journal.read_bytes()
    done = [t for t in trials_of(studies) if t.state.name == "COMPLETE"]
    assert [t.number for t in done] == [0, 1]
    last_complete = data.rindex(b'"trial_id":1,"state":1')
    journal.write_bytes(data[:last_complete + 10])

    rerun = run_study(studies, "--trials", "3", "--confirm-repeats", "0")
    assert rerun.returncode == 0, rerun.stderr
    [warning] = [line for line in rerun.stderr.splitlines() if "was repaired" in line]
    assert warning.startswith("autotune: warning: ") and "torn record at the end" in warning
    [backup] = (studies / "mlp").glob("journal.log.corrupt-*")
    assert backup.read_bytes() == data[:last_complete + 10]
    after = trials_of(studies)
    assert after[0].state.name == "COMPLETE" and after[0].value == done[0].value
    assert after[1].state.name == "FAIL"
    assert any(t.user_attrs.get("requeued_from") == 1 for t in after)
    assert cli("show", "mlp", "--studies-dir", str(studies)).returncode == 0


def test_ctrl_c_records_the_trial_and_exits_130(mlp_template: Path, tmp_path: Path) -> None:
    studies = copy_of(mlp_template, tmp_path)
    tuner = _start_study(studies, 20)
    _wait_for(lambda: _mid_trial_2(studies))
    tuner.send_signal(signal.SIGINT)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err
    assert "Best so far" in out + err
    trials = trials_of(studies)
    interrupted = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) == 1
    assert not [t for t in trials if t.state.name == "RUNNING"]
    queued = [t for t in trials if t.state.name == "WAITING"]
    assert queued and queued[0].user_attrs["requeued_from"] == interrupted[0].number


def test_a_sigterm_mid_trial_leaves_nothing_running_and_the_rerun_measures_it(
        mlp_template: Path, tmp_path: Path) -> None:
    """A scheduler's stop: `show` lists no running trial, the stopped one queued for the next
    run, and the same command run again measures that configuration."""
    studies = copy_of(mlp_template, tmp_path)
    tuner = _start_study(studies, 20)
    _wait_for(lambda: _mid_trial_2(studies))
    tuner.send_signal(signal.SIGTERM)
    _, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 143, err  # as a shell reports a process SIGTERM ended
    [stopped] = [r for r in records_of(studies) if r.status == TrialStatus.INTERRUPTED]
    shown = cli("show", "mlp", "--studies-dir", str(studies), "--json")
    summary = json.loads(shown.stdout)
    assert "RUNNING" not in summary["trials"] and "WAITING" not in summary["trials"]
    assert "running" not in summary["statuses"]
    [queued] = summary["queued_trials"]
    [baseline] = [t for t in summary["trial_times"] if t["trial"] == 0]
    phases = baseline["phases"]
    assert phases["build_s"] > 0 and phases["window_s"] > 0 and phases["profile_s"] > 0
    assert baseline["process_start_s"] + sum(phases.values()) <= baseline["wall_s"]
    table = cli("show", "mlp", "--studies-dir", str(studies)).stdout
    [counts] = [line for line in table.splitlines() if "by Optuna state" in line]
    assert "running" not in counts and "waiting" not in counts and f"1: #{queued}" in table
    # The probe's cost is the study's too: shown beside the baseline's phases.
    assert summary["probe_s"] > 0
    assert re.search(r"probe\s+│\s+[0-9.]+ (s|min)", table), table

    measured = sum(1 for r in records_of(studies) if r.samples_per_sec is not None)
    rerun = _start_study(studies, measured + 1)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    again = records_of(studies)[queued]
    assert again.requeued_from == stopped.number and again.finished
    assert again.config == stopped.config


def test_a_repeat_of_a_rerun_is_not_itself_a_rerun(tmp_path: Path) -> None:
    """A repeat copies its configuration's outcome, not the bookkeeping of the trial it
    repeats: re-run and retry counts stay true."""
    storage = open_storage(None, tmp_path / "mlp")
    study = optuna.create_study(study_name="mlp", storage=storage, direction="maximize")
    study.enqueue_trial({}, user_attrs={"role": "baseline", "requeued_from": 5, "retry": 1})
    assert run_study(tmp_path, "--trials", "1", "--confirm-repeats", "0").returncode == 0
    study.enqueue_trial({}, user_attrs={"role": "baseline"})
    assert run_study(tmp_path, "--trials", "2", "--confirm-repeats", "0").returncode == 0
    repeat = next(r for r in records_of(tmp_path) if r.duplicate_of == 0)
    assert repeat.requeued_from is None and repeat.retry == 0
    assert repeat.measurement == records_of(tmp_path)[0].measurement


def test_a_burner_started_halfway_is_flagged_and_the_speedup_keeps_its_interval(
        mlp_template: Path, tmp_path: Path) -> None:
    """A CPU-burning stranger starts once the first half of the search is done: the trials it
    disturbs are flagged in `show --json`, and the confirmed speedup still comes with its
    interval."""
    studies = copy_of(mlp_template, tmp_path)
    tuner = subprocess.Popen([sys.executable, "-m", "autotune", "run", *TINY_MLP,
                              "--studies-dir", str(studies), *FAST,
                              "--trials", "3", "--seed", "0", "--confirm-top", "2",
                              "--confirm-repeats", "2", "--confirm-max-rounds", "2",
                              "--no-loss-check",
                              # a disturbed window is flagged at once: the burner never stops
                              "--contention-retries", "0",
                              # rounds measured again while disturbed need more than 30%
                              "--confirm-share", "0.9",
                              # trials slowed by the burner are measured in full, not
                              # screened, so that some candidate races the baseline
                              "--plain-tpe"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    burners: list[subprocess.Popen] = []
    try:
        _wait_for(lambda: tuner.poll() is not None or _mid_trial_2(studies), timeout=300)
        # one on each of the cores the study runs on (a lane's one, under -n): each trial's
        # every thread shares its core with a burner
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                    start_new_session=True)
                   for _ in range(usable_cpus())]
        out, err = tuner.communicate(timeout=900)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        tuner.kill()
    assert tuner.returncode == 0, err
    summary = json.loads(cli("show", "mlp", "--studies-dir", str(studies),
                                 "--json").stdout)
    assert summary["disturbed_trials"], "no trial was flagged while the burner ran"
    flagged = {r.number: r.measurement.other_cpu_share for r in records_of(studies)
               if r.disturbed}
    assert set(summary["disturbed_trials"]) <= set(flagged)
    assert all(share is not None and share > 0.05 for share in flagged.values())
    assert summary["confirmed"], "the busy machine left no confirmation round"
    assert any("confirmation rounds ran while other processes" in w
               for w in summary["warnings"])
    low, high = summary["speedup_ci"]
    # the recommendation's interval, or, when the baseline is recommended (1.0), its closest
    # contender's, which need not include 1.0
    assert low <= high and (summary["speedup"] == 1.0 or low <= summary["speedup"] <= high)
