"""`autotune run`: prepare the study, run the search within the budget, confirm, and return
the study's summary (the command line writes the files and tables from it).

The tuner owns what one run opened (the study, its storage, the runner's processes) and hands
the work to plain functions: the search loop (`worker`), recording outcomes (`outcome`),
confirmation (`confirm`), orphan recovery (`heartbeat`), the summary (`results`).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import loader_settings
from autotune.errors import ContractError, RunFailed
from autotune.formatting import format_seconds
from autotune.hardware import DeviceInfo, core_shares, describe, parse_device
from autotune.options import DEFAULT_TIME_BUDGET_S, TuneOptions
from autotune.search.budget import (
    FIRST_MOVES,
    BudgetGrowth,
    ConfirmationPrice,
    Forecast,
    TimePlan,
    candidates_that_fit,
    check_prices,
    compile_start_s,
    confirmation_price,
    forecast,
    grow_budget,
    plan_time,
    search_compile_s,
    search_trial_seconds,
    startup_note,
    trial_seconds,
)
from autotune.search.checks import (
    AnswerChecks,
    CheckPrices,
    loss_steps,
    numerics_changed,
    numerics_offered,
)
from autotune.search.confirm import ConfirmRequest, confirm, should_confirm
from autotune.search.contenders import Measuring, Plan, candidates
from autotune.search.events import SilentView, StudyView
from autotune.search.heartbeat import recover_orphans, tuner_name
from autotune.search.minimal import best_changes_priced, priced_changes
from autotune.search.opening import StudyOpener
from autotune.search.outcome import Scoring
from autotune.search.race import started_at_once, warm_expected
from autotune.search.runner import ProcessRunner, Runner
from autotune.search.warm import WarmStart, warm_start
from autotune.search.worker import Search, Window, measured_trials, run_workers
from autotune.study.checks import StoredLossRuns
from autotune.study.records import Role, StudyKey, TrialKey
from autotune.study.results import study_summary
from autotune.study.storage import JOURNAL_FILE, study_dir, validate_study_name
from autotune.study.summary import StudySummary
from autotune.trial.protocol import LoaderRate

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class Tuner:
    """One `autotune run`: prepares the study, runs trials within the budget, confirms.

    Nothing here imports or calls the model file: its facts and what works on this machine come
    from the capability probe (`probe`), run by the `runner` in a child process and cached in
    the study (`opening`).
    """

    def __init__(self, options: TuneOptions, view: StudyView | None = None,
                 runner: Runner | None = None) -> None:
        self.options, self.view = options, view or SilentView()
        opts = options
        self.devices, groups = _devices(opts)
        self.device = self.devices[0]
        info = describe(self.device)
        # Parallel trials share the cores on any device: each runs on its own share (threads,
        # DataLoader workers and compile workers alike); one trial alone has them all.
        self.core_shares = core_shares(len(self.devices)) if len(self.devices) > 1 else None
        self.started = time.monotonic()
        # The whole run's time budget: --budget, else the default when neither --trials nor
        # --timeout was given (the default grows for a model whose trials are slow:
        # `_plan_an_answer`).
        self.time_budget_s = opts.budget_s or (
            None if opts.trials or opts.timeout_s else DEFAULT_TIME_BUDGET_S)
        self.owner = tuner_name()
        self.stop = threading.Event()  # set by a worker that failed: the others end too
        target = opts.target
        path = Path(target.path)
        if not path.is_file():
            raise ContractError(f"{target.noun} not found: {path}")
        name = validate_study_name(opts.study or path.stem)
        self.directory = study_dir(opts.studies_dir, name)
        self._new_folder = opts.storage is None and not self.directory.exists()
        self._new_parent = self._new_folder and not self.directory.parent.exists()
        self.runner = runner or ProcessRunner(
            target, self.directory, opts.settings,
            memory_limit_bytes=opts.memory_limit_bytes, core_shares=self.core_shares,
            on_phase=lambda text, number: self.view.phase(text, number), stop=self.stop,
            nproc_per_node=opts.nproc_per_node, groups=groups,
            startup_limit_s=opts.startup_limit_s, on_note=lambda text: self.view.note(text))
        try:
            self._open(name, info)
        except BaseException as exc:
            self.close()
            # The folder goes only while no study is in it: another tuner started beside this
            # one may have created the study there meanwhile.
            journal = self.directory / JOURNAL_FILE
            if not (journal.exists() and journal.stat().st_size):
                self._discard_folder(keep_logs=isinstance(exc, RunFailed))
            raise

    def _open(self, name: str, info: DeviceInfo) -> None:
        """The study, probed and checked (`opening`), then how its trials are scored."""
        opts = self.options
        opener = StudyOpener(opts, self.device, self.runner, self.view, self.directory)
        opener.open(name, info)
        self.study, self.storage, self.probe = opener.study, opener.storage, opener.probe
        self.baseline, self.space = opener.baseline, opener.space
        self.capacity_bytes, self._new_study = opener.capacity_bytes, opener.new_study
        self.scoring = Scoring(self.device.type, opener.memory_limit(), opts.memory_headroom,
                               opts.stall_penalty, opts.train_steps, self.baseline)
        recover_orphans(self.study, self.storage, self.owner, self.view.note)
        if preloading := self.runner.preload(self.probe):
            self.view.note(preloading)

    def close(self) -> None:
        """End the runner's processes (the fork server)."""
        self.runner.close()

    def memory_limit(self) -> int | None:
        """The capacity less the headroom: a trial whose peak is above it is infeasible."""
        return self.scoring.memory_limit_bytes

    def measured_trials(self) -> int:
        return measured_trials(self.study)

    def discard_if_new(self) -> None:
        """Remove a study this run created and that holds only a rejected first trial, so that
        bad input leaves nothing behind."""
        if not self._new_study or any(t.state == TrialState.COMPLETE for t in self.study.trials):
            return
        optuna.delete_study(study_name=self.study.study_name, storage=self.storage)
        self._discard_folder()

    def _discard_folder(self, keep_logs: bool = False) -> None:
        """The study's folder, where this run made it, and the studies folder, where this run
        made it and nothing else is in it: bad input leaves nothing behind. `keep_logs`: a
        failure's message names a log, which stays (its folder's other files go)."""
        if not self._new_folder:
            return
        logs = self.directory / "logs"
        if keep_logs and logs.is_dir():
            for entry in self.directory.iterdir():
                if entry != logs:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
            return
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._new_parent:
            with contextlib.suppress(OSError):
                self.directory.parent.rmdir()

    def run(self) -> StudySummary:
        """Trials until the budget is spent, then confirmation; returns the summary. The
        baseline runs first and prices a trial: the rest is planned from it."""
        opts, study = self.options, self.study
        deadline = time.monotonic() + opts.timeout_s if opts.timeout_s else math.inf
        started = time.monotonic()
        self._queue_baseline()
        search = self._search()
        run_workers(search, self.devices, 1, min(deadline, self._budget_ends()))
        trial_s = trial_seconds(study)
        if startup := startup_note(study):
            self.view.note(startup)
        top = opts.confirm_top
        study.set_user_attr(StudyKey.SHORT_BUDGET, None)
        planned = trial_s is not None and self.time_budget_s is not None
        if planned:
            # the budget grows for what the space may need checked; the search's end is
            # planned for what has been measured
            price = self._price(trial_s, numerics_offered(self.space.domains),
                                priced_changes(self.space))
            growth = self._plan_an_answer(price) if opts.confirm_repeats >= 1 else None
            if growth is not None:
                top = candidates_that_fit(self.time_budget_s, price, opts.confirm_share,
                                          opts.confirm_top)
            first_plan, racing = measured_trials(study), self._racing(top)
            at_baseline = self._price(trial_s, 0, 0)
            plan = self._plan(self._proof(at_baseline, top), trial_s, racing, FIRST_MOVES)
            search.window = Window(plan.search_ends_at, plan.finish_by,
                                   self._compile_start_s())
            self.view.note(announcement(self._budget_ends(), plan.describe(
                self.time_budget_s, racing), growth.describe(price) if growth else ""))
        deadline = min(deadline, self._budget_ends())  # the budget as grown

        def after_trial() -> None:
            """The plan made anew (the proof priced for the best measured so far), and the time
            left said, the proof priced as the plan prices it."""
            proof = self._proof(at_baseline, top) if planned else None
            if proof is not None:
                moved = self._plan(proof, trial_s, racing,
                                   max(0, FIRST_MOVES - measured_trials(study) + first_plan))
                search.window = Window(moved.search_ends_at, moved.finish_by,
                                       self._compile_start_s())
            search_s = search_trial_seconds(study, screening=not opts.plain_tpe)
            if search_s:
                price = proof if proof is not None else self._price(
                    search_s, self._numerics_measured(top), self._taken_back())
                self.view.time_left(self._forecast(
                    search_s, price, min(deadline, search.window.last_start), top).describe())

        search.after_trial = after_trial
        if not planned:  # else the announcement has just said it
            after_trial()
        run_workers(search, self.devices, opts.trials, deadline)
        study.set_user_attr(StudyKey.TUNING_WALL_S, study.user_attrs.get(
            StudyKey.TUNING_WALL_S, 0.0) + time.monotonic() - started)
        if opts.confirm_repeats >= 1 and should_confirm(study, self.owner, self.view):
            self._confirm(top)
        return study_summary(study)

    def _queue_baseline(self) -> None:
        """The file's BASELINE first, unless the study has it (done, waiting or running)."""
        if not any(t.user_attrs.get(TrialKey.ROLE) == Role.BASELINE for t in
                   self.study.get_trials(deepcopy=False, states=(
                       TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING))):
            self.study.enqueue_trial(self.space.params_for(self.baseline) or {},
                                     user_attrs={TrialKey.ROLE: Role.BASELINE},
                                     skip_if_exists=True)

    def _search(self) -> Search:
        opts = self.options
        self.study.set_user_attr(StudyKey.OBJECTIVE, {"train_steps": opts.train_steps,
                                                      "plain_tpe": opts.plain_tpe})
        return Search(
            study=self.study, storage=self.storage, space=self.space, baseline=self.baseline,
            scoring=self.scoring, measure=self.runner.measure, view=self.view,
            owner=self.owner, trial_time_limit_s=opts.trial_time_limit_s,
            heartbeat_s=opts.heartbeat_s, shortcuts=not opts.plain_tpe,
            fast_corner=opts.fast_corner_first, loader_rates=self._planned_loader_rates(),
            state_bytes=lambda: self.probe.state_bytes, stop=self.stop,
            baseline_name=opts.target.baseline_name,
            ends_when_stale=self.time_budget_s is not None and not opts.plain_tpe)

    def _plan(self, proof: ConfirmationPrice, trial_s: float, racing: int,
              first_moves: int) -> TimePlan:
        """The search's end and the proof after it, from now (`budget.plan_time`): a trial at
        `trial_s` and the proof of `racing` configurations priced at `proof`: as the baseline
        priced it, with a loss run for each numerics change of the candidates measured so far.
        Not the search's first compile: its price is no guide to a confirmation's, which finds
        the study's compile cache warm (per_feature_towers at a1b939e: a 60 s first compile
        priced into every process cut the search to three trials; its warm processes started
        in 13 s)."""
        opts = self.options
        return plan_time(self.time_budget_s, self.started, time.monotonic(), trial_s, proof,
                         racing, opts.confirm_share if opts.confirm_repeats else 0.0,
                         opts.confirm_max_rounds, first_moves)

    def _racing(self, top: int) -> int:
        """The configurations a confirmation would race now, the baseline among them."""
        return min(top, max(1, measured_trials(self.study))) + 1

    def _numerics_measured(self, top: int) -> int:
        """The numerics changes of the `top` candidates measured so far: their loss runs."""
        return numerics_changed((c.config for c in candidates(self.study, self.baseline, top)),
                                self.baseline)

    def _proof(self, at_baseline: ConfirmationPrice, top: int) -> ConfirmationPrice:
        """The proof as the plan prices it now: at the baseline's trial, for the candidates
        measured so far (the best's changes taken back, a loss run for each numerics change
        among the `top`): no loss run before a candidate that needs it exists."""
        return replace(at_baseline, taken_back=self._taken_back(),
                       loss_changes=self._numerics_measured(top))

    def _taken_back(self) -> int:
        """The changes of the best measured so far the proof takes back beside it (the
        space's before a configuration besides the baseline is measured: the announced end
        holds once one is)."""
        best = candidates(self.study, self.baseline, 1)[:-1]
        return best_changes_priced(best[0].config, self.baseline, self.space) if best \
            else priced_changes(self.space)

    def _price(self, fallback_s: float, loss_changes: int, taken_back: int,
               ) -> ConfirmationPrice:
        """What confirming costs: in warm turns where the confirmation will take them (memory
        for the processes it starts at once at the baseline's peak each), with `taken_back`
        changes of the best taken back beside it, and the loss runs of `loss_changes` numerics
        changes."""
        opts, warm = self.options, self._warm_start()
        at_once = started_at_once(opts.confirm_top + 1, taken_back, self.time_budget_s is not None)

        def holds(peak: float | None) -> bool:
            return warm_expected(warm, self.scoring, opts.confirm_max_rounds, [peak] * at_once)

        return confirmation_price(self.study, opts.settings, fallback_s, holds, taken_back,
                                  self._check_prices(), loss_changes)

    def _check_prices(self) -> CheckPrices | None:
        """What one run of each check of the answer costs here (None before the baseline)."""
        return check_prices(self.study, self.probe.sizes, not self.options.no_loss_check,
                            self.probe.script_run_steps)

    def _checks(self) -> AnswerChecks:
        """The checks of what the confirmation may recommend: its worst batch, its loss."""
        opts = self.options
        prices = self._check_prices() or CheckPrices(0.0, 0.0, loss_steps(None))
        return AnswerChecks(self.runner.measure, self.baseline, self.scoring,
                            sizes=self.probe.sizes, capacity_bytes=self.capacity_bytes,
                            loss_check=not opts.no_loss_check, prices=prices,
                            time_limit_s=opts.trial_time_limit_s, device=str(self.device),
                            view=self.view, loss_with_split=opts.target.loss_with_split,
                            stored=StoredLossRuns(self.study))

    def _warm_start(self) -> WarmStart | None:
        return warm_start(self.runner, str(self.device), self.options.trial_time_limit_s) \
            if isinstance(self.runner, ProcessRunner) else None

    def _plan_an_answer(self, price: ConfirmationPrice) -> BudgetGrowth:
        """Under the default time budget: grow it (at most `MAX_GROWTH` times) where runs are
        so slow that the confirmation's share could not hold an answer with an interval (a
        given `--budget` stays); where it is short, the study remembers what an answer needs,
        for its verdict."""
        opts = self.options
        growth = grow_budget(self.time_budget_s, price, opts.confirm_share,
                             may_grow=opts.budget_s is None)
        self.time_budget_s = growth.budget_s
        if growth.short:
            self.study.set_user_attr(StudyKey.SHORT_BUDGET, {
                "budget_s": growth.budget_s, "needed_s": growth.needed_s,
                "fixed": growth.fixed, "flag": growth.answering_flag})
        return growth

    def _budget_ends(self) -> float:
        return self.started + self.time_budget_s if self.time_budget_s else math.inf

    def _confirm(self, top: int) -> None:
        """The paired rounds: beyond the least, under a time budget until its end (the proof
        takes what the search left, and its rounds end once all is judged, `race.run_race`),
        else within the confirmation's share of the study's wall time (the search so far
        prices it)."""
        opts, study, budget_ends = self.options, self.study, self._budget_ends()
        share = opts.confirm_share
        ends_by = time.monotonic() + self._searched_s() * share / (1 - share)
        if math.isfinite(budget_ends):
            ends_by = max(ends_by, budget_ends)
        plan = Plan(top=top, rounds=opts.confirm_repeats, max_rounds=opts.confirm_max_rounds,
                    target=opts.confirm_target, ends_by=ends_by,
                    budget_ends=budget_ends if math.isfinite(budget_ends) else None)
        measuring = Measuring(self.scoring, self.runner.measure, self.view,
                              opts.trial_time_limit_s, str(self.device), self.directory,
                              checks=self._checks())
        confirmation = confirm(study, plan, ConfirmRequest(
            self.baseline, measuring, warm=self._warm_start(), space=self.space))
        if confirmation and confirmation.winner and confirmation.winner.trace and \
                Path(confirmation.winner.trace).is_file():
            shutil.copyfile(confirmation.winner.trace, self.directory / "best-trace.json")

    def _forecast(self, trial_s: float, price: ConfirmationPrice, deadline: float,
                  top: int) -> Forecast:
        """What is left of this run, as planned now."""
        opts, study = self.options, self.study
        measured, now = measured_trials(study), time.monotonic()
        return forecast(
            now=now, deadline=deadline,
            trials_left=max(0, opts.trials - measured) if opts.trials else None,
            trial_s=trial_s, price=price, workers=len(self.devices),
            candidates=self._racing(top),
            rounds=opts.confirm_repeats, max_rounds=opts.confirm_max_rounds,
            share=opts.confirm_share, ends_by=self._budget_ends(), searched_s=self._searched_s(),
            compile_s=self._compile_s())

    def _compile_s(self) -> float:
        """What the search's first compiled trial, still to come, adds to a trial's time."""
        return search_compile_s(self.study, self._offers_compile())

    def _compile_start_s(self) -> float:
        """What a trial that compiles adds to one that does not, compiled before or not."""
        return compile_start_s(self.study, self._offers_compile())

    def _offers_compile(self) -> bool:
        """Whether the search may start a compile (the expert's compiled best among them)."""
        return "default" in self.space.domains.get("compile_mode", ())

    def _searched_s(self) -> float:
        """The study's wall time so far: this run's, or all its runs' trials where more."""
        return max(time.monotonic() - self.started,
                   self.study.user_attrs.get(StudyKey.TUNING_WALL_S, 0.0))

    def _planned_loader_rates(self) -> list[LoaderRate]:
        """The probe's DataLoader rates for the settings of this space, when the plan is on."""
        settings = set(loader_settings(self.space.domains))
        if self.options.plain_tpe or len(settings) < 2:
            return []
        rates = [r for r in self.probe.loader_rates
                 if (r.num_workers, r.prefetch_factor) in settings]
        self.study.set_user_attr(StudyKey.LOADER_RATES, [r.to_dict() for r in rates])
        return rates



def announcement(ends_at: float, plan: str, growth: str) -> str:
    """The one line, after the baseline, of when the run ends (a `time.monotonic()` time, as
    the wall clock shows it) and what it does by then."""
    left = max(0.0, ends_at - time.monotonic())
    clock = time.strftime("%H:%M", time.localtime(time.time() + left))
    return (f"this run ends by {clock} (in {format_seconds(left)}): {plan}"
            + (f"; {growth}" if growth else ""))


def _devices(opts: TuneOptions) -> tuple[list[Any], dict[str, list[str]]]:
    """The devices trials run on, one worker each: --devices, or --workers copies of --device
    (`TuneOptions` has checked them). Under --nproc-per-node N, --devices is cut into groups
    of N side by side, each worker named by its group's first GPU; with the GPUs of each."""
    if not opts.devices:
        return [parse_device(opts.device)] * opts.workers, {}
    devices = [parse_device(name) for name in opts.devices]
    n = opts.nproc_per_node
    if n == 1:
        return devices, {}
    groups = [devices[i:i + n] for i in range(0, len(devices), n)]
    return [g[0] for g in groups], {str(g[0]): [str(d) for d in g] for g in groups}
