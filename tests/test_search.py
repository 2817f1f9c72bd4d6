"""The search's shortcuts: the memory model, the DataLoader plan, screening (multi-fidelity),
the time-to-train objective and the study's compile cache; real loaders, real trials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.loader_plan import LoaderRate, choose_loader, feeds, measure_loader_rates
from autotune.measure import MeasureSettings, measure_config, time_to_train_s
from autotune.memory_model import MemoryModel, largest_fitting_micro, prediction_errors
from autotune.tuner import TuneOptions, Tuner, load_study
from autotune.workload import load_workload

from .conftest import FAST, ROOT, TINY_SOURCE, run_cli

MIB = 2**20
TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256", "--fix", "compile_mode=none"]


def trial(number: int, micro: int, status: str, peak_mib: float | None = None,
          precision: str = "fp32", **attrs: object) -> dict:
    config = TrainConfig(micro_batch_size=micro, precision=precision).to_dict()
    return {"number": number, "config": config, "status": status,
            "peak_memory_bytes": peak_mib * MIB if peak_mib else None, **attrs}


def test_memory_model_fits_a_line_per_family_and_skips_what_cannot_fit() -> None:
    model = MemoryModel([trial(0, 8, "ok", 300), trial(1, 16, "ok", 400),
                         trial(2, 8, "ok", 250, precision="bf16")])
    big = trial(9, 64, "new")["config"]
    assert model.predict(big) == pytest.approx(1000 * MIB)
    assert model.predict(trial(9, 64, "new", precision="bf16")["config"]) is None  # one point
    verdict = model.verdict(big, limit_bytes=800 * MIB)
    assert verdict is not None and verdict.predicted_peak_bytes == pytest.approx(1000 * MIB)
    assert "0.98 GiB" in verdict.message and "2 measured trials" in verdict.message
    # Within the margin the trial is run: the line may be off by a few percent.
    assert model.verdict(big, limit_bytes=980 * MIB) is None
    assert model.verdict(trial(9, 32, "new")["config"], limit_bytes=800 * MIB) is None


def test_memory_model_stops_at_an_out_of_memory_wall_once_memory_grows() -> None:
    model = MemoryModel([trial(0, 8, "ok", 300), trial(1, 16, "ok", 320), trial(3, 32, "oom")])
    wall = model.verdict(trial(9, 64, "new")["config"], limit_bytes=None)
    assert wall is not None and wall.wall_trial == 3
    assert model.verdict(trial(9, 24, "new")["config"], limit_bytes=None) is None
    # Without a fit that grows (one point, or a CPU peak falling with the micro-batch) an
    # out-of-memory trial says nothing about larger ones.
    alone = MemoryModel([trial(0, 8, "ok", 300), trial(3, 32, "oom")])
    assert alone.verdict(trial(9, 64, "new")["config"], limit_bytes=None) is None
    falling = MemoryModel([trial(0, 8, "oom"), trial(1, 16, "ok", 320), trial(2, 32, "ok", 300)])
    assert falling.verdict(trial(9, 64, "new")["config"], limit_bytes=None) is None


def test_one_measured_peak_bounds_the_first_micro_batch_tried() -> None:
    # 100 MiB of training state; the other 200 MiB at micro-batch 8 grow with it.
    def fits(limit_mib: int) -> int:
        return largest_fitting_micro([4, 8, 16, 32, 64], 300 * MIB, 8, 100 * MIB,
                                     limit_mib * MIB)
    assert fits(900) == 32 and fits(2000) == 64 and fits(500) == 16 and fits(120) == 4


def test_memory_model_reports_its_error() -> None:
    errors = prediction_errors([trial(4, 16, "ok", 400, predicted_peak_bytes=360 * MIB),
                                trial(5, 8, "ok", 300, predicted_peak_bytes=330 * MIB)])
    assert errors["checked"] == 2
    assert errors["max_abs_error"] == pytest.approx(0.1)
    assert errors["median_abs_error"] == pytest.approx(0.1)


def test_loader_plan_picks_the_fewest_workers_that_feed_the_model() -> None:
    rates = [LoaderRate(0, None, 10_000.0), LoaderRate(2, 2, 30_000.0),
             LoaderRate(2, 4, 31_000.0), LoaderRate(4, 2, 60_000.0)]
    assert choose_loader(rates, 400.0) == rates[0]        # in-process costs < 5% of a step
    assert choose_loader(rates, 15_000.0) == rates[1]     # 2 workers outrun it by 1.5x
    assert choose_loader(rates, 30_000.0) == rates[3]
    assert choose_loader(rates, 50_000.0) is None         # loader-bound: searched for real
    assert not feeds(rates[0], 1_000.0)
    # On CPU workers take the cores training uses: only in-process loading is planned.
    assert choose_loader(rates, 400.0, workers_share_cores=True) == rates[0]
    assert choose_loader(rates, 15_000.0, workers_share_cores=True) is None


def test_loader_rates_are_measured_on_the_real_dataloader() -> None:
    workload = load_workload(str(ROOT / "models" / "mlp.py"),
                             {"feature_dim": 32, "num_samples": 2048})
    rates = measure_loader_rates(workload, 64, [(0, None), (1, 2)])
    assert [(r.num_workers, r.prefetch_factor) for r in rates] == [(0, None), (1, 2)]
    assert all(r.samples_per_sec > 100 for r in rates)


def tiny_workload(write_model) -> object:
    return load_workload(str(write_model(TINY_SOURCE)), {})


def test_screening_stops_a_slow_configuration_after_its_short_window(write_model) -> None:
    workload = tiny_workload(write_model)
    config = TrainConfig(micro_batch_size=8)
    settings = MeasureSettings(window_steps=20, window_seconds=0.5, warmup_max_seconds=2,
                               profile_steps=1, screen_steps=3)
    full = measure_config(workload, config, torch.device("cpu"), settings)
    assert not full.screened and full.window_steps >= 20 and full.top_operators
    screened = measure_config(workload, config, torch.device("cpu"), MeasureSettings(
        **{**vars(settings), "screen_below": full.samples_per_sec * 100}))
    assert screened.screened and screened.window_steps == 3 and not screened.top_operators
    assert screened.samples_per_sec == screened.screen_samples_per_sec
    assert screened.screen_done_s > 0


def test_time_to_train_counts_start_up_so_compile_pays_only_on_long_runs() -> None:
    plain = {"setup_s": 1.0, "time_to_first_step_s": 0.5, "warmup_steps": 3, "warmup_s": 0.3,
             "window_s": 1.0, "window_steps": 10}
    compiled = {**plain, "time_to_first_step_s": 30.0, "window_s": 0.5}
    assert time_to_train_s(plain, 1) == pytest.approx(1.5)
    assert time_to_train_s(plain, 104) == pytest.approx(1.5 + 0.3 + 100 * 0.1)
    assert time_to_train_s(plain, 100) < time_to_train_s(compiled, 100)
    assert time_to_train_s(plain, 10_000) > time_to_train_s(compiled, 10_000)


def test_a_study_plans_the_loader_screens_and_optimizes_time_to_train(tmp_path) -> None:
    done = run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--trials", "6",
                   "--seed", "2", "--confirm-top", "1", "--confirm-repeats", "1",
                   "--train-steps", "300", "--stall-penalty", "0", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["train_steps"] == 300
    assert summary["best_time_to_train_s"] > 0 and summary["baseline_time_to_train_s"] > 0
    assert len(summary["loader_rates"]) == 5  # workers 0, then 1 and 2 with prefetch 2 or 4
    trials = load_study("mlp", tmp_path).get_trials(deepcopy=False)
    ran = [t for t in trials if t.user_attrs.get("status") in ("ok", "screened")]
    for t in ran:  # the objective is samples/sec over the whole run, start-up included
        steps = t.user_attrs["window_samples"] / t.user_attrs["window_steps"]
        assert t.value == pytest.approx(300 * steps / t.user_attrs["time_to_train_s"])
        assert t.user_attrs["time_to_train_s"] > t.user_attrs["time_to_first_step_s"]
    for t in trials:
        plan = t.user_attrs.get("loader_plan")
        if plan:
            assert t.user_attrs["config"]["num_workers"] == plan["num_workers"]
    # Right after the baseline: the fast corner at the largest micro-batch of the space.
    assert [t.user_attrs.get("role") for t in trials[:2]] == ["baseline", "fast-corner"]
    corner = trials[1].user_attrs["config"]
    assert (corner["micro_batch_size"], corner["precision"], corner["activation_checkpointing"],
            corner["optimizer_impl"]) == (256, "bf16", "none", "fused")
    assert "time for 300 steps" in summary_text(tmp_path)


def summary_text(studies: Path) -> str:
    return (studies / "mlp" / "summary.md").read_text()


def test_plain_tpe_searches_without_the_shortcuts(tmp_path) -> None:
    done = run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--trials", "4",
                   "--seed", "2", "--confirm-repeats", "0", "--plain-tpe", "--json",
                   timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["loader_rates"] is None
    trials = load_study("mlp", tmp_path).get_trials(deepcopy=False)
    assert not any("loader_plan" in t.user_attrs or "predicted_peak_bytes" in t.user_attrs
                   or t.user_attrs.get("status") == "screened"
                   or t.user_attrs.get("role") == "fast-corner" for t in trials)


def test_trials_compile_into_a_cache_under_the_study(tmp_path, write_model,
                                                     monkeypatch) -> None:
    seen = tmp_path / "seen.txt"
    model = write_model(TINY_SOURCE + f'''
import os
def _record():
    open({str(seen)!r}, "w").write(os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
_record()
''')
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    tuner = Tuner(TuneOptions(model_path=str(model), device="cpu",
                              studies_dir=str(tmp_path / "studies"),
                              settings=MeasureSettings(window_steps=2, window_seconds=0.1,
                                                       profile_steps=0)), _Silent())
    result = tuner._measure(tuner.baseline, "trial-0", 120)
    assert result.status == "ok"
    assert seen.read_text() == str(tuner.directory / "inductor")


def tell(tuner: Tuner, status: str, peak_mib: float | None = None) -> dict:
    """Ask the study for its next trial and record an outcome for it, as a trial would."""
    asked = tuner.study.ask()
    config = tuner.space.suggest(asked)
    asked.set_user_attr("config", config.to_dict())
    asked.set_user_attr("status", status)
    if peak_mib:
        asked.set_user_attr("peak_memory_bytes", peak_mib * MIB)
    tuner._tell_complete(asked, 100.0 if status == "ok" else 0.0, feasible=status == "ok")
    return config.to_dict()


def test_fast_corner_comes_after_the_baseline_and_steps_down_when_it_does_not_fit(
        tmp_path) -> None:
    tuner = Tuner(TuneOptions(
        model_path=str(ROOT / "models" / "mlp.py"), device="cpu", studies_dir=str(tmp_path),
        model_args={"feature_dim": 32, "hidden": 64, "layers": 2, "num_samples": 4096},
        global_batch=1024, fixes={"compile_mode": "none"}, memory_limit_bytes=1000 * MIB,
        memory_headroom=0.0), _Silent())
    tuner.study.enqueue_trial(tuner.space.params_for(tuner.baseline),
                              user_attrs={"role": "baseline"})
    assert tuner._next_corner() is None  # the baseline's peak decides the first size
    tell(tuner, "over_memory", peak_mib=1100)  # 1024 samples do not fit: 512 should
    corners = []
    for outcome in ("over_memory", "oom", "ok"):
        tuner.study.enqueue_trial(tuner._next_corner(), user_attrs={"role": "fast-corner"})
        corners.append(tell(tuner, outcome, peak_mib=1100 if outcome == "over_memory" else None))
    assert [c["micro_batch_size"] for c in corners] == [512, 256, 128]
    assert all((c["precision"], c["activation_checkpointing"], c["optimizer_impl"]) ==
               ("bf16", "none", "fused") for c in corners)
    assert tuner._next_corner() is None  # one fitted: the search goes on with TPE


class _Silent:
    def trial_started(self, *args: object) -> None: ...
    def phase(self, *args: object) -> None: ...
    def trial_finished(self, *args: object) -> None: ...
    def note(self, *args: object) -> None: ...
