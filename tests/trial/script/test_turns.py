"""A training script as a warm process: its own loop warms up, then pauses between turns the
tuner asks for, each timed as a window is; the script's output folder is never written, and
its scratch folder goes with the process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.isolation import run_isolated
from autotune.search.warm import WarmRounds
from autotune.target import Script
from autotune.trial.protocol import ProbeSettings, TrialRequest, WarmTurn
from autotune.trial.script.observer import TrainInfo
from autotune.trial.script.turns import STOP, TurnObserver

from ...conftest import ROOT

LOOP = str(ROOT / "tests/models/scripts/loop_nanogpt.py")
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.2, warmup_max_seconds=10,
                           profile_steps=1, screen_steps=0)


@pytest.mark.slow
def test_a_scripts_own_loop_takes_warm_turns_and_is_stopped_between_them(tmp_path) -> None:
    """Two configurations of a nanoGPT-style loop, each in a warm process: after warming up,
    each says itself in the script's own terms (what an answer with no trial of its own is
    told by), answers turns of its own loop's steps (fused AdamW and the baseline's for-loop
    one both measured), a profiler trace on request, and `stop` ends the loop between two
    steps; its --out_dir (checkpoints every step) never appears, and its scratch folders are
    gone."""
    out = tmp_path / "loop-out"
    script = Script(LOOP, ("--out_dir", str(out), "--eval_interval", "1"))
    probe = run_isolated(TrialRequest(script, config={}, device="cpu",
                                      settings=ProbeSettings(candidates={})),
                         300, tmp_path / "probe.log").probe
    assert probe is not None, (tmp_path / "probe.log").read_text()[-3000:]
    requests = [TrialRequest(script, device="cpu", settings=SETTINGS,
                             config=TrainConfig(micro_batch_size=8, grad_accum_steps=2,
                                                optimizer_impl=impl).to_dict(),
                             script_baseline=probe.script_baseline)
                for impl in ("for_loop", "fused")]
    rounds = WarmRounds(requests, [tmp_path / f"warm-{i}.log" for i in range(2)], 120)
    scratch = [process.scratch for process in rounds.processes]
    try:
        answers = [rounds.script_answer(i) for i in range(2)]
        turns = [[rounds.turn(i) for i in range(2)] for _ in range(3)]
        trace = rounds.trace(1, tmp_path / "trace.json")
    finally:
        rounds.close()
    assert answers[0] is not None and answers[0].lines() == []  # the script's own settings
    assert answers[1] is not None and \
        answers[1].lines() == ["loop_nanogpt.py:98: torch.optim.AdamW(..., fused=True)"]
    assert all(run is not None and run.samples_per_sec > 0 and run.ok
               for pair in turns for run in pair)
    assert Path(trace).is_file()
    logs = [(tmp_path / f"warm-{i}.log").read_text() for i in range(2)]
    assert all("the script's loop steady after" in log for log in logs), logs
    assert not out.exists()
    assert all(folder is not None and not folder.exists() for folder in scratch)


@pytest.mark.slow
def test_a_scripts_own_run_that_ends_during_a_turn_is_started_again(tmp_path) -> None:
    """A script trains as long as it says (an Ignite script's 10 epochs, 560 steps, ran out
    after 17 rounds of the race's turns, which went on in fresh processes and ended with
    minutes left, the answer's changes unresolved): the warm process says why it ends, and a
    new one of the same configuration takes its place, so the turns go on."""
    script = Script(LOOP, ("--out_dir", str(tmp_path / "out"), "--max_iters", "400"))
    probe = run_isolated(TrialRequest(script, config={}, device="cpu",
                                      settings=ProbeSettings(candidates={})),
                         300, tmp_path / "probe.log").probe
    assert probe is not None, (tmp_path / "probe.log").read_text()[-3000:]
    request = TrialRequest(script, device="cpu", settings=SETTINGS,
                           config=TrainConfig(micro_batch_size=8, grad_accum_steps=2).to_dict(),
                           script_baseline=probe.script_baseline)
    log, turns = tmp_path / "warm.log", []
    rounds = WarmRounds([request], [log], 120)
    try:  # 0.5 s turns, tens of steps each: the run ends within 40 of them
        while log.read_text().count("the script's loop steady after") < 2 and len(turns) < 40:
            turns.append(rounds.turn(0))
        turns.append(rounds.turn(0))  # the new process's second turn
    finally:
        rounds.close()
    assert "the script's own run ended after 400 optimizer steps, during a turn" in \
        log.read_text(), log.read_text()
    assert len(turns) < 41 and all(run is not None and run.samples_per_sec > 0 for run in turns)
    assert rounds.restarts == 1  # what the race tells the console (`race._say_restarts`)


def test_a_turn_in_which_the_script_compiled_a_graph_is_timed_again() -> None:
    """The script's loop compiles a new shape in the second step of a turn (its smaller last
    batch, say): the turn is timed again at once, two more steps, and the clean one answered."""
    said: list = []
    observer = TurnObserver(MeasureSettings(steady_steps=2, steady_tolerance=100.0,
                                            warmup_max_seconds=5, screen_steps=0),
                            torch.device("cpu"), iter([{"steps": 2, "seconds": 0.0}, STOP]),
                            said.append)
    torch._dynamo.reset()
    compiled = torch.compile(nn.Linear(4, 4), backend="eager", dynamic=False)
    observer.on_train_start(TrainInfo("transformers", torch.device("cpu"), nn.Linear(4, 4), None,
                                      8, 1, startup_s=0.1, dataset_size=64))
    turn_steps = 0
    for _ in range(100):
        if observer.ready:
            turn_steps += 1
            compiled(torch.ones(2 if turn_steps == 2 else 1, 4))  # a new shape: a compile
        else:
            compiled(torch.ones(1, 4))
        time.sleep(0.002)
        if observer.on_step_end(8, torch.tensor(1.0), 0.0):
            break
    turns = [WarmTurn.from_json(m) for m in said if isinstance(m, dict) and "samples" in m]
    assert turn_steps == 4 and len(turns) == 1 and turns[0].samples == 2 * 8


def test_a_turn_that_waits_on_its_loaders_workers_drains_their_queue_then_spans_many_batches(
        ) -> None:
    """A script whose two loader workers prefetch two batches each, and whose every step waits
    on them: a turn first takes the four batches they queued while paused and one more,
    untimed, then times 16 batches of each worker (32 steps), though 0.02 s asked for would
    end at about 18."""
    said: list = []
    observer = TurnObserver(MeasureSettings(steady_steps=2, steady_tolerance=100.0,
                                            warmup_max_seconds=5, screen_steps=0),
                            torch.device("cpu"), iter([{"steps": 2, "seconds": 0.02}, STOP]),
                            said.append, config=TrainConfig(micro_batch_size=8, num_workers=2,
                                                            prefetch_factor=2))
    observer.on_train_start(TrainInfo("transformers", torch.device("cpu"), nn.Linear(4, 4), None,
                                      8, 1, startup_s=0.1, dataset_size=64))
    turn_steps = 0
    for _ in range(200):
        turn_steps += observer.ready
        time.sleep(0.001)  # the step, all of it waiting for the next batch
        if observer.on_step_end(8, torch.tensor(1.0), 0.001):
            break
    turns = [WarmTurn.from_json(m) for m in said if isinstance(m, dict) and "samples" in m]
    assert len(turns) == 1 and turns[0].samples == 32 * 8
    assert turn_steps == 4 + 1 + 32
