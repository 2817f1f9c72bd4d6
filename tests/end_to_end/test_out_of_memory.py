"""A study where half the micro-batches cannot fit: out-of-memory trials are infeasible results
the sampler learns from, and `autotune report` makes the study's HTML page, which the
ecosystem's viewers (Optuna's own CLI) read too."""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from autotune.study.results import load_study

from ..conftest import CONFIRM_ONCE, FAST, NO_COMPILE, TEST_MODELS, cli
from .conftest import Finished, tune

pytestmark = pytest.mark.slow

SECTIONS = ("a. Samples/sec vs micro-batch size", "b. Peak memory vs micro-batch size",
            "c. Best so far", "d. Parameter importance", "e. Best vs baseline",
            "f. Where the best configuration spends its time", "g. Compile: time vs gain")


class OutOfMemory:
    """The study's folder, its run, and its trials."""

    def __init__(self, studies: Path, run: Finished) -> None:
        self.studies, self.run = studies, run
        self.summary = run.summary()
        self.trials = load_study("wide_inputs", studies).get_trials(deepcopy=False)


@pytest.fixture(scope="module")
def out_of_memory(tmp_path_factory) -> OutOfMemory:
    """Micro-batches of 2048 and more cannot fit 880 MiB (less the 10% kept free, 792 MiB: the
    training's peak RSS with 1024 samples of 32,768 features is 617 MiB on an AMD EPYC host,
    with 2048 873 MiB; an Intel Xeon host's process is about 90 MiB larger, which at 16,384
    features and 660 MiB let 2048 fit on the AMD host, so the samples are wide enough for both).
    On CPU the peak is the process's resident set, which accumulation also grows, so
    accumulation is held at 1; the AdamW implementation is searched beside the micro-batch."""
    knobs = ["precision=fp32", "activation_checkpointing=none", "num_workers=0",
             "grad_accum_steps=1"]
    studies = tmp_path_factory.mktemp("out_of_memory") / "studies"
    run = tune("--model", str(TEST_MODELS / "wide_inputs.py"), "--device", "cpu",
               "--studies-dir", str(studies), "--model-arg", "features=32768",
               "--free-batch-size", "16:65536", "--memory-limit", "880MiB",
               *[a for k in knobs for a in ("--fix", k)], *NO_COMPILE, *FAST,
               "--trials", "14", "--seed", "3", "--confirm-top", "1", *CONFIRM_ONCE, "--json",
               timeout=900)
    assert run.returncode == 0, run.stderr
    return OutOfMemory(studies, run)


def test_out_of_memory_is_infeasible_and_learned(out_of_memory: OutOfMemory) -> None:
    """The sampler learns to stay below what fits."""
    summary, trials = out_of_memory.summary, out_of_memory.trials
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


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(data)
            for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_has_every_section_with_valid_images(out_of_memory: OutOfMemory) -> None:
    done = cli("report", "wide_inputs", "--studies-dir", str(out_of_memory.studies))
    assert done.returncode == 0, done.stderr
    path = out_of_memory.studies / "wide_inputs" / "report.html"
    assert done.stdout.strip() == str(path)
    page = path.read_text()
    for section in SECTIONS:
        assert f"<h2>{section}</h2>" in page
    assert "http://" not in page and "https://" not in page  # self-contained: nothing to fetch
    images = _images(page)
    assert len(images) == 4  # a, b, c, d (enough feasible trials); no compiled trial for g
    for data in images:
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        height, width = matplotlib.image.imread(io.BytesIO(data), format="png").shape[:2]
        assert height > 100 and width > 100
    assert "oom" in page  # the trials that did not fit are in the table and the plots
    assert "speedup" in page and "samples/sec" in page


def test_report_to_a_chosen_file_and_missing_study(out_of_memory: OutOfMemory,
                                                   tmp_path: Path) -> None:
    target = tmp_path / "out" / "page.html"
    done = cli("report", "wide_inputs", "--studies-dir", str(out_of_memory.studies), "-o",
               str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith("<!DOCTYPE html>")
    missing = cli("report", "nope", "--studies-dir", str(out_of_memory.studies))
    assert missing.returncode == 2
    assert "nope" in missing.stderr and "Traceback" not in missing.stderr


def test_optuna_cli_reads_the_study_storage(out_of_memory: OutOfMemory) -> None:
    optuna_cli = Path(sys.executable).with_name("optuna")  # installed beside this interpreter
    done = subprocess.run(
        [str(optuna_cli), "studies", "--storage",
         str(out_of_memory.studies / "wide_inputs" / "journal.log"), "--storage-class",
         "JournalFileBackend", "-f", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    studies = json.loads(done.stdout)
    assert [s["name"] for s in studies] == ["wide_inputs"]
    assert studies[0]["n_trials"] == len(out_of_memory.trials)
