"""`autotune run --script`: studies of users' own training scripts, unchanged, as a new user
would run them (a Hugging Face Trainer's, Lightning's, Accelerate's, a hand-written loop); the
answer in each script's own terms, its output untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.study.records import trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import TrialStatus

from ..conftest import CONFIRM_ONCE, FAST, NO_COMPILE, ROOT, cli, need, run_cli

SCRIPT = "tests/models/scripts/hf_argparser.py"
LOOP = "tests/models/scripts/loop_nanogpt.py"
ACCELERATE = "tests/models/scripts/accelerate_clm.py"

pytestmark = pytest.mark.slow


class HuggingFaceStudy:
    """A study of tests/models/scripts/hf_argparser.py, unchanged but for a first few lines
    that act as a user's script may (a file written at import into its current directory, a
    file of the user's read by a relative path) and that note each run of it: its current
    directory, whether it found transformers' Trainer imported, and its parent."""

    def __init__(self, root: Path) -> None:
        self.home, self.temp, self.studies = root / "home", root / "tmp", root / "studies"
        self.runs_log = root / "runs.txt"

    def runs(self) -> list[tuple[str, bool, int]]:
        """Each run of the script so far: (its directory, Trainer imported, its parent)."""
        return [(cwd, preloaded == "True", int(parent)) for cwd, preloaded, parent in
                (line.split() for line in self.runs_log.read_text().splitlines())]


SCRIPT_ARGS = ["--output_dir", "out", "--per_device_train_batch_size", "4",
               "--gradient_accumulation_steps", "2", "--num_samples", "256", "--max_steps", "2"]


@pytest.fixture(scope="module")
def hf_study(tmp_path_factory) -> tuple[HuggingFaceStudy, subprocess.CompletedProcess]:
    """Tuned from the user's folder, as a new user runs it, with its own temp directory: three
    trials, one confirmation round. Its own run is 2 optimizer steps, fewer than a trial
    measures."""
    need("transformers", "examples")
    made = HuggingFaceStudy(tmp_path_factory.mktemp("hf"))
    made.home.mkdir()
    made.temp.mkdir()
    (made.home / "data.txt").write_text("16\n")
    (made.home / "train.py").write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "Path(f'written-at-import-{os.getpid()}.txt').write_text('x')\n"
        "assert Path('data.txt').read_text() == '16\\n'\n"
        f"with open({str(made.runs_log)!r}, 'a') as f:\n"
        "    f.write(f\"{os.getcwd()} {'transformers.trainer' in sys.modules} "
        "{os.getppid()}\\n\")\n" + (ROOT / SCRIPT).read_text())
    done = _run_in(made.home, made.temp, "run", "--script", "train.py", "--device", "cpu",
                   "--trials", "3", "--studies-dir", str(made.studies), *NO_COMPILE, *FAST,
                   *CONFIRM_ONCE, "--json", "--", *SCRIPT_ARGS, timeout=600)
    assert done.returncode == 0, done.stderr
    return made, done


def test_a_hugging_face_script_study_answers_in_its_own_arguments(hf_study) -> None:
    made, done = hf_study
    summary = json.loads(done.stdout)
    assert summary["script_args"] == SCRIPT_ARGS
    # the baseline is the script's own settings, read from the TrainingArguments it parsed
    assert summary["baseline_config"]["micro_batch_size"] == 4
    assert summary["baseline_config"]["grad_accum_steps"] == 2
    # measured: in full, or stopped at screening with the screen's figure (a slow one)
    measured = [r for r in trial_records(load_study("train", made.studies))
                if r.status in (TrialStatus.OK, TrialStatus.SCREENED) and r.measurement]
    assert len(measured) >= 3 and summary["trials"]["COMPLETE"] >= 3
    assert all(r.measurement.script_answer is not None for r in measured)
    # the answer in the script's terms: its command-line flags, or its own settings kept
    best, base = summary["best_config"], summary["baseline_config"]
    flags = summary["script_flags"]
    if best == base:
        assert summary["answer_in_script_terms"] == [
            "keep the script's own settings: nothing to change"]
    else:
        assert summary["answer_in_script_terms"] == [" ".join(flags)] and flags
    if best["micro_batch_size"] != base["micro_batch_size"]:
        i = flags.index("--per_device_train_batch_size")
        assert flags[i + 1] == str(best["micro_batch_size"])
    exported = cli("export", "train", "--studies-dir", str(made.studies), "--format", "args")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[0] == (
        " ".join(flags) if flags else "# keep the script's own settings")
    refused = cli("export", "train", "--studies-dir", str(made.studies), "--format",
                  "lightning")
    assert refused.returncode == 2 and refused.stdout == ""
    assert " ".join(refused.stderr.split()) == (
        "autotune: error: study 'train' tuned a Hugging Face Trainer script: --format "
        "lightning writes another library's code; --format args gives its answer in the "
        "script's own terms")


def test_every_run_of_a_script_works_in_a_scratch_folder_and_says_what_its_run_is(
        hf_study) -> None:
    """The probe, every trial and the confirmation run the script, and none writes in the
    user's folder; nothing is left in the temp directory. The run says at its start that the
    script's own run is shorter than a trial measures, and the summary keeps it."""
    made, done = hf_study
    ran_in = [cwd for cwd, _, _ in made.runs()]
    confirmed = "confirmation" in load_study("train", made.studies).user_attrs
    # the probe and three trials; a confirmation round too where a trial raced the baseline
    assert len(ran_in) >= (5 if confirmed else 4), ran_in
    assert len(set(ran_in)) == len(ran_in) and str(made.home) not in ran_in
    assert sorted(p.name for p in made.home.iterdir()) == ["data.txt", "train.py"]
    assert [p.name for p in made.temp.iterdir() if p.name.startswith("autotune")] == []
    short = ("the script's own run is 2 optimizer steps at its settings, fewer than a trial "
             "measures")
    assert f"warning: {short}" in " ".join(done.stderr.split())
    shown = cli("show", "train", "--studies-dir", str(made.studies), "--json")
    assert any(w.startswith(short) for w in json.loads(shown.stdout)["warnings"])


def test_a_scripts_trials_fork_with_its_libraries_imported_and_run_it_from_its_first_line(
        hf_study) -> None:
    """The probe is a fresh interpreter; every later run of the script forks from one process
    that imported transformers' Trainer, never the script: each run's first line finds the
    Trainer imported, and runs once per trial. `verify` re-runs the script the same way, with
    the answer and with its own settings, and says whether the claim holds."""
    made, done = hf_study
    assert "trials fork from a process that has imported torch and the" in \
        " ".join(done.stderr.split())
    runs = made.runs()
    trials = trial_records(load_study("train", made.studies))
    assert runs[0][1] is False  # the probe: a fresh interpreter
    assert len(runs) >= 1 + len(trials)
    assert {preloaded for _, preloaded, _ in runs[1:]} == {True}
    assert len({parent for _, _, parent in runs[1:]}) == 1  # all forks of one process
    verified = _run_in(made.home, made.temp, "verify", "train", "--studies-dir",
                       str(made.studies), "--rounds", "2", *FAST, timeout=600)
    if verified.returncode == 2:
        assert "nothing to verify" in verified.stderr
        return
    assert verified.returncode in (0, 1), verified.stderr
    assert verified.stdout.startswith("verified ") and "2 fresh paired rounds" in \
        verified.stdout
    again = made.runs()[len(runs):]
    assert len(again) == 4 and {preloaded for _, preloaded, _ in again} == {True}
    assert sorted(p.name for p in made.home.iterdir()) == ["data.txt", "train.py"]


def test_a_scripts_trial_as_a_process_group_of_two_ranks(tmp_path: Path) -> None:
    """Every rank runs the script; they stop the Trainer at the same step (else its
    collectives hang), and the group's rate is every rank's samples over the slowest window."""
    need("transformers", "examples")
    out = tmp_path / "script-output"
    done = run_cli("bench", "--script", SCRIPT, "--device", "cpu", "--nproc-per-node", "2",
                   *FAST, "--json", "--", "--output_dir", str(out), timeout=240)
    result = json.loads(done.stdout)
    assert done.returncode == 0, result["message"]
    assert result["world_size"] == 2 and len(result["rank_samples_per_sec"]) == 2
    assert result["samples_per_sec"] == pytest.approx(sum(result["rank_samples_per_sec"]),
                                                      rel=0.5)
    assert not out.exists()


def test_bench_sets_knobs_over_the_scripts_own_settings(tmp_path: Path) -> None:
    """`bench --script --set`: the script is read once for its own settings (micro-batch 4,
    accumulation 2, the for-loop AdamW), and the measured run changes only what was asked;
    its answer names the flag to change."""
    need("transformers", "examples")
    out = tmp_path / "script-output"
    done = run_cli("bench", "--script", SCRIPT, "--device", "cpu", "--set",
                   "micro_batch_size=8", *FAST, "--json", "--", "--output_dir", str(out),
                   "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                   "--num_samples", "256", timeout=300)
    result = json.loads(done.stdout)
    assert done.returncode == 0, result["message"]
    assert (result["config"]["micro_batch_size"], result["config"]["grad_accum_steps"]) == (8, 2)
    assert result["script_answer"]["changes"] == {
        "TrainingArguments": {"per_device_train_batch_size": 8}}
    assert not out.exists()


def test_a_lightning_script_study_in_process_groups_of_two_ranks(tmp_path: Path) -> None:
    """`run --script --nproc-per-node 2` of a Lightning script with a DataModule: each trial is
    two ranks under torchrun, Lightning's own DDP between them; the study measures, confirms
    and answers in the script's terms, the group's rate every rank's samples."""
    need("lightning", "export-check")
    root = tmp_path / "user_root"
    # DDP and its own knobs held (the group checks and FSDP are the model file's group
    # study's; Lightning refuses FSDP here): the group checks have nothing left to try
    done = run_cli("run", "--script", "tests/models/scripts/lightning_datamodule.py",
                   "--device", "cpu", "--nproc-per-node", "2", "--trials", "2",
                   "--fix", "parallelism=ddp", "--fix", "ddp_static_graph=false",
                   "--fix", "ddp_gradient_as_bucket_view=false",
                   "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST, *CONFIRM_ONCE, "--json",
                   "--", "--root", str(root), timeout=900)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["nproc_per_node"] == 2 and summary["baseline_config"]["parallelism"] == "ddp"
    measured = [r for r in trial_records(load_study("lightning_datamodule", tmp_path))
                if r.status == TrialStatus.OK and r.measurement]
    assert measured and all(r.measurement.world_size == 2 and
                            len(r.measurement.rank_samples_per_sec) == 2 for r in measured)
    answer = summary["answer_in_script_terms"]
    assert answer
    exported = cli("export", "lightning_datamodule", "--studies-dir", str(tmp_path),
                       "--format", "args")
    assert exported.returncode == 0, exported.stderr
    if summary["best_config"] == summary["baseline_config"]:
        assert exported.stdout == "# keep the script's own settings\n"
    else:  # the script's own flags on the first line, then each line of its code to change
        said = exported.stdout.splitlines()
        code = [line.removeprefix("# change in the code: ") for line in said
                if line.startswith("# change in the code: ")]
        flags = " ".join(line for line in said if not line.startswith("#"))
        assert code == [line for line in answer if not line.startswith("--")]
        assert all(line in flags for line in answer if line.startswith("--"))
    assert not root.exists()


def test_a_hand_written_loop_study_answers_at_its_own_flags_and_lines(tmp_path: Path) -> None:
    """A nanoGPT-style loop (hand-written accumulation, clipping and schedule, checkpoints
    every 5 steps into its --out_dir), its batch flags named: a study end to end, its baseline
    read from the script, a verdict, the answer at the script's flags and lines, verified;
    its output directory untouched."""
    out = tmp_path / "loop-out"
    script_args = ["--out_dir", str(out), "--eval_interval", "5"]
    done = run_cli("run", "--script", LOOP, "--device", "cpu", "--trials", "3",
                   "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST, *CONFIRM_ONCE, "--json",
                   "--arg", "micro_batch_size=--batch_size",
                   "--arg", "grad_accum_steps=--gradient_accumulation_steps",
                   "--", *script_args, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    base = summary["baseline_config"]
    assert (base["micro_batch_size"], base["grad_accum_steps"]) == (8, 2)
    assert summary["verdict"]
    _own_terms(summary, "loop_nanogpt", tmp_path, "loop", "loop_nanogpt.py:")
    _verified_or_nothing_to_verify("loop_nanogpt", tmp_path)
    assert not out.exists()


def test_an_accelerate_script_study_answers_at_its_own_flags_and_accelerate_launchs(
        tmp_path: Path) -> None:
    """An Accelerate script in the examples' style (accumulate, backward, clipping when the
    gradients sync, trackers asked for, its state saved every 2 steps, its output_dir made at
    start): a study end to end, the answer at its own flags, accelerate launch's and its
    lines; its output directory untouched. (`verify` of a script: the loop's and the Hugging
    Face script's.)"""
    need("accelerate", "examples")
    need("transformers", "examples")
    out = tmp_path / "accelerate-out"
    done = run_cli("run", "--script", ACCELERATE, "--device", "cpu", "--trials", "3",
                   "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST, *CONFIRM_ONCE, "--json",
                   "--", "--output_dir", str(out), "--checkpointing_steps", "2",
                   "--with_tracking", timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    base = summary["baseline_config"]
    assert (base["micro_batch_size"], base["grad_accum_steps"]) == (4, 2)
    assert summary["verdict"]
    _own_terms(summary, "accelerate_clm", tmp_path, "accelerate", "accelerate_clm.py:")
    assert not out.exists()


def _own_terms(summary: dict, study: str, tmp_path: Path, library: str, lines: str) -> None:
    """A study of a script's own loop: its trials measured with the answer in the script's
    terms (its flags, accelerate launch's, or its lines), exported."""
    measured = [r for r in trial_records(load_study(study, tmp_path))
                if r.status in (TrialStatus.OK, TrialStatus.SCREENED) and r.measurement]
    assert len(measured) >= 3 and summary["trials"]["COMPLETE"] >= 3
    assert {r.measurement.script_answer.library for r in measured} == {library}
    answer = summary["answer_in_script_terms"]
    if summary["best_config"] == summary["baseline_config"]:
        assert answer == ["keep the script's own settings: nothing to change"]
    else:
        assert all(line.startswith(("--", "accelerate launch --", lines)) for line in answer)
    exported = cli("export", study, "--studies-dir", str(tmp_path), "--format", "args")
    assert exported.returncode == 0, exported.stderr
    flags = summary["script_flags"]
    if flags:
        assert exported.stdout.splitlines()[0] == " ".join(flags)
    refused = cli("export", study, "--studies-dir", str(tmp_path), "--format", "hf")
    assert refused.returncode == 2 and "--format args gives its answer" in refused.stderr


def _verified_or_nothing_to_verify(study: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`verify --rounds 2` of a script study: the claim checked in fresh paired rounds, or,
    where the search measured no contender to the script's own settings, nothing to verify."""
    verified = run_cli("verify", study, "--studies-dir", str(tmp_path), "--rounds", "2", *FAST,
                       timeout=600)
    if verified.returncode == 2:
        assert "nothing to verify" in verified.stderr
    else:
        assert verified.returncode in (0, 1), verified.stderr
        assert verified.stdout.startswith("verified ") and "2 fresh paired rounds" in \
            verified.stdout
    return verified


def _run_in(home: Path, temp: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`autotune ARGS` run from the user's folder `home`, with its own temp directory."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=home,
                          env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)})


def test_a_script_whose_own_settings_diverge_is_named_as_the_scripts(tmp_path: Path) -> None:
    need("transformers", "examples")
    script = tmp_path / "train.py"
    script.write_text((ROOT / SCRIPT).read_text().replace(
        "    trainer.train()",
        "    model.register_forward_hook(lambda m, i, out: setattr(out, 'loss', out.loss * "
        "float('nan')))\n    trainer.train()"))
    done = run_cli("run", "--script", str(script), "--device", "cpu", "--trials", "2",
                   "--studies-dir", str(tmp_path), *NO_COMPILE, *FAST, "--",
                   "--output_dir", str(tmp_path / "out"), timeout=300)
    assert done.returncode == 1, done.stderr
    error = " ".join(done.stderr.split())
    assert error.startswith("autotune: error: the baseline (the script's own settings) diverged: "
                            "the loss became nan"), error
