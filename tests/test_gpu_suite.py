"""benchmarks/gpu_suite.py: on a machine without a GPU, its dry run prints the whole plan and
runs its cheapest step for real on CPU, so the first GPU lent needs one call."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.slow
def test_the_dry_run_prints_the_plan_and_runs_a_cpu_bench(tmp_path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--out", str(tmp_path),
                           "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    plan = done.stdout
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        for mode in ("none", "default", "reduce-overhead", "max-autotune",
                     "max-autotune-no-cudagraphs"):
            line = next(x for x in plan.splitlines() if f"bench-gpt-{precision}-{mode} " in x)
            assert f"precision={precision}" in line and f"compile_mode={mode}" in line
            assert "grad_accum_steps=4" in line and "--json" in line
    for model in ("mlp", "rgat", "gpt"):
        assert f"--model models/{model}.py --study {model}" in plan
    assert "--devices" not in plan  # one GPU or none: no two-device study
    record = json.loads((tmp_path / "dry-run-cpu-bench.json").read_text())
    assert record["returncode"] == 0
    assert record["stdout"]["status"] == "ok"
    assert record["stdout"]["config"]["grad_accum_steps"] == 2
    assert (tmp_path / "logs" / "dry-run-cpu-bench.log").exists()
