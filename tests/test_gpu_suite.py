"""benchmarks/gpu_suite.py: on a machine without a GPU, its dry run prints the whole plan and
runs its cheapest step for real on CPU, so the first GPU lent needs one call."""

from __future__ import annotations

import json
import subprocess
import sys
from types import ModuleType

import pytest

from autotune.cli import build_parser, split_script_args

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


def gpu_suite() -> ModuleType:
    """benchmarks/gpu_suite.py as a module: its plans are read here, not run."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_suite


def test_the_quick_plan_starts_with_a_default_gpt2_small_study_and_fits_540_s(tmp_path) -> None:
    """A short lease's plan in one call: the machine, a default study of models/gpt.py at its
    own GPT-2-small size under a whole-run --budget of at most 4 minutes, a loader-bound default
    study, then the benches; every step's worst case together within 540 s, and each command one
    the CLI accepts."""
    suite = gpu_suite()
    steps = suite.quick_plan()
    assert steps[0].name == "env" and not steps[0].args
    study = " ".join(suite.command(steps[1], tmp_path))
    assert "run --model models/gpt.py" in study and "--budget" in study
    assert suite.QUICK_STUDY_BUDGET_S <= 240
    assert "--model-arg" not in study and "--set" not in study  # the file's own size, defaults
    loader = steps[2].args
    assert steps[2].name == "quick-study-loader" and loader[0] == "run" and "--budget" in loader
    assert (ROOT / loader[loader.index("--model") + 1]).is_file()
    assert [step.name for step in steps[3:]] == [
        "quick-bench-gpt2-answer-default", "quick-bench-gpt2-answer-reduce-overhead"]
    assert sum(step.max_s for step in steps) <= suite.QUICK_BUDGET_S == 540
    parser = build_parser()
    for step in steps[1:]:  # every command parses, each of its flags known
        own, _ = split_script_args(suite.command(step, tmp_path)[3:])
        assert parser.parse_args(own).command == step.args[0], step


def test_the_follow_up_plan_fits_540_s_and_holds_what_the_quick_one_left_unproven(
        tmp_path) -> None:
    """The second lease's plan: an HF Trainer script study under the budget its answer needs,
    then max-autotune compiled on a GPT of the script's size; its worst cases within the short
    lease's 540 s, each command one `run` or `bench`."""
    suite = gpu_suite()
    steps = suite.followup_plan()
    assert sum(step.max_s for step in steps) <= suite.QUICK_BUDGET_S
    names = [step.name for step in steps]
    assert names == ["env", "followup-script-hf", "followup-bench-small-gpt-bf16-max-autotune"]
    script = steps[1].args
    assert script[script.index("--budget") + 1] == "320s"
    assert suite.command(steps[1], tmp_path)[-2:] == ["--report_to", "none"]
    assert "compile_mode=max-autotune" in steps[2].args and "precision=bf16" in steps[2].args
    assert "vocab_size=8192" in steps[2].args
