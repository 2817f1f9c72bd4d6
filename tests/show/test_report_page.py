"""`autotune report`: the HTML page of a real CPU study; the ecosystem's viewers on our files."""

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

from ..conftest import CONFIRM_ONCE, FAST, run_cli

SECTIONS = ("a. Samples/sec vs micro-batch size", "b. Peak memory vs micro-batch size",
            "c. Best so far", "d. Parameter importance", "e. Best vs baseline",
            "f. Where the best configuration spends its time", "g. Compile: time vs gain")
# Micro-batches of 16384 cannot fit 1200 MiB with these sizes; 128 to 512 can. On CPU the peak
# is the process's resident set, which accumulation also grows, so accumulation is held at 1.
# bf16 is left out: on CPUs without native bf16 it runs ~50x slower here (16384 samples would
# take minutes a step).
SPACE = """\
micro_batch_size: [128, 256, 512, 16384]
precision: [fp32]
optimizer_impl: [for_loop, foreach, fused]
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("studies")
    space = root / "space.yaml"
    space.write_text(SPACE)
    done = run_cli(
        "run", "--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=2048",
        "--model-arg", "hidden=2048", "--model-arg", "layers=2", "--model-arg",
        "num_samples=20000", "--studies-dir", str(root), "--free-batch-size", "16:65536",
        "--memory-limit", "1200MiB", "--space", str(space), "--fix", "compile_mode=none",
        "--fix", "num_workers=0", "--fix", "activation_checkpointing=none", "--fix",
        "grad_accum_steps=1", *FAST, "--trials", "8", "--seed", "1", "--confirm-top", "1",
        *CONFIRM_ONCE, timeout=900)
    assert done.returncode == 0, done.stderr
    return root


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(data)
            for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


@pytest.mark.slow
def test_report_has_every_section_with_valid_images(study_dir: Path) -> None:
    done = run_cli("report", "mlp", "--studies-dir", str(study_dir))
    assert done.returncode == 0, done.stderr
    path = study_dir / "mlp" / "report.html"
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


@pytest.mark.slow
def test_report_to_a_chosen_file_and_missing_study(study_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "out" / "page.html"
    done = run_cli("report", "mlp", "--studies-dir", str(study_dir), "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith("<!DOCTYPE html>")
    missing = run_cli("report", "nope", "--studies-dir", str(study_dir))
    assert missing.returncode == 2
    assert "nope" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.slow
def test_optuna_cli_reads_the_study_storage(study_dir: Path) -> None:
    optuna_cli = Path(sys.executable).with_name("optuna")  # installed beside this interpreter
    done = subprocess.run(
        [str(optuna_cli), "studies", "--storage", str(study_dir / "mlp" / "journal.log"),
         "--storage-class", "JournalFileBackend", "-f", "json"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    studies = json.loads(done.stdout)
    assert [s["name"] for s in studies] == ["mlp"]
    assert studies[0]["n_trials"] >= 8
