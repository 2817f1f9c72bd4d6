"""`autotune run` end to end: real studies of real trials on tiny models, a real journal file on
disk; resume, SIGKILL, Ctrl-C, out-of-memory trials."""

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
from autotune.study.records import TrialRecord, trial_records
from autotune.study.results import load_study
from autotune.study.storage import open_storage
from autotune.trial.protocol import TrialStatus

from ..conftest import CONFIRM_ONCE, FAST, ROOT, run_cli

TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256"]
# Compile costs ~30 s a trial on CI's cores: the search tests hold it off.
NO_COMPILE = ["--fix", "compile_mode=none"]


def run_study(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli("run", *TINY_MLP, "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST,
                   *args, timeout=timeout)


def trials_of(tmp_path: Path, name: str = "mlp") -> list[optuna.trial.FrozenTrial]:
    return load_study(name, tmp_path).get_trials(deepcopy=False)


def records_of(tmp_path: Path, name: str = "mlp") -> list[TrialRecord]:
    return trial_records(load_study(name, tmp_path))


def test_study_finds_a_configuration_at_least_as_fast_and_continues(tmp_path) -> None:
    done = run_study(tmp_path, "--trials", "6", "--seed", "1", "--confirm-top", "2",
                     "--confirm-repeats", "2", "--confirm-max-rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    # Unconfirmed only where every searched trial was stopped at screening (a slow stretch of
    # the machine): then nothing raced the baseline, which is kept.
    assert summary["confirmed"] or summary["verdict"] == \
        "kept your settings: no configuration measured faster in the search", done.stderr
    assert summary["best_samples_per_sec"] >= summary["baseline_samples_per_sec"]
    assert summary["speedup"] >= 1.0
    assert summary["trials"]["COMPLETE"] >= 6
    assert TrainConfig.load(tmp_path / "mlp" / "best.yaml").to_dict() == summary["best_config"]
    assert (tmp_path / "mlp" / "summary.md").read_text().startswith("# autotune study `mlp`")
    # The trace comes from the confirmation's first fresh round: none where nothing raced
    assert (tmp_path / "mlp" / "best-trace.json").exists() == summary["confirmed"]

    trials = trials_of(tmp_path)
    first = trials[0]
    assert first.user_attrs["role"] == "baseline"
    assert first.user_attrs["config"] == summary["baseline_config"]
    ok = [r for r in records_of(tmp_path) if r.status == TrialStatus.OK]
    assert all(Path(r.log_path).exists() for r in ok)
    assert all(r.samples_per_sec > 0 and r.measurement.step_time_p90_s > 0 for r in ok)
    searched = [t for t in trials if t.user_attrs.get("role") != "baseline"]
    assert all(t.user_attrs["config"]["micro_batch_size"] *
               t.user_attrs["config"]["grad_accum_steps"] == 256 for t in searched)

    shown = run_cli("show", "mlp", "--studies-dir", str(tmp_path), "--json")
    assert shown.returncode == 0, shown.stderr
    again = json.loads(shown.stdout)
    for key in ("study", "best_config", "best_samples_per_sec", "best_spread",
                "baseline_config", "baseline_samples_per_sec", "speedup", "trials",
                "oom_trials"):
        assert again[key] == summary[key], key

    # The verdict first, in words, in --json and in best.json (which still loads as a config)
    assert summary["verdict"] and again["verdict"] == summary["verdict"]
    best_json = tmp_path / "mlp" / "best.json"
    assert json.loads(best_json.read_text())["verdict"] == summary["verdict"]
    assert TrainConfig.load(best_json).to_dict() == summary["best_config"]
    verified = run_cli("verify", "mlp", "--studies-dir", str(tmp_path), "--rounds", "2", *FAST)
    if summary["confirmed"]:
        _verified_and_recorded(verified, tmp_path)
    else:
        assert verified.returncode == 2 and "nothing to verify" in verified.stderr

    exported = tmp_path / "best-export.yaml"
    done = run_cli("export", "mlp", "--studies-dir", str(tmp_path), "--format", "yaml", "-o",
                   str(exported))
    assert done.returncode == 0, done.stderr
    assert TrainConfig.load(exported).to_dict() == summary["best_config"]
    hf = run_cli("export", "mlp", "--studies-dir", str(tmp_path), "--format", "hf")
    assert hf.returncode == 0, hf.stderr
    namespace: dict = {}
    exec(compile(hf.stdout, "hf-export", "exec"), namespace)
    assert namespace["training_args"]["per_device_train_batch_size"] == \
        summary["best_config"]["micro_batch_size"]

    listed = run_cli("studies", "--studies-dir", str(tmp_path))
    assert listed.returncode == 0 and "mlp" in listed.stdout

    more = run_study(tmp_path, "--trials", "7", "--seed", "1", "--confirm-repeats", "0")
    assert more.returncode == 0, more.stderr
    numbers = [t.number for t in trials_of(tmp_path)]
    assert numbers == list(range(len(numbers))), "no duplicated or missing trial numbers"
    measured = [t for t in trials_of(tmp_path) if t.state.name == "COMPLETE"
                and "duplicate_of" not in t.user_attrs]
    assert len(measured) >= 7
    assert sum(t.user_attrs.get("role") == "baseline" for t in trials_of(tmp_path)) == 1


def _verified_and_recorded(verified: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """`autotune verify` ran its rounds, said whether the claim holds, and recorded it."""
    assert verified.returncode in (0, 1), verified.stderr
    assert verified.stdout.startswith("verified ") and "fresh paired rounds" in verified.stdout
    assert "verifying: round 2 of 2, " in verified.stderr
    checked = json.loads(run_cli("show", "mlp", "--studies-dir", str(tmp_path),
                                 "--json").stdout)["verifications"]
    assert len(checked) == 1 and checked[0]["rounds"] == 2
    assert (checked[0]["holds"] is False) == (verified.returncode == 1)


@pytest.mark.slow
def test_out_of_memory_is_infeasible_and_learned(tmp_path) -> None:
    """Micro-batches of 2048 and more cannot fit 730 MiB (the training's peak RSS: 1024 samples
    of 16,384 features ~560 MiB, 2048 ~755 MiB); the sampler must learn to stay below."""
    knobs = ["precision=fp32", "activation_checkpointing=none", "num_workers=0",
             "grad_accum_steps=1"]
    args = [a for k in knobs for a in ("--fix", k)]
    done = run_cli("run", "--model", "models/mlp.py", "--device", "cpu", "--model-arg",
                   "feature_dim=16384", "--model-arg", "hidden=256", "--model-arg", "layers=2",
                   "--model-arg", "num_samples=70000", "--studies-dir", str(tmp_path),
                   "--free-batch-size", "16:65536", "--memory-limit", "730MiB", *args,
                   *NO_COMPILE, *FAST, "--trials", "14", "--seed", "3", "--confirm-top", "1",
                   *CONFIRM_ONCE, "--json", timeout=900)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    trials = trials_of(tmp_path)
    infeasible = [t for t in trials if t.user_attrs.get("constraint") == 1.0]
    assert infeasible and summary["oom_trials"] >= 1
    assert all(t.state.name == "COMPLETE" and t.value == 0.0 for t in infeasible)
    assert summary["best_config"]["micro_batch_size"] < min(
        t.user_attrs["config"]["micro_batch_size"] for t in infeasible)
    # Half the micro-batches (2048 to 65536) cannot fit. What an out-of-memory proposal costs
    # is a trial process; once one size did not fit, larger ones in the same memory family are
    # recorded as `oom_predicted` without a process. The measured ones must become rarer.
    measured = [t for t in trials if "duplicate_of" not in t.user_attrs
                and t.user_attrs.get("status") not in ("oom_predicted", "skipped")]
    landed = [t.user_attrs.get("constraint") == 1.0 for t in measured]
    half = len(landed) // 2
    assert sum(landed[half:]) < sum(landed[:half])
    predicted = [t for t in trials if t.user_attrs.get("status") == "oom_predicted"]
    assert all(t.state.name == "COMPLETE" and t.value == 0.0 for t in predicted)
    # Once two micro-batches of a family ran, later trials carry the memory model's prediction,
    # checked against the peak they measured.
    assert summary["memory_predictions"]["checked"] >= 1
    changed = summary["best_config"]["micro_batch_size"] != 1024  # accumulation is fixed at 1
    warned = "the learning rate may need rescaling" in " ".join(summary.get("warnings", []))
    assert warned == changed


def _wait_for(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def _start_study(tmp_path: Path, trials: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autotune", "run", *TINY_MLP,
                             "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST,
                             "--trials", str(trials), "--confirm-repeats", "0", "--seed", "5"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_at_a_terminal)


def _ctrl_c_as_at_a_terminal() -> None:
    """A shell's background job (CI started with `&`, say) inherits SIGINT ignored, and Python
    keeps it ignored: the tuner gets the disposition a process started at a terminal has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_sigkill_of_the_tuner_loses_no_trial(tmp_path) -> None:
    tuner = _start_study(tmp_path, 5)
    _wait_for(lambda: (tmp_path / "mlp" / "logs" / "trial-2.log").exists())
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    before = {t.number: t.value for t in trials_of(tmp_path) if t.state.name == "COMPLETE"}
    assert len(before) >= 2
    running = [t.number for t in trials_of(tmp_path) if t.state.name == "RUNNING"]
    assert running, "the killed tuner left its trial RUNNING"
    time.sleep(1.5)  # the orphaned trial process notices its parent is gone and exits

    rerun = _start_study(tmp_path, 5)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"trial {running[0]} lost its tuner (its process exited): re-queued" in \
        " ".join((out + err).split())
    after = trials_of(tmp_path)
    for number, value in before.items():
        assert after[number].state.name == "COMPLETE" and after[number].value == value
    assert after[running[0]].state.name == "FAIL"
    assert any(t.user_attrs.get("requeued_from") == running[0] for t in after)
    measured = [t for t in after if t.state.name == "COMPLETE" and
                "duplicate_of" not in t.user_attrs]
    assert len(measured) >= 5


@pytest.mark.slow
def test_a_journal_torn_mid_record_is_repaired_and_the_study_continues(tmp_path) -> None:
    """The tuner killed in the middle of writing trial 1's COMPLETE (cut there, as a kill or a
    full disk would): the next run repairs the journal with one warning, keeps trial 0, takes
    trial 1 for orphaned and runs on."""
    assert run_study(tmp_path, "--trials", "2", "--confirm-repeats", "0").returncode == 0
    journal = tmp_path / "mlp" / "journal.log"
    data = journal.read_bytes()
    done = [t for t in trials_of(tmp_path) if t.state.name == "COMPLETE"]
    assert [t.number for t in done] == [0, 1]
    last_complete = data.rindex(b'"trial_id":1,"state":1')
    journal.write_bytes(data[:last_complete + 10])

    rerun = run_study(tmp_path, "--trials", "3", "--confirm-repeats", "0")
    assert rerun.returncode == 0, rerun.stderr
    [warning] = [line for line in rerun.stderr.splitlines() if "was repaired" in line]
    assert warning.startswith("autotune: warning: ") and "torn record at the end" in warning
    [backup] = (tmp_path / "mlp").glob("journal.log.corrupt-*")
    assert backup.read_bytes() == data[:last_complete + 10]
    after = trials_of(tmp_path)
    assert after[0].state.name == "COMPLETE" and after[0].value == done[0].value
    assert after[1].state.name == "FAIL"
    assert any(t.user_attrs.get("requeued_from") == 1 for t in after)
    assert run_cli("show", "mlp", "--studies-dir", str(tmp_path)).returncode == 0


def test_ctrl_c_records_the_trial_and_exits_130(tmp_path) -> None:
    tuner = _start_study(tmp_path, 20)
    _wait_for(lambda: (tmp_path / "mlp" / "logs" / "trial-1.log").exists())
    tuner.send_signal(signal.SIGINT)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err
    assert "Best so far" in out + err
    trials = trials_of(tmp_path)
    interrupted = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) == 1
    assert not [t for t in trials if t.state.name == "RUNNING"]
    queued = [t for t in trials if t.state.name == "WAITING"]
    assert queued and queued[0].user_attrs["requeued_from"] == interrupted[0].number


@pytest.mark.slow
def test_a_sigterm_mid_trial_leaves_nothing_running_and_the_rerun_measures_it(tmp_path) -> None:
    """A scheduler's stop: `show` lists no running trial, the stopped one queued for the next
    run, and the same command run again measures that configuration."""
    tuner = _start_study(tmp_path, 20)
    _wait_for(lambda: (tmp_path / "mlp" / "logs" / "trial-1.log").exists())
    tuner.send_signal(signal.SIGTERM)
    _, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 143, err  # as a shell reports a process SIGTERM ended
    [stopped] = [r for r in records_of(tmp_path) if r.status == TrialStatus.INTERRUPTED]
    shown = run_cli("show", "mlp", "--studies-dir", str(tmp_path), "--json")
    summary = json.loads(shown.stdout)
    assert "RUNNING" not in summary["trials"] and "WAITING" not in summary["trials"]
    assert "running" not in summary["statuses"]
    [queued] = summary["queued_trials"]
    [baseline] = [t for t in summary["trial_times"] if t["trial"] == 0]
    phases = baseline["phases"]
    assert phases["build_s"] > 0 and phases["window_s"] > 0 and phases["profile_s"] > 0
    assert baseline["process_start_s"] + sum(phases.values()) <= baseline["wall_s"]
    table = run_cli("show", "mlp", "--studies-dir", str(tmp_path)).stdout
    [counts] = [line for line in table.splitlines() if "by Optuna state" in line]
    assert "running" not in counts and "waiting" not in counts and f"1: #{queued}" in table
    # The probe's cost is the study's too: shown beside the baseline's phases.
    assert summary["probe_s"] > 0
    assert re.search(r"probe\s+│\s+[0-9.]+ (s|min)", table), table

    measured = sum(1 for r in records_of(tmp_path) if r.samples_per_sec is not None)
    rerun = _start_study(tmp_path, measured + 1)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    again = records_of(tmp_path)[queued]
    assert again.requeued_from == stopped.number and again.finished
    assert again.config == stopped.config


def test_a_repeat_of_a_rerun_is_not_itself_a_rerun(tmp_path) -> None:
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


def test_a_study_resumed_on_another_machine_says_its_rates_are_not_comparable(tmp_path) -> None:
    """A cloud VM that comes back on another host: the resumed run warns before any trial, and
    `show` lists both machines with the same warning."""
    assert run_study(tmp_path, "--trials", "1", "--confirm-repeats", "0").returncode == 0
    study = load_study("mlp", tmp_path)
    here = study.user_attrs["device_name"]
    assert study.user_attrs["device_names"] == [here]
    study.set_user_attr("device_names", ["Older CPU (AVX2)"])

    resumed = run_study(tmp_path, "--trials", "2", "--confirm-repeats", "0")
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join((resumed.stdout + resumed.stderr).split())
    assert f"measured on Older CPU (AVX2); this machine is {here}" in said
    shown = json.loads(run_cli("show", "mlp", "--studies-dir", str(tmp_path), "--json").stdout)
    assert shown["devices"] == ["Older CPU (AVX2)", here]
    assert any("measured on 2 machines" in w for w in shown["warnings"])

    again = run_study(tmp_path, "--trials", "3", "--confirm-repeats", "0")
    assert "this machine is" not in again.stdout + again.stderr, "warned once per new machine"


@pytest.mark.slow
def test_a_burner_started_halfway_is_flagged_and_the_speedup_keeps_its_interval(tmp_path) -> None:
    """A CPU-burning stranger starts once half the search is done: the trials it disturbs are
    flagged in `show --json`, and the confirmed speedup still comes with its interval."""
    tuner = subprocess.Popen([sys.executable, "-m", "autotune", "run", *TINY_MLP,
                              "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST,
                              "--trials", "6", "--seed", "0", "--confirm-top", "2",
                              "--confirm-repeats", "2", "--confirm-max-rounds", "3",
                              # rounds measured again while disturbed need more than 30%
                              "--confirm-share", "0.9",
                              # trials slowed by the burner are measured in full, not
                              # screened, so that some candidate races the baseline
                              "--plain-tpe"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    burners: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 300
        while tuner.poll() is None and time.monotonic() < deadline:
            try:
                done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials_of(tmp_path))
            except Exception:
                done = 0  # the study is not created yet
            if done >= 3:
                break
            time.sleep(0.5)
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                    start_new_session=True) for _ in range(2)]
        out, err = tuner.communicate(timeout=900)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        tuner.kill()
    assert tuner.returncode == 0, err
    summary = json.loads(run_cli("show", "mlp", "--studies-dir", str(tmp_path), "--json").stdout)
    assert summary["disturbed_trials"], "no trial was flagged while the burner ran"
    flagged = {r.number: r.measurement.other_cpu_share for r in records_of(tmp_path)
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


def _seconds(text: str) -> float:
    """A duration as `formatting.format_seconds` writes it."""
    number, unit = text.split()
    return float(number) * {"ms": 0.001, "s": 1.0, "min": 60.0}[unit]


@pytest.mark.slow
def test_the_time_left_told_after_the_baseline_is_within_half_again_of_the_real_end(
        tmp_path) -> None:
    """The first forecast, right after the baseline, against the moment the run ended: search
    trials, confirmation rounds and the rest of the run all priced at the baseline's trial."""
    command = [sys.executable, "-m", "autotune", "run", *TINY_MLP, "--studies-dir",
               str(tmp_path), *NO_COMPILE, *FAST, "--trials", "5", "--seed", "3",
               "--confirm-top", "2", "--confirm-repeats", "2", "--confirm-max-rounds", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=ROOT)
    told: list[tuple[float, float]] = []
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("about ") and " left: " in line:
            told.append((time.monotonic(), _seconds(line.split(" left: ")[0][6:])))
    assert process.wait(timeout=600) == 0, "".join(lines)
    ended = time.monotonic()
    assert len(told) >= 4, "".join(lines)  # after the baseline, then after every trial
    at, forecast = told[0]
    assert ended - at <= forecast * 1.5, (forecast, ended - at, lines)
    if "confirmation" not in load_study("mlp", tmp_path).user_attrs:
        # every trial was screened below the baseline: nothing raced it, and the run ended
        # without the confirmation rounds forecast, early but never late
        statuses = {t.user_attrs.get("status") for t in trials_of(tmp_path)
                    if t.user_attrs.get("role") != "baseline"}
        assert statuses == {"screened"}, (statuses, lines)
        return
    # the forecast prices the best's changes taken back (up to four, as the plan reserves room
    # for them): where the confirmation raced none of them (an answer inside the noise), or
    # some could not be (no configuration without the change in the space: its runs never
    # start), it ends sooner than that price by as much as those runs, never later
    taken_back = load_study("mlp", tmp_path).user_attrs["confirmation"].get("taken_back")
    if taken_back and all(change["rounds"] for change in taken_back):
        assert forecast / 1.5 <= ended - at, (forecast, ended - at, lines)
