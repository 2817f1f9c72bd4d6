"""A script trial's measurement, told each optimizer step of the library's loop: first step,
warm-up until steady, screening, a timed window, then it stops the loop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel

from autotune.config import TrainConfig
from autotune.hardware import PeakFlops
from autotune.options import MeasureSettings
from autotune.trial.contention import Contention
from autotune.trial.flops import COMPILED
from autotune.trial.measure import count_flops_per_sample
from autotune.trial.profiling import ProfilerWindow
from autotune.trial.script import measuring
from autotune.trial.script.hf_terms import checkpointing_field
from autotune.trial.script.measuring import COUNT, FIRST, TRACE, WARMUP, MeasuringObserver
from autotune.trial.script.observer import TrainInfo
from autotune.trial.script.runner import run_script
from autotune.trial.script.session import ScriptTrial
from autotune.trial.workload import load_workload
from tests.conftest import ROOT, need
from tests.trial.script.steps import SCRIPTS


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


SETTINGS = MeasureSettings(window_steps=4, window_seconds=0.0, window_max_seconds=5.0,
                           warmup_max_seconds=5.0, screen_steps=2)


class _Probe:
    """A contention probe whose windows are disturbed while `busy` says so, other processes
    then on `share` of the CPUs."""

    def __init__(self, busy: list[bool], share: float = 0.6) -> None:
        self.busy, self.share, self.cpus, self.waits = busy, share, [0, 1], []

    def start(self) -> None:
        pass

    def stop(self) -> Contention:
        disturbed = self.busy.pop(0) if self.busy else False
        return Contention(self.share if disturbed else 0.0, 2, disturbed=disturbed)

    def disturbed_so_far(self) -> bool:
        return bool(self.busy and self.busy[0])

    def wait_for_quiet(self, limit_s: float) -> bool:
        self.waits.append(limit_s)
        return True


def _started(settings: MeasureSettings = SETTINGS) -> MeasuringObserver:
    """An observer on a quiet machine (whatever else this one runs meanwhile)."""
    observer = MeasuringObserver(settings, torch.device("cpu"), probe=_Probe([]),
                                 beside=_Probe([]))
    model = nn.Linear(2, 2)
    observer.on_train_start(TrainInfo("transformers", torch.device("cpu"), model, None, 8, 1,
                                      startup_s=1.5, dataset_size=64))
    return observer


def _steps(observer: MeasuringObserver, losses: list[float], step_s: float = 0.01) -> int:
    """Feed steady steps until the observer stops the loop; how many it took."""
    for n, loss in enumerate(losses, 1):
        time.sleep(step_s)
        if observer.on_step_end(8, torch.tensor(loss), 0.001):
            return n
    return len(losses)


def test_it_warms_up_screens_times_and_stops_the_loop() -> None:
    observer = _started()
    steps = _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=1.5)
    # 1 first step, 3 steady warm-up steps at least, 2 screened, then the 4-step window
    assert steps == 1 + figures.warmup_steps + 2 + figures.window_steps
    assert figures.window_steps >= 4 and figures.window_samples == 8 * figures.window_steps
    assert figures.samples_per_sec == pytest.approx(8 / 0.01, rel=0.5)
    assert figures.setup_s == 1.5 and figures.screen_samples_per_sec is not None
    assert figures.loss_finite and figures.final_loss == 1.0
    assert figures.peak_memory_bytes and figures.data_wait_fraction is not None
    # each phase's wall time, as a model file's trial has them: what a confirmation prices
    phases = figures.phases
    assert phases.screen_s == pytest.approx(2 * 0.01, rel=0.6) and phases.remeasure_s == 0.0
    assert phases.window_s == pytest.approx(figures.window_s, rel=0.2)


def test_after_the_window_the_profiler_sees_the_loops_next_steps(tmp_path) -> None:
    """The profiler's window comes after the timed one (never inside it): 3 more of the loop's
    steps, each from the last one's end, with what the model does in them; its trace written."""
    trace = tmp_path / "trace.json"
    observer = MeasuringObserver(SETTINGS, torch.device("cpu"), probe=_Probe([]),
                                 profiler=ProfilerWindow(3, "cpu", trace), beside=_Probe([]))
    model = nn.Linear(64, 64)
    observer.on_train_start(TrainInfo("transformers", torch.device("cpu"), model, None, 8, 1,
                                      startup_s=1.5))
    steps = 0
    while True:
        steps += 1
        loss = model(torch.randn(8, 64)).pow(2).mean()
        loss.backward()
        if observer.on_step_end(8, loss.detach(), 0.0):
            break
    figures = observer.measurement(startup_s=1.5)
    # the first step, the step traced for host syncs, the warm-up, screening, the window
    assert steps == 1 + 1 + figures.warmup_steps + 2 + figures.window_steps + 3
    assert observer.profile_samples == 3 * 8
    assert "aten::addmm" in {op.name for op in figures.top_operators}
    assert figures.trace_path == str(trace) and trace.is_file()
    assert figures.host_syncs_per_step is not None
    assert figures.phases is not None and figures.phases.profile_s > 0
    assert figures.phases.build_s == 1.5  # the script's start-up prices its confirmation runs


def test_a_slow_configuration_stops_at_screening_and_one_far_below_its_bar_at_once() -> None:
    """8 samples in 50 ms steps (160/s at most): below a bar of 170/s, warmed up to steady and
    screened on the 2-step window; far below one of 1,600/s (a precision this CPU emulates),
    the first warm-up step ends the warm-up and one step screens."""
    for bar, steps_to_screened in ((170.0, None), (1600.0, 1 + 1 + 1)):
        observer = _started(MeasureSettings(**{**vars(SETTINGS), "screen_below": bar}))
        steps = _steps(observer, [1.0] * 100, step_s=0.05)
        figures = observer.measurement(startup_s=0.0)
        assert figures.screened
        if steps_to_screened is None:
            assert figures.steady and figures.warmup_steps >= 3 and figures.window_steps == 2
            assert steps == 1 + figures.warmup_steps + 2
        else:
            assert (steps, figures.warmup_steps, figures.window_steps) == (3, 1, 1)


def test_a_non_finite_loss_in_the_window_is_seen() -> None:
    observer = _started()
    _steps(observer, [1.0] * 6 + [float("nan")] * 100)
    assert not observer.measurement(startup_s=0.0).loss_finite


def test_training_that_ends_before_the_window_says_so() -> None:
    observer = _started()
    _steps(observer, [1.0])
    with pytest.raises(RuntimeError, match="ended before the measurement's window"):
        observer.measurement(startup_s=0.0)


def _probed(busy: list[bool], beside: bool = False, share: float = 0.6,
            **settings: object) -> tuple[MeasuringObserver, _Probe]:
    """An observer whose windows are disturbed while `busy` says so, and its warm-up and
    screening where `beside` does (at the same share)."""
    probe = _Probe(busy, share)
    observer = MeasuringObserver(
        MeasureSettings(**{**vars(SETTINGS), "contention_backoff_s": 0.01, **settings}),
        torch.device("cpu"), probe=probe, beside=_Probe([beside], share))
    observer.on_train_start(TrainInfo("transformers", torch.device("cpu"), nn.Linear(2, 2),
                                      None, 8, 1, startup_s=0.0))
    return observer, probe


def test_a_window_other_processes_disturbed_is_timed_again_once_quiet() -> None:
    # the screening clean, the first window disturbed, the second clean
    observer, probe = _probed([False, True, False])
    _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=0.0)
    assert probe.waits == [0.01]
    assert figures.windows_remeasured == 1 and not figures.disturbed
    assert figures.other_cpu_share == 0.0
    # the wait, the untimed steps and the window timed again
    assert figures.phases.remeasure_s >= 0.01 + figures.window_s * 0.8


def test_a_window_that_stays_disturbed_is_flagged_and_never_screened_out() -> None:
    """Timed again at most `contention_remeasures` times, as a model file's window is, however
    many chances to wait the settings give."""
    observer, probe = _probed([True] * 10, screen_below=1e9, contention_retries=3,
                              contention_remeasures=2)
    _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=0.0)
    assert not figures.screened  # against a bar set on a quiet machine: nothing
    assert figures.disturbed and figures.other_cpu_share == 0.6
    assert figures.windows_remeasured == 2 and probe.waits == [0.01, 0.02]
    # the warm-up was quiet: a load that came with the windows, not the machine's state
    assert figures.machine_load == 0.0 and not figures.steady_load


@pytest.mark.parametrize("bar_load,screened", [(0.2, True), (0.0, False), (0.6, False)])
def test_beside_a_load_the_bar_was_set_at_too_a_slow_configuration_is_screened_out(
        bar_load: float, screened: bool) -> None:
    """Beside a steady load every window is disturbed: per_feature_towers measured in full a
    trial at a sixth of its bar, set beside the same load. A disturbed screening window (other
    processes on a quarter of the CPUs) far below its bar screens out where the bar saw about
    that load, not where it was quiet or under a load twice as heavy."""
    observer, _ = _probed([True] * 20, beside=True, share=0.25, screen_below=1e9,
                          screen_load=bar_load)
    _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=0.0)
    assert figures.disturbed and figures.screened == screened


def test_a_load_the_warm_up_saw_too_is_the_machines_state_and_not_waited_out() -> None:
    observer, probe = _probed([False, True, False], beside=True)
    _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=0.0)
    assert probe.waits == [] and figures.windows_remeasured == 0
    assert figures.disturbed and figures.steady_load and figures.machine_load == 0.6


def test_every_figure_a_model_files_trial_has_is_filled_in() -> None:
    """A script trial's measurement has the figures a model file's has: the load beside it,
    the compiles, the cores, when screening ended (and FLOPs and the lines that sync,
    below)."""
    observer = _started()
    _steps(observer, [1.0] * 100)
    figures = observer.measurement(startup_s=1.5)
    assert figures.machine_load == 0.0 and figures.steady_load is False
    assert figures.graphs_compiled == 0 and figures.graphs_compiled_in_window == 0
    assert figures.cpu_affinity == (0, 1)
    assert figures.screen_done_s is not None and figures.screen_done_s > 1.5


class _Ran(NamedTuple):
    """A step of a loop: the observer's phase, and whether it ran under a dispatch mode (the
    FLOP counter's) and with the tensor methods that read back wrapped (the sync trace's)."""

    phase: str
    counted: bool
    traced: bool


_ITEM = torch.Tensor.item


def _counting_run(model: nn.Module, observer: MeasuringObserver) -> list[_Ran]:
    """A loop's own steps until the observer stops it, each reading its loss back on a line of
    its own, as loops that log do."""
    observer.on_train_start(TrainInfo("loop", torch.device("cpu"), model, None, 8, 1,
                                      startup_s=0.0))
    ran, logged = [], []
    while True:
        ran.append(_Ran(observer.phase, torch._C._len_torch_dispatch_stack() > 0,
                        torch.Tensor.item is not _ITEM))
        loss = model(torch.randn(8, 64)).pow(2).mean()
        loss.backward()
        logged.append(loss.item())
        if observer.on_step_end(8, loss.detach(), 0.0):
            return ran


def test_flops_are_counted_in_a_step_of_the_warm_up_never_in_the_window(monkeypatch) -> None:
    """With `count_flops` (a measurement on CUDA), the step after the first runs under the FLOP
    counter: a step more of warm-up, not one of its steady steps, nor the window's. Its MFU
    is a model file's: FLOPs a sample x the window's samples/sec over the precision's peak (a
    stand-in peak here: a CPU has none)."""
    monkeypatch.setattr(measuring, "peak_flops", lambda info, precision: PeakFlops(
        1e12, f"the {precision} data-sheet peak"))
    observer = MeasuringObserver(SETTINGS, torch.device("cpu"), probe=_Probe([]),
                                 beside=_Probe([]), count_flops=True)
    ran = _counting_run(nn.Linear(64, 64), observer)
    figures = observer.measurement(startup_s=0.0, precision="bf16")
    assert [step.phase for step in ran if step.counted] == [COUNT]
    assert len(ran) == 1 + 1 + figures.warmup_steps + 2 + figures.window_steps
    # forward 2 x 64 x 64 a sample, backward the weight's gradient alone (the input needs none)
    assert (figures.flops_per_sample, figures.flops_source) == (4 * 64 * 64, "counted")
    assert figures.peak_flops_source == "the bf16 data-sheet peak"
    assert figures.mfu == pytest.approx(figures.flops_per_sample * figures.samples_per_sec / 1e12)


def _compiling(model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    """`model` whose first step leaves dynamo's counter as a compile does (a real compile takes
    CPU tens of seconds)."""
    stats = counters["stats"]
    monkeypatch.setitem(stats, "unique_graphs", 0)
    model.register_forward_hook(lambda *args: stats.__setitem__("unique_graphs", 1))
    return model


def test_a_loop_that_runs_compiled_code_is_not_counted_and_says_why(monkeypatch) -> None:
    """A compiled step under the counter would run eagerly, or raise with fullgraph=True: the
    figures keep why there is no count instead."""
    observer = MeasuringObserver(SETTINGS, torch.device("cpu"), probe=_Probe([]),
                                 beside=_Probe([]), count_flops=True)
    ran = _counting_run(_compiling(nn.Linear(64, 64), monkeypatch), observer)
    figures = observer.measurement(startup_s=0.0, precision="bf16")
    assert not any(step.counted for step in ran) and figures.graphs_compiled == 1
    assert (figures.flops_per_sample, figures.flops_source, figures.mfu) == (None, COMPILED, None)


def test_host_syncs_are_traced_in_a_step_of_the_warm_up_never_in_the_window() -> None:
    """Where the trial profiles, the step after the counted one runs with the tensor methods
    that read back wrapped: a step more of warm-up, never a steady one nor the window's. It
    names the loop's own line that reads its loss back, once a step, for the findings."""
    observer = MeasuringObserver(SETTINGS, torch.device("cpu"), probe=_Probe([]),
                                 beside=_Probe([]), profiler=ProfilerWindow(1, "cpu"),
                                 count_flops=True)
    ran = _counting_run(nn.Linear(64, 64), observer)
    figures = observer.measurement(startup_s=0.0)
    assert [step.phase for step in ran if step.traced] == [TRACE]
    assert [step.phase for step in ran[:4]] == [FIRST, COUNT, TRACE, WARMUP]
    assert len(ran) == 1 + 1 + 1 + figures.warmup_steps + 2 + figures.window_steps + 1
    here = Path(__file__)
    assert [(s.call, s.file, s.line, s.calls_per_step) for s in observer.sync_sites] == [
        (".item()", str(here), _line_of(here, "logged.append(loss.item())"), 1.0)]
    assert figures.phases.sync_tracing_s > 0
    assert torch.Tensor.item is _ITEM  # torch's own methods back


@pytest.mark.parametrize("why", ["compiled", "no profiler's window"])
def test_a_loop_that_compiled_or_is_not_profiled_is_not_traced(
        why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo would trace the wrappers and compile again; and without the profiler's window
    there are no findings to name the lines in (a probe, --profile-steps 0)."""
    model = nn.Linear(64, 64)
    if why == "compiled":
        model = _compiling(model, monkeypatch)
    profiler = ProfilerWindow(1, "cpu") if why == "compiled" else None
    observer = MeasuringObserver(SETTINGS, torch.device("cpu"), probe=_Probe([]),
                                 beside=_Probe([]), profiler=profiler)
    ran = _counting_run(model, observer)
    figures = observer.measurement(startup_s=0.0)
    assert not any(step.traced or step.phase == TRACE for step in ran)
    assert len(ran) == 1 + figures.warmup_steps + 2 + figures.window_steps + (profiler is not None)
    assert observer.sync_sites == [] and figures.phases.sync_tracing_s == 0.0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_hugging_face_scripts_counted_flops_are_a_model_files_for_the_same_model(
        tmp_path: Path, checkpointing: bool) -> None:
    """A real script trial (its own Trainer, accumulation 2) counts the FLOPs a sample the
    model-file path counts on the meta device for the same GPT-2, exactly; and so they are 6 x
    its matmuls' weights x tokens plus attention's 12 x tokens^2 x width a layer. Under the
    script's activation checkpointing too: the recompute is not model FLOPs. (Attention runs
    its plain math, whose FLOPs the counter sees on CPU too.)"""
    need("transformers", "examples")
    layers, width, vocab, tokens = 2, 32, 128, 16  # the script's GPT-2 at --block_size 16
    # one window, however busy this machine is
    settings = MeasureSettings(window_steps=3, window_seconds=0.0, warmup_max_steps=2,
                               screen_steps=0, profile_steps=0, contention_retries=0)
    observer = MeasuringObserver(settings, torch.device("cpu"), count_flops=True)
    with sdpa_kernel(SDPBackend.MATH):
        run = run_script(SCRIPTS / "hf_argparser.py", [
            "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "4",
            "--gradient_accumulation_steps", "2",
            *([f"--{checkpointing_field()}"] if checkpointing else [])],
            ScriptTrial(torch.device("cpu"), observer, tmp_path / "scratch"))
    figures = observer.measurement(run.startup_s)
    assert run.steps == 1 + 1 + figures.warmup_steps + figures.window_steps
    workload = load_workload(ROOT / "models/hf_gpt2.py", {
        "n_layer": layers, "n_embd": width, "n_head": 2, "block_size": tokens,
        "vocab_size": vocab})
    model_file = count_flops_per_sample(workload, TrainConfig(micro_batch_size=4),
                                        workload.build_model(), torch.device("cpu"))
    assert figures.flops_source == "counted" and figures.flops_per_sample == model_file
    analytic = 6 * (layers * 12 * width**2 + width * vocab) * tokens + \
        12 * tokens**2 * width * layers
    assert figures.flops_per_sample == analytic


def test_a_loop_that_evaluates_every_epoch_is_timed_on_its_training_alone(
        tmp_path: Path) -> None:
    """timm's habit: an evaluation and a checkpoint at each epoch's end (here about four times
    its 4 training steps). A window across epochs counts neither: its rate is near its steps'
    own (the samples of a median step over its time; a step that starts an epoch's loader is
    slower, and tiny steps jitter: 0.64-1.0 of it in CI); counted, it would be a quarter."""
    need("transformers", "examples")
    settings = MeasureSettings(window_steps=8, window_seconds=0.0, window_max_steps=16,
                               window_max_seconds=5.0, warmup_max_steps=2, screen_steps=0,
                               profile_steps=0, contention_retries=0)
    observer = MeasuringObserver(settings, torch.device("cpu"))
    run_script(SCRIPTS / "loop_timm_style.py", [
        "--eval-batches", "60", "--output", str(tmp_path / "out")],
        ScriptTrial(torch.device("cpu"), observer, tmp_path / "scratch"))
    figures = observer.measurement(0.0)
    assert figures.window_steps >= 8  # two epochs' ends inside the window at least
    steps_own = 8 / figures.step_time_median_s
    assert figures.samples_per_sec > 0.45 * steps_own, (figures.samples_per_sec, steps_own)
