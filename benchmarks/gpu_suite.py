"""The first evidence from a GPU: every CUDA path of autotune run for real, raw results kept.

`--quick` is the plan for a short lease (one call of at most 9 minutes), in order of what it
proves, its steps' worst cases within 540 s:

- `env`: the machine and versions, and the matmul peak measured in bf16, tf32 and fp32;
- `quick-study-gpt2`: a default `autotune run` of models/gpt.py at its own GPT-2-small size
  (124M parameters, block 1024) under `--budget` (at most 4 minutes), so that it ends with a
  known verdict, its MFU against the data sheet and the measured bf16 peak;
- `quick-study-loader`: a default study of the storage-bound image loader written for issue
  38 (benchmarks/results/expert_bar/storage_images.py): the GPU's idle share before and after;
- `quick-bench-gpt2-answer-*`: `autotune bench` of that GPT-2 as its default answer has been
  on both GPUs (micro-batch 32 x 1, bf16, fused AdamW) compiled (default) and with
  reduce-overhead (CUDA graphs): how much of the gap to the roofline compiling closes.

`--followup` is the next short lease's plan: what the quick plan left unproven
(docs/benchmarks.md keeps the list), its worst cases within 540 s too:

- `followup-script-hf`: a Hugging Face Trainer script study (`--script`) of a smaller GPT-2
  with the libraries the GPU machine has, under the budget its answer needs (5.2 min, the
  H200 said at 120 s);
- `followup-bench-small-gpt-bf16-max-autotune`: models/gpt.py at that script's size benched in
  bf16 compiled with max-autotune (its kernels' autotuning inside the bench's time limit), the
  one compile mode no GPU has run to a result (the 6x512 GPT's took more than 140 s).

The full plan, without `--quick`, runs through the real CLI, each as one step:

- `env`: the machine (nvidia-smi, torch, each GPU as autotune describes it, the TF32 settings
  each precision leaves);
- `bench-*`: `autotune bench` of a mid-size GPT with gradient accumulation 4 in each precision
  (fp32, tf32, bf16, fp16) and each compile mode (none, default, reduce-overhead, max-autotune,
  max-autotune-no-cudagraphs), and the padded-batch RGAT compiled (recompiles and CUDA-graph
  recordings);
- `knob-*`: the knobs of today's GPUs on the same GPT in bf16: each attention kernel (flash,
  efficient, cudnn, math), each optimizer (adafactor, adamw_8bit), and, on a wider GPT whose
  linear layers are large enough (n_embd 1024), float8 training with tensorwise and rowwise
  scales against bf16, all compiled (GPUs of compute capability 8.9+; torchao and bitsandbytes
  installed: `pip install -e ".[knobs]"`);
- `study-*`: short `autotune run` studies of models/mlp.py, rgat.py and gpt.py at their own
  (realistic) sizes;
- `devices`: a study with `--devices cuda:0,cuda:1` when two GPUs are present;
- `group-*` (two GPUs or more): `autotune bench` of the GPT as a process group of every GPU
  under DDP and under FSDP (NCCL), and a `--nproc-per-node` study that searches both and their
  knobs.

Each step writes OUT/<step>.json (the command, its exit code, wall time and what it printed:
bench's JSON record, run's summary) and its logs under OUT/logs/ (studies under OUT/studies/).
A step whose result exists is skipped, so the suite resumes where it stopped; `--budget`
starts a step only when its worst case fits in what is left (defaults fit a 10-minute call),
and `--only` picks steps by name. The steps run in order of what they prove, cheapest first.

    python benchmarks/gpu_suite.py --quick --out /tmp/suite     # the 10-minute plan
    python benchmarks/gpu_suite.py --quick --out /tmp/suite --dry-run   # its plan, on CPU
    python benchmarks/gpu_suite.py --followup --out /tmp/suite  # the next 10-minute plan
    python benchmarks/gpu_suite.py --out benchmarks/results/gpu_h100           # until budget
    python benchmarks/gpu_suite.py --out OUT --only bench-gpt-bf16 --budget 300
    python benchmarks/gpu_suite.py --out /tmp/suite --dry-run    # the plan; one CPU step runs

It prints what each step gave; it asserts nothing.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.show.report import diagnosis_lines  # noqa: E402
from autotune.study.results import load_study, study_summary  # noqa: E402
from autotune.trial.protocol import Measurement  # noqa: E402

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
COMPILE_MODES = ("none", "reduce-overhead", "max-autotune", "default",
                 "max-autotune-no-cudagraphs")
# GPT-2-style, smaller than GPT-2 small so that max-autotune compiles in minutes, with
# accumulation 4: what CUDA graphs and accumulation must survive together.
GPT_BENCH = ["--model", "models/gpt.py", "--model-arg", "n_layer=6", "--model-arg",
             "n_embd=512", "--model-arg", "n_head=8", "--model-arg", "block_size=512",
             "--model-arg", "vocab_size=32768", "--set", "micro_batch_size=8",
             "--set", "grad_accum_steps=4"]
# Wide enough that float8 converts its linears (both sides >= 1024).
GPT_WIDE_BENCH = [{"n_embd=512": "n_embd=1024", "n_head=8": "n_head=16"}.get(a, a)
                  for a in GPT_BENCH]
RGAT_BENCH = ["--model", "models/rgat.py", "--set", "micro_batch_size=64",
              "--set", "grad_accum_steps=2"]
WINDOWS = ["--warmup-max-seconds", "30", "--window-seconds", "3", "--profile-steps", "2"]
BENCH_LIMIT_S = 300
STUDY_TIMEOUT_S = 150
STUDY_TRIAL_LIMIT_S = 120
STUDY = ["--timeout", f"{STUDY_TIMEOUT_S}s", "--trial-time-limit", str(STUDY_TRIAL_LIMIT_S),
         "--confirm-top", "1", "--confirm-repeats", "1", "--seed", "0", *WINDOWS]
# The quick plan: every step's worst case together within QUICK_BUDGET_S.
QUICK_BUDGET_S = 540
# The GPT-2-small study at the 4 minutes issue 52 allows: at 220 s on the H200 (268a5c1) its
# proof had 36 s after 85 s of loss runs, and fused AdamW was never raced.
QUICK_STUDY_BUDGET_S = 240
QUICK_LOADER_BUDGET_S = 100
# The HF script study's budget: at 120 s the H200 said "an answer needs 5.2 min".
FOLLOWUP_SCRIPT_BUDGET_S = 320
# What is left of the lease for the one compile mode no GPU has run to a result: its GEMM
# autotuning happens inside the bench's first step (more than 140 s for the 6x512 GPT with a
# 32768 vocabulary on the H200: 11 s for its LM head alone), so it compiles the script's size.
FOLLOWUP_MAX_AUTOTUNE = "max-autotune"
FOLLOWUP_MAX_AUTOTUNE_S = 170
SMALL_GPT = ["--model", "models/gpt.py", "--model-arg", "n_layer=4", "--model-arg", "n_embd=256",
             "--model-arg", "n_head=4", "--model-arg", "block_size=256", "--model-arg",
             "vocab_size=8192", "--set", "micro_batch_size=8", "--set", "grad_accum_steps=2"]
# GPT-2 small's default answer on both GPUs (micro-batch 32 x 1 + bf16 + fused AdamW, 34.1%
# MFU uncompiled on the H200): benched compiled, what it leaves of the roofline's gap.
GPT2_ANSWER = ["--set", "micro_batch_size=32", "--set", "grad_accum_steps=1", "--set",
               "precision=bf16", "--set", "optimizer_impl=fused"]
# A bench's own limits, short enough that five of them fit beside the study.
QUICK_WINDOWS = ["--warmup-max-seconds", "15", "--window-seconds", "2", "--window-max-seconds", "5",
                 "--profile-steps", "1"]
# The HF script at a size whose trials start and measure in seconds on a GPU.
HF_SCRIPT = ["--script", "benchmarks/scripts/hf_gpt2_trainer.py"]
HF_SCRIPT_ARGS = ["--output_dir", "/tmp/autotune-hf-out", "--n_layer", "4", "--n_embd", "256",
                  "--n_head", "4", "--block_size", "256", "--vocab_size", "8192",
                  "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
                  "--max_steps", "5000", "--report_to", "none"]


@dataclass(frozen=True)
class Step:
    """One command of the suite and the longest it can take."""

    name: str
    args: tuple[str, ...]  # `autotune ARGS`; empty for the environment step
    max_s: float


def plan(gpus: int) -> list[Step]:
    """Every step, most telling first."""
    steps = [Step("env", (), 60)]
    for mode in COMPILE_MODES:
        for precision in PRECISIONS:
            steps.append(_bench(f"bench-gpt-{precision}-{mode}", GPT_BENCH, precision, mode))
        if mode == "reduce-overhead":  # after the first CUDA-graph benches: varying shapes
            for rgat_mode in ("none", "default", "reduce-overhead"):
                steps.append(_bench(f"bench-rgat-bf16-{rgat_mode}", RGAT_BENCH, "bf16",
                                    rgat_mode))
    steps += _knob_steps()
    # trials until the timeout, the last one to its limit, then the winner and the baseline
    study_max = STUDY_TIMEOUT_S + 3 * STUDY_TRIAL_LIMIT_S + 30
    for model in ("mlp", "rgat", "gpt"):
        steps.append(Step(f"study-{model}", ("run", "--model", f"models/{model}.py",
                                             "--study", model, *STUDY), study_max))
    if gpus >= 2:
        steps.append(Step("devices", ("run", "--model", "models/mlp.py", "--study", "devices",
                                      "--devices", "cuda:0,cuda:1", *STUDY), study_max))
        group = ("--nproc-per-node", str(gpus))
        for parallelism in ("ddp", "fsdp"):
            steps.append(Step(f"group-bench-gpt-{parallelism}", (
                "bench", *GPT_BENCH, *group, "--set", "precision=bf16", "--set",
                f"parallelism={parallelism}", *WINDOWS, "--time-limit", str(BENCH_LIMIT_S)),
                BENCH_LIMIT_S + 30))
        steps.append(Step("group-study-gpt", ("run", "--model", "models/gpt.py", "--study",
                                              "group", *group, *STUDY), study_max + 300))
    return steps


def quick_plan() -> list[Step]:
    """The short lease's plan: the machine, a default GPT-2-small study that ends with a known
    verdict, a loader-bound default study, then that GPT-2 benched compiled and with CUDA
    graphs."""
    steps = [Step("env", (), 20),
             Step("quick-study-gpt2", ("run", "--model", "models/gpt.py", "--study", "gpt2",
                                       "--budget", f"{QUICK_STUDY_BUDGET_S}s", "--seed", "0"),
                  QUICK_STUDY_BUDGET_S + 35),
             Step("quick-study-loader", (
                 "run", "--model", "benchmarks/results/expert_bar/storage_images.py", "--study",
                 "loader", "--budget", f"{QUICK_LOADER_BUDGET_S}s", "--seed", "0"),
                  QUICK_LOADER_BUDGET_S + 25)]
    for mode, max_s in (("default", 60), ("reduce-overhead", 60)):  # 43 and 45 s so far
        steps.append(Step(f"quick-bench-gpt2-answer-{mode}", (
            "bench", "--model", "models/gpt.py", *GPT2_ANSWER, "--set", f"compile_mode={mode}",
            *QUICK_WINDOWS, "--time-limit", str(max_s - 5)), max_s))
    return steps


def followup_plan() -> list[Step]:
    """The next short lease's plan: an HF Trainer script study given the budget its answer
    needs, then max-autotune compiled to a result (its kernels' autotuning included) on a GPT
    of the script's size."""
    return [Step("env", (), 20),
            Step("followup-script-hf", (
                "run", *HF_SCRIPT, "--study", "hf", "--budget", f"{FOLLOWUP_SCRIPT_BUDGET_S}s",
                "--seed", "0", "--", *HF_SCRIPT_ARGS), FOLLOWUP_SCRIPT_BUDGET_S + 15),
            Step(f"followup-bench-small-gpt-bf16-{FOLLOWUP_MAX_AUTOTUNE}", (
                "bench", *SMALL_GPT, "--set", "precision=bf16", "--set",
                f"compile_mode={FOLLOWUP_MAX_AUTOTUNE}", *QUICK_WINDOWS, "--time-limit",
                str(FOLLOWUP_MAX_AUTOTUNE_S)), FOLLOWUP_MAX_AUTOTUNE_S + 10)]


def _knob_steps() -> list[Step]:
    """The attention kernels, the optimizers and float8, each one bench."""
    steps = [Step(f"knob-attention-{kernel}", (
        "bench", *GPT_BENCH, "--set", "precision=bf16", "--set", f"attention_backend={kernel}",
        *WINDOWS, "--time-limit", str(BENCH_LIMIT_S)), BENCH_LIMIT_S + 30)
        for kernel in ("flash", "efficient", "cudnn", "math")]
    steps += [Step(f"knob-optimizer-{name}", (
        "bench", *GPT_BENCH, "--set", "precision=bf16", "--set", f"optimizer={name}",
        *WINDOWS, "--time-limit", str(BENCH_LIMIT_S)), BENCH_LIMIT_S + 30)
        for name in ("adafactor", "adamw_8bit")]
    steps += [_bench(f"knob-float8-{precision}", GPT_WIDE_BENCH, precision, "default")
              for precision in ("bf16", "fp8_tensorwise", "fp8_rowwise")]
    return steps


def _bench(name: str, model: list[str], precision: str, mode: str) -> Step:
    return Step(name, ("bench", *model, "--set", f"precision={precision}", "--set",
                       f"compile_mode={mode}", *WINDOWS, "--time-limit", str(BENCH_LIMIT_S)),
                BENCH_LIMIT_S + 30)


def command(step: Step, out: Path) -> list[str]:
    """The full command line of a step: where its logs and studies go, JSON on stdout."""
    own, script = _split_script_args(step.args)
    args = [sys.executable, "-m", "autotune", *own, "--json"]
    if step.args[0] == "bench":
        args += ["--log", str(out / "logs" / f"{step.name}.log")]
    else:
        args += ["--studies-dir", str(out / "studies")]
    return args + script


def _split_script_args(args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """autotune's own arguments, and a script's (from `--` on), which must stay last."""
    cut = args.index("--") if "--" in args else len(args)
    return list(args[:cut]), list(args[cut:])


def run_step(step: Step, out: Path) -> dict:
    """Run one step and write its result file; returns what was written."""
    started = time.time()
    if not step.args:
        record = {"environment": environment()}
    else:
        argv = command(step, out)
        # its own session, so that a step past its worst case is ended with every process it
        # started (trials hold the GPU), not only the CLI
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=step.max_s)
            record = {"returncode": process.returncode, "stdout": _json_or_text(stdout),
                      "stderr": stderr[-20000:]}
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            record = {"returncode": None, "timed_out_after_s": step.max_s,
                      "stdout": _json_or_text(stdout), "stderr": stderr[-20000:]}
        record["command"] = argv[1:]
    record.update(step=step.name, wall_s=time.time() - started, finished_at=time.time())
    (out / f"{step.name}.json").write_text(json.dumps(record, indent=2))
    return record


def environment() -> dict:
    """The machine, without a CUDA context in this process: NVML, torch, the TF32 flags."""
    import torch

    from autotune.config import PRECISIONS as KNOB_PRECISIONS
    from autotune.hardware import describe
    from autotune.trial.training import set_matmul_precision

    smi = shutil.which("nvidia-smi")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    flags = {}
    for precision in KNOB_PRECISIONS:
        set_matmul_precision(precision, torch.device("cuda"))
        flags[precision] = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    return {
        "python": sys.version, "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "cpus": len(os.sched_getaffinity(0)),
        "nvidia_smi": subprocess.run(
            [smi, "--query-gpu=index,name,memory.total,uuid,pci.bus_id,mig.mode.current",
             "--format=csv"], capture_output=True, text=True).stdout if smi else None,
        "devices": [vars(describe(torch.device("cuda", i))) for i in range(gpus)],
        "tf32_flags_after_each_precision": flags,
        "measured_matmul_tflops": measured_peaks() if gpus else {},
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def measured_peaks() -> dict[str, float]:
    """TFLOP/s of an 8192-square matmul in bf16, tf32 and fp32 on cuda:0, in a process of its
    own (this one holds no CUDA context while the steps measure)."""
    code = ("import json, torch; from autotune.hardware import measure_matmul_flops as m; "
            "print(json.dumps({p: m(torch.device('cuda', 0), p) / 1e12 "
            "for p in ('bf16', 'tf32', 'fp32')}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text[-20000:]


def summary_line(record: dict, out: Path) -> str:
    """What a step gave, in one line: bench's figures, or the study's, read back typed."""
    printed = record.get("stdout")
    if record["step"] == "env":
        env = record["environment"]
        names = ", ".join(d["name"] for d in env["devices"]) or "no GPU"
        return f"torch {env['torch']} CUDA {env['cuda']}: {names}"
    if record.get("returncode") is None:
        return f"killed after {record['timed_out_after_s']:.0f} s"
    if isinstance(printed, dict) and "status" in printed:  # `bench --json`: a measurement
        m = Measurement.from_json(printed)
        mfu = f", MFU {m.mfu:.1%}" if m.mfu is not None else ""
        figures = (f"{m.samples_per_sec:,.0f} samples/s{mfu}, peak "
                   f"{(m.peak_memory_bytes or 0) / 2**30:.2f} GiB, compiles {m.graphs_compiled} "
                   f"(window {m.graphs_compiled_in_window}), CUDA graphs recorded "
                   f"{m.cudagraph_recordings}{_work(m)}" if m.samples_per_sec
                   else printed.get("message", "")[:160])
        return f"{printed['status']}: {figures}"
    if isinstance(printed, dict):  # `run --json`: the study it made
        summary = study_summary(load_study(printed["study"], out / "studies"))
        mfu = f", MFU {summary.best_mfu:.1%}" if summary.best_mfu is not None else ""
        return (f"{summary.verdict} (best {summary.best_samples_per_sec or 0:,.0f} samples/s"
                f"{mfu}; statuses {summary.statuses}) " + " | ".join(diagnosis_lines(summary)))
    return f"exit {record['returncode']}: {record.get('stderr', '')[-160:]}"


def _work(m: Measurement) -> str:
    """Where a bench's profiled step went: its time by kind of work, its kernels a step."""
    kinds = ", ".join(f"{kind.value} {share:.0%}" for kind, share in (m.work_shares or {}).items())
    kernels = f", {m.kernels_per_step:,.0f} kernels a step" if m.kernels_per_step else ""
    return f"; {kinds}{kernels}" if kinds else ""


def dry_run(steps: list[Step], out: Path, budget_s: float) -> None:
    """Print the plan and whether its worst cases fit the budget, then run its cheapest bench
    on CPU with a tiny model, as proof that the commands the suite builds work."""
    for step in steps:
        done = (out / f"{step.name}.json").exists()
        line = " ".join(command(step, out)[1:]) if step.args else "(this script: environment)"
        print(f"{'done' if done else 'todo'} {step.name} (at most {step.max_s:.0f} s): {line}")
    worst = sum(step.max_s for step in steps)
    print(f"worst case {worst:.0f} s: {'fits' if worst <= budget_s else 'does not fit'} "
          f"the budget of {budget_s:.0f} s")
    cpu = Step("dry-run-cpu-bench", (
        "bench", "--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
        "--model-arg", "hidden=64", "--model-arg", "num_samples=2048", "--set",
        "micro_batch_size=16", "--set", "grad_accum_steps=2", "--set", "precision=fp32",
        "--set", "compile_mode=none", "--window-steps", "3", "--window-seconds", "0.2",
        "--warmup-max-seconds", "5", "--profile-steps", "1", "--time-limit", "120"), 150)
    record = run_step(cpu, out)
    print(f"{cpu.name}: {summary_line(record, out)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the raw results")
    parser.add_argument("--quick", action="store_true",
                        help=f"the short lease's plan (worst case {QUICK_BUDGET_S} s)")
    parser.add_argument("--followup", action="store_true",
                        help=f"the next short lease's plan (worst case {QUICK_BUDGET_S} s)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="start a step only if its worst case fits in what is left "
                        f"(default: {QUICK_BUDGET_S} with --quick or --followup, else 560)")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN",
                        help="run only steps whose name matches (glob, repeatable)")
    parser.add_argument("--redo", action="store_true", help="run steps that already have a "
                        "result again")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and run one tiny bench on CPU")
    args = parser.parse_args()
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    short = args.quick or args.followup
    budget = args.budget or (QUICK_BUDGET_S if short else 560.0)
    chosen = quick_plan() if args.quick else followup_plan() if args.followup else plan(gpus)
    steps = [s for s in chosen if not args.only or
             any(fnmatch.fnmatch(s.name, p) for p in args.only)]
    if args.dry_run:
        dry_run(steps, args.out, budget)
        return 0
    if not gpus:
        print("no CUDA device here: use --dry-run", file=sys.stderr)
        return 2
    start = time.monotonic()
    for step in steps:
        if (args.out / f"{step.name}.json").exists() and not args.redo:
            continue
        left = budget - (time.monotonic() - start)
        if step.max_s > left:
            print(f"stopping before {step.name} ({step.max_s:.0f} s at most, {left:.0f} s "
                  "left): run the same command again to go on")
            return 0
        print(f"{step.name} ...", flush=True)
        record = run_step(step, args.out)
        print(f"{step.name} ({record['wall_s']:.0f} s): {summary_line(record, args.out)}",
              flush=True)
    print("every step has a result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
