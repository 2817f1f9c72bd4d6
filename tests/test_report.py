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

from autotune.config import TrainConfig
from autotune.records import compile_rows

from .conftest import FAST, run_cli

SECTIONS = ("a. Samples/sec vs micro-batch size", "b. Peak memory vs micro-batch size",
            "c. Best so far", "d. Parameter importance", "e. Best vs baseline",
            "f. Where the best configuration spends its time", "g. Compile: time vs gain")
# Micro-batches of 16384 cannot fit 1200 MiB with these sizes; 128 to 512 can. On CPU the peak
# is the process's resident set, which accumulation also grows, so accumulation is held at 1.
SPACE = """\
micro_batch_size: [128, 256, 512, 16384]
precision: [fp32, bf16]
optimizer_impl: [for_loop, foreach]
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
        "--confirm-repeats", "1", timeout=900)
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


def _record(number: int, compile_mode: str, sps: float, first_step_s: float,
            precision: str = "fp32", micro: int = 64) -> dict:
    return {"number": number, "status": "ok", "duplicate": False, "role": "search",
            "samples_per_sec": sps, "time_to_first_step_s": first_step_s,
            "config": TrainConfig(micro_batch_size=micro, grad_accum_steps=2,
                                  precision=precision, compile_mode=compile_mode).to_dict()}


def test_compile_break_even_from_its_uncompiled_twin() -> None:
    plain = _record(0, "none", sps=1000.0, first_step_s=1.0)
    compiled = _record(1, "default", sps=2000.0, first_step_s=31.0)
    slower = _record(2, "max-autotune", sps=900.0, first_step_s=11.0)
    rows = {r["trial"]: r for r in compile_rows([plain, compiled, slower])}
    # 128 samples a step: 0.128 s uncompiled, 0.064 s compiled; 30 s of compile pays off after
    # 30 / 0.064 steps.
    assert rows[1]["compile_s"] == pytest.approx(30.0)
    assert rows[1]["gain"] == pytest.approx(1.0)
    assert rows[1]["break_even_steps"] == pytest.approx(30 / 0.064)
    assert "same knobs" in rows[1]["reference"]
    assert rows[2]["break_even_steps"] is None  # slower when compiled: never pays off


def test_compile_gain_is_not_credited_with_another_precision() -> None:
    rows = compile_rows([_record(0, "none", 1000.0, 1.0, precision="fp32"),
                         _record(1, "default", 3000.0, 20.0, precision="bf16")])
    assert rows == []
