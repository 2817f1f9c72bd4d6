"""Contention: a trial timed beside CPU-burning processes is measured again and flagged; its
own worker processes are never counted as someone else's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile
from autotune.trial.contention import Contention, cpu_ticks, other_share, own_pids, same_load
from autotune.trial.protocol import Measurement, TrialRequest

from ..conftest import TINY_SOURCE

SETTINGS = MeasureSettings(window_steps=5, window_seconds=0.5, window_max_seconds=1.0,
                           warmup_max_seconds=5, profile_steps=0, screen_steps=0,
                           contention_retries=2, contention_backoff_s=1.0)
BUSY_LOOP = "while True: pass"


def start_burners(count: int) -> list[subprocess.Popen]:
    """Busy-loop processes in their own sessions: strangers to the trial and to this test."""
    burners = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
               for _ in range(count)]
    time.sleep(0.5)  # running before anything is timed
    return burners


def stop(burners: list[subprocess.Popen]) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()


@contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen]]:
    burners = start_burners(count)
    try:
        yield burners
    finally:
        stop(burners)


def machine_busy_share(seconds: float = 1.0) -> float:
    """Share of all CPUs' time other processes used over `seconds`."""
    cpus = range(os.cpu_count() or 1)
    start = cpu_ticks(cpus, os.getpid())
    time.sleep(seconds)
    return other_share(start, cpu_ticks(cpus, os.getpid()), 0) or 0.0


def wait_for_a_quiet_machine(limit_s: float = 45.0) -> None:
    """Other people's work is not this test's to judge: wait for a quiet moment, or skip."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if machine_busy_share() < 0.02:
            return
    pytest.skip("other processes kept the CPUs busy: no quiet moment to time a trial in")


def trial(write_model, tmp_path, on_phase=None, settings=SETTINGS, **config) -> Measurement:
    path = write_model(TINY_SOURCE.replace("size=256", "size=4096"))
    request = TrialRequest(ModelFile(str(path), {"dim": 256}), device="cpu", settings=settings,
                           config=TrainConfig(micro_batch_size=64, **config).to_dict())
    result = run_isolated(request, 120, tmp_path / "trial.log", on_phase=on_phase)
    assert result.status == "ok", result.message
    return result.measurement


@pytest.mark.slow
@pytest.mark.whole_machine
def test_a_load_there_all_along_is_flagged_not_measured_again(write_model, tmp_path) -> None:
    """Busy loops on every core from before the trial to its end: the warm-up and screening saw
    the load and the timed window the same, about half the CPUs, so it is the machine's state:
    no wait for a quiet moment, no window measured again, the load recorded and flagged."""
    with cpu_burners(os.cpu_count() or 1):
        metrics = trial(write_model, tmp_path, settings=replace(SETTINGS, screen_steps=20))
    assert metrics.disturbed and metrics.steady_load
    assert metrics.windows_remeasured == 0 and metrics.phases.remeasure_s < 0.5
    assert metrics.other_cpu_share > 0.25 and metrics.machine_load > 0.25
    log = (tmp_path / "trial.log").read_text()
    assert "the machine's steady load" in log and "for a quiet moment" not in log


def test_the_same_load_in_two_windows_is_the_machines_state_a_passing_one_is_not() -> None:
    def window(share: float | None, device: int | None = None) -> Contention:
        return Contention(share, 2, device_other_processes=device,
                          disturbed=bool(device) or (share or 0.0) > 0.05)

    assert same_load(window(0.15), window(0.24))          # a package install beside it
    assert not same_load(window(0.02), window(0.24))      # quiet, then a burst
    assert not same_load(window(0.45), window(0.10))      # a burst that has passed
    assert same_load(window(None, 1), window(None, 1))    # another process on the GPU
    assert not same_load(window(0.30), window(None, 1))


@pytest.mark.slow
@pytest.mark.whole_machine
def test_a_window_disturbed_for_a_while_is_measured_again_once_it_is_quiet(
        write_model, tmp_path) -> None:
    """The burners start with the timed window (the warm-up was quiet: a load that came) and
    stop once the trial waits; a neighbour's blip on the shared CI machine may still disturb
    the next window (it did: 10% of the CPUs), so this trial may retry 4 times."""
    wait_for_a_quiet_machine()
    burners: list[subprocess.Popen] = []

    def load_comes_and_goes(phase: str) -> None:
        if phase == "timing" and not burners:
            burners.extend(start_burners(os.cpu_count() or 1))
        if "for a quiet moment" in phase:
            stop(burners)

    try:
        metrics = trial(write_model, tmp_path, on_phase=load_comes_and_goes,
                        settings=replace(SETTINGS, window_seconds=3.0, window_max_seconds=4.0,
                                         contention_retries=4, contention_remeasures=4))
    finally:
        stop(burners)
    assert metrics.windows_remeasured >= 1
    assert not metrics.disturbed, metrics.other_cpu_share
    assert "re-measuring the window" in (tmp_path / "trial.log").read_text()


@pytest.mark.slow
@pytest.mark.whole_machine
def test_the_same_trial_on_a_quiet_machine_is_not_flagged(write_model, tmp_path) -> None:
    """Its DataLoader worker is its own process, not another's."""
    wait_for_a_quiet_machine()
    metrics = trial(write_model, tmp_path, num_workers=1, persistent_workers=True)
    assert not metrics.disturbed and metrics.windows_remeasured == 0
    assert metrics.other_cpu_share <= MeasureSettings().contention_threshold


CHILDREN = """
import subprocess, sys, time
busy = ("import time\\nend = time.time() + {}\\nwhile time.time() < end: pass\\n"
        "print(time.process_time())")
time.sleep(0.5)
children = [subprocess.Popen([sys.executable, "-c", busy.format(s)], stdout=subprocess.PIPE,
                             text=True) for s in (1.5, 0.5)]
print(sum(float(c.communicate()[0]) for c in children), flush=True)
time.sleep(60)
"""


def test_a_processs_children_are_its_own_even_once_they_have_exited() -> None:
    """A process's children (DataLoader workers, say) count as its own CPU time, also the ones
    born and gone between the two readings: their parent waited for them."""
    parent = subprocess.Popen([sys.executable, "-c", CHILDREN], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        cpus = range(os.cpu_count() or 1)
        start = cpu_ticks(cpus, parent.pid)
        children_cpu_s = float(parent.stdout.readline())
        end = cpu_ticks(cpus, parent.pid)
        assert own_pids(parent.pid) == {parent.pid}
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    own_s = (end.own - start.own) / os.sysconf("SC_CLK_TCK")
    # The parent itself only slept and waited; ticks are 10 ms each.
    assert children_cpu_s > 0.5
    assert own_s == pytest.approx(children_cpu_s, abs=0.1)


SIBLING_PROBE = """
import sys, time
from autotune.trial.contention import ContentionProbe
family = int(sys.argv[1]) or None
probe = ContentionProbe(0.2, family=family)
probe.start()
time.sleep(1.5)
print(probe.stop().disturbed)
"""


@pytest.mark.slow
def test_a_warm_processs_siblings_are_the_tuners_own_not_a_load() -> None:
    """The H200's warm confirmations flagged every round disturbed: the other warm processes
    (the tuner's too) counted as a load beside each turn. Timed with the tuner as its family,
    a sibling's busy loop is the confirmation's own; without it, the same sibling disturbs."""
    sibling = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        time.sleep(0.5)
        flags = [subprocess.run([sys.executable, "-c", SIBLING_PROBE, str(family)],
                                capture_output=True, text=True, timeout=60).stdout.strip()
                 for family in (0, os.getpid())]
    finally:
        sibling.kill()
        sibling.wait()
    assert flags == ["True", "False"]
