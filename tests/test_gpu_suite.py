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


@pytest.mark.slow
def test_the_quick_plan_starts_with_a_default_gpt2_small_study_and_fits_540_s(tmp_path) -> None:
    """A short lease's plan: the machine, then a default study of models/gpt.py at its own
    GPT-2-small size under a whole-run --budget, the benches, an HF script study; every
    step's worst case together within 540 s, and each command one the CLI accepts."""
    done = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--quick", "--out",
                           str(tmp_path), "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("todo ")]
    assert steps[0].startswith("todo env ")
    study = steps[1]
    assert "run --model models/gpt.py" in study and "--budget" in study
    assert "--model-arg" not in study and "--set" not in study  # the file's own size, defaults
    names = [line.split()[1] for line in steps]
    assert names[2:7] == [f"quick-bench-gpt2-{p}" for p in (
        "fp32-none", "tf32-none", "bf16-none", "bf16-default", "bf16-reduce-overhead")]
    assert names[7] == "quick-script-hf" and steps[7].rstrip().endswith("--report_to none")
    assert "worst case 540 s: fits the budget of 540 s" in done.stdout
    for line in steps[1:]:  # every command parses: --help after its own arguments
        argv = line.split(": ", 1)[1].split()[2:]
        own = argv[:argv.index("--")] if "--" in argv else argv
        parsed = subprocess.run([sys.executable, "-m", "autotune", *own, "--help"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert parsed.returncode == 0, (line, parsed.stderr)


def test_the_follow_up_plan_fits_540_s_and_holds_what_the_quick_one_left_unproven() -> None:
    """The second lease's plan: a default study of a GPT small enough that its warm processes
    fit together, a loader-bound default study, then fp16 and the flash and cuDNN kernels in
    bf16; its worst cases within the short lease's 540 s, each command one `run` or `bench`."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    steps = gpu_suite.followup_plan()
    assert sum(step.max_s for step in steps) <= gpu_suite.QUICK_BUDGET_S
    names = [step.name for step in steps]
    assert names == ["env", "followup-study-gpt-warm", "followup-study-loader",
                     "followup-bench-gpt-fp16", "followup-bench-gpt-bf16-flash",
                     "followup-bench-gpt-bf16-cudnn"]
    warm, loader = steps[1].args, steps[2].args
    assert warm[0] == "run" and "--budget" in warm and "--set" not in warm
    assert "n_layer=6" in warm and "benchmarks/results/expert_bar/storage_images.py" in loader
    assert (ROOT / loader[loader.index("--model") + 1]).is_file()
    assert "attention_backend=flash" in steps[4].args and "precision=bf16" in steps[4].args
