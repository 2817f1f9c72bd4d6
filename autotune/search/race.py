"""Paired rounds as a race: after each round a candidate measurably slower than the leader
is out; rounds go on until one is left, its speedup known and every change taken back decided,
or until no more rounds could resolve what is open, or a cap. Each round in warm turns
(`search.warm`) where memory holds them all, else in fresh processes."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.config import TrainConfig, changes, taken_back
from autotune.formatting import describe_changes, format_seconds
from autotune.search.contenders import (
    Candidate,
    Measuring,
    Plan,
    check_entry,
    leader_of,
    objective,
    paired,
    run_of,
)
from autotune.search.events import StudyView
from autotune.search.minimal import (
    JUDGE_ROUNDS,
    decided,
    rounds_to_judge,
)
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.search.warm import (
    TURN_SECONDS,
    WARM_MAX_ROUNDS,
    WARM_ROUNDS_PER_ROUND,
    WARM_WORTH_ROUNDS,
    PairJudge,
    WarmOutOfTime,
    WarmStart,
    WarmTurns,
    WarmUnavailable,
    memory_holds,
)
from autotune.stats import Ratio, rounds_for
from autotune.study.confirmation import (
    FRESH_ROUNDS,
    NO_MEMORY,
    NO_ROUNDS,
    NO_TIME,
    WARM_TURNS,
    Run,
)

# Warm rounds take seconds: the time left is told every this many.
WARM_REPORT_EVERY = 10


@dataclass
class Race:
    """What one race measured: its entries (the baseline last, the reference), how
    (`WARM_TURNS` or `FRESH_ROUNDS`), its disturbed rounds kept, its wall time, its slowest
    run's (a turn's, in warm turns), and why it ended where a cap ended it (`NO_TIME`, or
    `NO_ROUNDS`: what a change it measured too little is kept for); the configurations it left
    out as the memory held no warm process of them (`no_room`)."""

    entries: list[Candidate]
    measured: str
    disturbed_rounds: int
    wall_s: float
    run_s: float
    capped: str = NO_TIME
    ruled_out: list[Candidate] = field(default_factory=list)  # by a check, before it raced
    no_room: tuple[TrainConfig, ...] = ()

    def why_unmeasured(self, config: TrainConfig) -> str:
        """Why an entry of `config` has no runs: no room for its warm process, else the cap."""
        return NO_MEMORY if config in self.no_room else self.capped

    @property
    def reference(self) -> Candidate:
        return self.entries[-1]


def warm_expected(warm: WarmStart | None, scoring: Scoring, max_rounds: int,
                  peaks: Sequence[float | None]) -> bool:
    """Whether the confirmation will take warm turns (`_warm_rounds`), as far as it is known
    before it starts: a warm process may still fail to start."""
    return max_rounds > WARM_WORTH_ROUNDS and not scoring.train_steps and warm is not None \
        and memory_holds(peaks, warm.capacity)


def started_at_once(candidates: int, taken_back: int, timed: bool) -> int:
    """The warm processes a confirmation starts at once, which the memory must hold for it to
    take warm turns: under a time budget the best's and the baseline's (the rest start after
    them, as many as the memory holds: `_warm_rounds`); else every candidate's (the baseline
    among `candidates`) and the best less each change's."""
    return 2 if timed else candidates + taken_back


def _warm_rounds(entries: Sequence[Candidate], how: Measuring, plan: Plan, name: str,
                 ) -> tuple[WarmTurns | None, Plan, tuple[TrainConfig, ...], tuple[int, ...]]:
    """Warm processes for the candidates, where the plan has room for more rounds than they
    cost to start, the objective is a rate, and the memory holds those started at once (under
    a time budget the best's and the baseline's, then as many of the best less each change as
    it holds); with the plan's rounds counted in warm ones, the configurations the memory held
    no more, and the runners-up left to join once rounds are measured (`_breadth_admitted`)."""
    if plan.max_rounds <= WARM_WORTH_ROUNDS or how.pool is None:
        return None, plan, (), ()
    if how.scoring.train_steps:
        how.view.note("measuring in fresh-process rounds: --train-steps times whole runs from "
                      "their first step")
        return None, plan, (), ()
    configs, peaks = [e.config for e in entries], [e.search_peak_bytes for e in entries]
    backs = _proof(entries)
    # breadth: neither the proof nor what another entry is judged against (a short race's
    # recommendation, its partner)
    runners_up = [i for i in range(1, len(entries) - 1) if i not in backs
                  and not any(e.partner is entries[i] for e in entries)]
    later = [*backs, *runners_up] if plan.budget_ends is not None else []
    turns, why = how.pool.turns(configs, peaks, name, plan.budget_ends, skip=later)
    how.view.note(why)
    no_room: list[TrainConfig] = []
    # Under a time budget, the best and the baseline start first, then the best less each of
    # its changes (the proof of what it found), as many as the memory holds beside those warm
    # (the rest wait for the room a racer leaves: `_admitted`), only where their processes'
    # start fits the time left after the pairs of turns already racing take their least rounds
    # and theirs the rounds a change is judged on (`JUDGE_ROUNDS`: one that pays leaves the
    # race then), each turn priced as its search trial says (`turn_price_s`). The runners-up
    # (breadth, which shrinks first) wait for rounds measured at the machine's present pace.
    group = backs
    if turns is not None and group and later:
        what = "the best less each of its changes"
        fits = how.pool.room_for([peaks[i] for i in group])
        if fits < len(group):
            how.view.note(f"{what}: {len(group) - fits} of {len(group)} not raced: the memory "
                          f"holds {fits} more warm processes beside those warm")
            no_room += [configs[i] for i in group[fits:]]
            group = group[:fits]
        pairs = plan.rounds * WARM_ROUNDS_PER_ROUND * (len(turns.racing()) - 1) + \
            JUDGE_ROUNDS * len(group)
        left = plan.budget_ends - time.monotonic() - pairs * _priced_run_s(
            entries, [*turns.racing(), *group])
        if group and how.pool.start_s * len(group) <= left:
            later = [i for i in later if i not in group]
            turns, why = how.pool.turns(configs, peaks, name, plan.budget_ends, skip=later)
            how.view.note(f"{what}: {why}")
        elif group:
            how.view.note(f"{what} not raced: {len(group)} more processes at about "
                          f"{format_seconds(how.pool.start_s)} each would not fit the time left")
    if turns is None:
        return None, plan, (), ()
    breadth = tuple(i for i in runners_up if i in later)
    if breadth:
        how.view.note(f"the search's runners-up ({len(breadth)}) join the race after its first "
                      "round, where the time that round measured holds their rounds beside "
                      "the proof's")
    least = plan.rounds * WARM_ROUNDS_PER_ROUND
    timed = plan.ends_by is not None or plan.budget_ends is not None
    most = WARM_MAX_ROUNDS if timed else plan.max_rounds * WARM_ROUNDS_PER_ROUND
    return turns, replace(plan, rounds=least, max_rounds=max(least, most)), tuple(no_room), \
        breadth


def _priced_run_s(entries: Sequence[Candidate], indices: Sequence[int]) -> float:
    """A run of a race in warm turns as the search trials price it: a pair of turns, each the
    mean of the entries' turns (`turn_price_s`)."""
    return 2 * statistics.mean(entries[i].search_turn_s or TURN_SECONDS for i in indices)


def _admitted(entries: Sequence[Candidate], racing: list[int], no_room: tuple[TrainConfig, ...],
              turns: WarmTurns, plan: Plan, how: Measuring, name: str, run_s: float,
              ) -> tuple[WarmTurns, tuple[TrainConfig, ...]]:
    """The race's warm turns with the entries the memory held no process of (`no_room`, the
    proof first) started in the room the candidates out of the race left, as many as it holds
    and as the time left holds their start and the rounds a change is judged on (`run_s` a
    run); each joins at the next round. Returns the turns and the configurations still left
    out."""
    if how.pool is None:
        return turns, no_room
    racers = {id(entries[i]) for i in racing}
    waiting = [i for i, e in enumerate(entries) if e.config in no_room
               and (e.taken_from is None or id(e.taken_from) in racers)]
    fits = how.pool.room_for([entries[i].search_peak_bytes for i in waiting],
                             [entries[i].config for i in racing])
    group = waiting[:fits]
    ends = [e for e in (plan.budget_ends, plan.ends_by) if e is not None]
    needs_s = how.pool.start_s * len(group) + JUDGE_ROUNDS * run_s * (len(racing) + len(group))
    if not group or (ends and time.monotonic() + needs_s > min(ends)):
        return turns, no_room
    started = _join(entries, racing, group, how, plan, name, "the memory holds its warm "
                    "process now")
    joined = {entries[i].config for i in group}
    return started, tuple(c for c in no_room if c not in joined)


def _breadth_admitted(entries: Sequence[Candidate], racing: list[int], breadth: tuple[int, ...],
                      turns: WarmTurns, plan: Plan, how: Measuring, name: str, run_s: float,
                      reserve: int) -> tuple[WarmTurns, tuple[int, ...]]:
    """The race's warm turns with as many of the runners-up waiting (`breadth`) as the memory
    holds and as the time left holds their start, the least rounds of the race with them in
    it and the short races after it (`reserve`), at `run_s` a run (as measured, or as the
    search priced it where that is more): a load that slows the turns three times keeps them
    out, and the proof's rounds stay. Returns the turns and the runners-up still waiting
    (there are some only under a time budget, with a pool: `_warm_rounds`)."""
    fits = how.pool.room_for([entries[i].search_peak_bytes for i in breadth],
                             [entries[i].config for i in racing])
    ends = min(e for e in (plan.budget_ends, plan.ends_by) if e is not None)
    run_s = max(run_s, _priced_run_s(entries, [*racing, *breadth[:fits]]))
    slack_s = _follow_up_s(entries, reserve, plan, run_s, how, turns, plan.rounds)
    for count in range(fits, 0, -1):
        needs_s = how.pool.start_s * count + plan.rounds * run_s * (len(racing) + count)
        if time.monotonic() + needs_s + slack_s <= ends:
            group = list(breadth[:count])
            started = _join(entries, racing, group, how, plan, name,
                            f"its rounds fit the time left at {format_seconds(run_s)} a run")
            return started, breadth[count:]
    return turns, breadth


def _join(entries: Sequence[Candidate], racing: list[int], group: Sequence[int], how: Measuring,
          plan: Plan, name: str, why: str) -> WarmTurns:
    """The warm turns of the racing entries and `group`, whose processes start now; each of
    `group` joins the race at its next round, said with `why`."""
    skip = [i for i in range(len(entries)) if i not in racing and i not in group]
    started, started_why = how.pool.turns([e.config for e in entries],
                                          [e.search_peak_bytes for e in entries], name,
                                          plan.budget_ends, skip=skip)
    if started is None:
        raise WarmUnavailable(started_why)
    for i in group:
        entries[i].joined = len(entries[-1].runs)
        entries[i].script_answer = started.script_answer(i) or entries[i].script_answer
        racing.append(i)
        how.view.note(f"confirmation: {_named(entries, i)} joins the race: {why} "
                      f"({started_why})")
    return started


def _proof(entries: Sequence[Candidate]) -> list[int]:
    """The entries that judge the best's changes (the first entry's): each the best less one
    change, raced for that (a variant), or a candidate of the search that is that
    configuration too."""
    best, baseline = entries[0].config, entries[-1].config
    less_one = {taken_back(best, change, baseline) for change in changes(best, baseline)}
    return [i for i, e in enumerate(entries[1:-1], start=1)
            if e.variant or e.config in less_one]


def run_race(entries: list[Candidate], name: str, plan: Plan, how: Measuring, *,
             reserve: int = 0) -> Race:
    """The rounds of a race among `entries` (the baseline last), in warm turns while the
    pool's processes answer, else in fresh runs. Beyond its least rounds it leaves room for a
    short race of `reserve` configurations after it (`takeback.minimal_answer`'s)."""
    entries, ruled_out = _checked(entries, plan, how)
    reference, view = entries[-1], how.view
    fresh_plan = plan
    try:
        turns, plan, no_room, breadth = _warm_rounds(entries, how, plan, name)
    except WarmOutOfTime as exc:  # no round fits, warm or fresh
        view.note(f"confirmation: {exc}: no paired round fits in it")
        return Race(entries, WARM_TURNS, 0, 0.0, 0.0, NO_TIME,
                    [e for e in ruled_out if not e.variant])
    measured = WARM_TURNS if turns is not None else FRESH_ROUNDS
    racing = turns.racing() if turns is not None else list(range(len(entries)))
    for i in racing if turns is not None else ():
        entries[i].script_answer = turns.script_answer(i) or entries[i].script_answer
    shuffle = random.Random(0)
    restarted = turns.restarts() if turns is not None else 0
    start, rounds, kept_disturbed, run_s = time.monotonic(), 0, 0, 0.0
    kept_runs = 0  # the runs of the kept rounds: the race's time over them, retakes included
    joining_s = 0.0  # the starts of processes that joined the race: not a run's time
    capped = NO_ROUNDS  # unless time or the race's own end ends it first
    judge = PairJudge()
    while rounds < plan.max_rounds:
        next_ends = time.monotonic() + run_s * len(racing)
        # Beyond its least rounds the race keeps room for the short races after it; before
        # them, once changes can be judged and two or more are not shown to pay, room for the
        # answer less them at the rounds a change is judged on (a load that slows the rounds
        # must not spend that proof on least rounds it cannot finish).
        beyond = len(reference.runs) >= plan.rounds
        doubted = not beyond and len(reference.runs) >= JUDGE_ROUNDS and _in_doubt(entries) > 1
        slack = _follow_up_s(entries, reserve, plan, run_s, how, turns,
                             JUDGE_ROUNDS if doubted else plan.rounds) \
            if beyond or doubted else 0.0
        if (rounds and plan.budget_ends is not None and next_ends + slack > plan.budget_ends) \
                or (beyond and plan.ends_by is not None and next_ends + slack > plan.ends_by):
            capped = NO_TIME
            break
        began = time.monotonic()
        rounds += 1
        order = list(racing)
        shuffle.shuffle(order)
        runs: list[Run | None] | None = None
        partners: dict[int, Run | None] = {}
        if turns is not None:
            try:
                paired_turns = _paired_turns(entries, order, racing, turns, judge)
            except WarmUnavailable as exc:
                view.note(f"a warm process stopped ({exc}): the rest in fresh-process rounds")
                turns.close()
                turns, plan, measured = None, _fresh_after(fresh_plan, rounds - 1), FRESH_ROUNDS
            else:
                if paired_turns is None:  # a pair never kept (`PairJudge`): taken again
                    run_s = max(run_s, (time.monotonic() - began) / len(order))
                    continue
                runs, partners = paired_turns
        if runs is None:
            runs = [_run(entries[i], i, rounds, name, how, len(entries)) for i in order]
        run_s = max(run_s, (time.monotonic() - began) / len(order))
        if any(run is not None and run.disturbed for run in runs):
            # Measured again while the caps leave room (the minimum of clean rounds within the
            # rounds' cap, another round within the time's); a machine that stays busy gets its
            # rounds kept (paired, so still comparable). Warm turns that all saw the load are
            # kept and counted, not waited out, and not a note each (they come by the dozen).
            in_time = plan.ends_by is None or \
                time.monotonic() + run_s * len(order) <= plan.ends_by
            if turns is None and in_time and \
                    plan.max_rounds - rounds >= plan.rounds - len(reference.runs):
                view.note(f"confirmation round {rounds} was disturbed by another process: "
                          "measuring it again")
                continue
            kept_disturbed += 1
            if turns is None:
                view.note(f"confirmation round {rounds} was disturbed by another process: "
                          "kept, the machine stayed busy")
        for i, run in zip(order, runs):
            entries[i].runs.append(run)
        kept_runs += len(order)
        _record_partners(entries, order, racing, runs, partners)
        out = _eliminated(entries, racing, reference, plan.target)
        for i, why in out:
            racing.remove(i)
            view.note(f"confirmation: {_named(entries, i)} is out of the race after round "
                      f"{len(reference.runs)}: {why}")
        mean_s = (time.monotonic() - start - joining_s) / kept_runs
        joins_from = time.monotonic()
        try:
            if out and turns is not None and no_room:
                turns, no_room = _admitted(entries, racing, no_room, turns, plan, how, name,
                                           mean_s)
            if turns is not None and breadth:
                turns, breadth = _breadth_admitted(entries, racing, breadth, turns, plan, how,
                                                   name, mean_s, reserve)
        except WarmUnavailable as exc:
            view.note(f"a warm process did not start ({exc}): the rest in fresh-process "
                      "rounds")
            turns.close()
            turns, plan, measured = None, _fresh_after(fresh_plan, rounds), FRESH_ROUNDS
        joining_s += time.monotonic() - joins_from
        # The caps go by the slowest run (the race ends when it said); what would still fit
        # goes by the mean (one slow turn does not end a race that has time for dozens).
        ends = _after_round(entries, racing, plan, rounds, mean_s * len(racing),
                            _follow_up_s(entries, reserve, plan, mean_s, how, turns,
                                         plan.rounds))
        if ends is not None:
            if ends:
                view.note(f"confirmation: ended after round {len(reference.runs)}: {ends}")
                capped = NO_TIME
            break
        if turns is None or len(reference.runs) % WARM_REPORT_EVERY == 0:
            _tell_time_left(entries, racing, plan, rounds, run_s, view)
    if turns is not None:
        _say_restarts(turns.restarts() - restarted, view)
        _warm_traces(entries, racing, turns, how.directory / "traces", name, view)
    if breadth and turns is not None:
        view.note(f"the search's runners-up not raced: {len(breadth)} more processes and their "
                  "rounds never fitted the time left beside the proof's, at the rounds' pace "
                  "measured")
    left_out = any(not e.runs for e in entries)  # for the time left: judged by none
    return Race(entries, measured, kept_disturbed, time.monotonic() - start, run_s,
                NO_TIME if left_out else capped, [e for e in ruled_out if not e.variant],
                no_room if turns is not None else ())


def _fresh_after(plan: Plan, warm_rounds: int) -> Plan:
    """The race's plan in fresh rounds after `warm_rounds` rounds of warm turns: its cap on
    rounds counts the fresh ones from there (a warm process that stopped late must not end the
    race at the next round)."""
    return replace(plan, max_rounds=warm_rounds + plan.max_rounds)


def _after_round(entries: Sequence[Candidate], racing: Sequence[int], plan: Plan, rounds: int,
                 round_s: float, slack_s: float) -> str | None:
    """Whether the race ends after this round: "" where all is settled (its least rounds run,
    one candidate left besides the baseline, its speedup known within the target, every change
    taken back decided), why where nothing still open would be resolved within the rounds the
    caps leave (`_beyond_reach`, once the rounds give a spread to go by); None: it goes on."""
    reference = entries[-1]
    leader = leader_of(entries, reference)
    lead = paired(leader, reference, objective) \
        if leader is not None and leader is not reference else None
    known = lead is None or (lead.half_width or 1.0) <= plan.target
    rivals = {i: paired(entries[i], leader, objective) for i in racing
              if entries[i] not in (reference, leader) and not entries[i].variant} \
        if leader is not None else {}
    undecided = {i: ratio for i in racing if entries[i].variant
                 and not decided(ratio := paired(entries[i], entries[i].taken_from, objective))}
    done = len(reference.runs)
    if done >= plan.rounds and not rivals and known and not undecided:
        return ""
    if done >= max(plan.rounds, JUDGE_ROUNDS):
        return _beyond_reach(entries, undecided, rivals, None if known else lead, plan, rounds,
                             round_s, slack_s) or None
    return None


def _tell_time_left(entries: Sequence[Candidate], racing: Sequence[int], plan: Plan,
                    rounds: int, run_s: float, view: StudyView) -> None:
    """The most the race's rounds may still take, as the caps allow (the least rounds run
    whatever the cap)."""
    done = len(entries[-1].runs)
    left_s = (plan.max_rounds - rounds) * run_s * len(racing)
    if plan.ends_by is not None:
        left_s = min(left_s, max(0.0, plan.ends_by - time.monotonic()))
    left_s = max(left_s, (plan.rounds - done) * run_s * len(racing))
    if left_s > 0:
        racers = f"{len(racing)} configuration{'s' if len(racing) != 1 else ''}"
        view.time_left(f"confirmation round {done} done, {racers} racing: at most about "
                       f"{format_seconds(left_s)} more")


def _checked(entries: list[Candidate], plan: Plan, how: Measuring,
             ) -> tuple[list[Candidate], list[Candidate]]:
    """A race's entries that may race (each checked first, `contenders.check_entry`, but the
    best less one change: checked where it may become the answer, `takeback.minimal_answer`),
    and those the checks ruled out; a configuration less one change races only while the one
    with it does."""
    for entry in entries:
        if not entry.variant:
            check_entry(entry, how, plan)
    out = [e for e in entries if e.excluded]
    return [e for e in entries if not e.excluded and
            (not e.variant or not e.taken_from.excluded)], out


# A pair of warm turns whose two turns saw a load differently is taken again at once, this
# many times in all; then the whole round is.
PAIR_TRIES = 4


def _comparator(entries: Sequence[Candidate], i: int, racing: Sequence[int]) -> int:
    """What entry i is judged against: its `partner` where one is set, else the configuration
    it was taken back from, while that races; else the baseline (the last entry)."""
    source = entries[i].partner or entries[i].taken_from
    j = next((k for k in racing if entries[k] is source), None) if source is not None else None
    return j if j is not None else len(entries) - 1


def _paired_turns(entries: Sequence[Candidate], order: Sequence[int], racing: Sequence[int],
                  turns: WarmTurns, judge: PairJudge,
                  ) -> tuple[list[Run | None], dict[int, Run | None]] | None:
    """One round of warm turns as pairs: each entry's turn taken beside a turn of what it is
    judged against (`_comparator`), in a random order, and each pair kept or taken again on
    its own (`PairJudge`, up to `PAIR_TRIES` times), so that a load that comes and goes spoils
    a pair, not the round. Returns every entry's run in `order` (the baseline's from its first
    pair) and, by entry, its partner's turn; None where a pair was never kept."""
    reference = len(entries) - 1
    shuffle = random.Random(len(entries[reference].runs))
    mine: dict[int, Run | None] = {}
    partners: dict[int, Run | None] = {}
    for i in order:
        if i == reference:
            continue
        j = _comparator(entries, i, racing)
        for _ in range(PAIR_TRIES):
            first, second = (i, j) if shuffle.random() < 0.5 else (j, i)
            taken = {first: turns.turn(first)}
            taken[second] = turns.turn(second)
            if judge.keeps([taken[i], taken[j]]):
                break
        else:
            return None
        mine[i], partners[i] = taken[i], taken[j]
        if j == reference and reference not in mine:
            mine[reference] = taken[j]
    if reference not in mine:  # nothing was judged against it: a turn of its own
        mine[reference] = turns.turn(reference)
    return [mine[i] for i in order], partners


def _record_partners(entries: Sequence[Candidate], order: Sequence[int], racing: Sequence[int],
                     runs: Sequence[Run | None], partners: Mapping[int, Run | None]) -> None:
    """Each entry's partner run of this round: its warm pair's turn (`partners`), else (fresh
    rounds) its comparator's run of the same round."""
    this_round = dict(zip(order, runs))
    for i in order:
        if i == len(entries) - 1:
            continue
        j = _comparator(entries, i, racing)
        entry = entries[i]
        entry.partner = entry.partner or entries[j]
        beside = partners[i] if i in partners else this_round.get(j)
        entry.partner_runs.append(beside if entries[j] is entry.partner else None)


def _in_doubt(entries: Sequence[Candidate]) -> int:
    """How many of the best's changes its taking back has not (yet) shown to pay."""
    best = entries[0]
    return sum(1 for i in _proof(entries)
               if not ((ratio := paired(entries[i], best, objective)).high is not None
                       and ratio.high < 1.0))


def _follow_up_s(entries: Sequence[Candidate], reserve: int, plan: Plan, run_s: float,
                 how: Measuring, turns: WarmTurns | None, rounds: int) -> float:
    """The time the short races after this race take, at `rounds` and `run_s` a run:
    `reserve` configurations (the answer less several changes, `takeback`), and where the
    leader is not the configuration whose changes race beside it (the first entry), before it
    a race of the leader, the baseline and the leader less each of its changes; in warm turns
    their new processes started too."""
    if not reserve:
        return 0.0
    reference = entries[-1]
    leader = leader_of(entries, reference)
    configurations, new = reserve, 1
    if leader is not None and leader is not reference and leader is not entries[0]:
        taken = len(changes(leader.config, reference.config))
        configurations, new = configurations + 2 + taken, new + taken
    start = how.pool.start_s if turns is not None and how.pool is not None else 0.0
    return configurations * rounds * run_s + new * start


def _beyond_reach(entries: Sequence[Candidate], undecided: Mapping[int, Ratio],
                  rivals: Mapping[int, Ratio], lead: Ratio | None, plan: Plan, rounds: int,
                  round_s: float, slack_s: float) -> str:
    """Why the race's rounds end before its caps, or "": where nothing still open would be
    resolved within the rounds the caps leave, were the spreads so far to stay
    (`minimal.rounds_to_judge`, `stats.rounds_for`), more rounds would only spend the time.
    Open: a change not yet judged (`undecided`: its changes are then left out as not shown
    to pay), a configuration less an open change, which may become the answer, not yet known
    against the baseline; a candidate not yet known faster or slower than the leader
    (`rivals`: the simplest of those as fast is then recommended); the leader's speedup
    (`lead`) not yet known within the target, or as above 1."""
    ends = [e for e in (plan.ends_by, plan.budget_ends) if e is not None]
    fit = plan.max_rounds - rounds
    if ends and round_s > 0:
        fit = min(fit, int((min(ends) - time.monotonic() - slack_s) / round_s))
    needs = {}
    reference = entries[-1]
    for i, ratio in undecided.items():
        change = describe_changes(entries[i].taken_from.config, entries[i].config)
        # one that joined late is judged on its first rounds before any spread is read
        judged_by = rounds_to_judge(ratio) if ratio.rounds >= JUDGE_ROUNDS else JUDGE_ROUNDS
        needs[f"{change} judged"] = judged_by - ratio.rounds
        versus = paired(entries[i], reference, objective)  # a possible answer, once dropped
        if versus.low is not None and versus.includes_one:
            needs[f"the answer without {change} known against your settings"] = \
                rounds_for(versus, abs(math.log(versus.value))) - versus.rounds
    for i, ratio in rivals.items():
        if ratio.includes_one:  # one that joined late races its first rounds first
            more = rounds_for(ratio, abs(math.log(ratio.value))) \
                if ratio.rounds >= JUDGE_ROUNDS else JUDGE_ROUNDS
            needs[f"{describe_changes(entries[i].config, reference.config)} against the "
                  "leader"] = more - ratio.rounds
    if lead is not None:
        to_target = rounds_for(lead, math.log1p(plan.target))
        if lead.includes_one:
            to_target = min(to_target, rounds_for(lead, abs(math.log(lead.value))))
        needs["the speedup known"] = to_target - lead.rounds
    if not needs or any(more <= fit for more in needs.values()):
        return ""
    wanted = ", ".join(f"{what} in about {more:.0f}" if math.isfinite(more) else
                       f"{what} in none" for what, more in needs.items())
    return (f"no more rounds would resolve what is open ({wanted} more rounds, were the "
            f"spread to stay; {max(0, fit)} fit in the time left)")


def _named(entries: Sequence[Candidate], index: int) -> str:
    """A racing configuration in words, for the notes."""
    entry = entries[index]
    if entry.variant:
        return (f"candidate {index + 1} (the best without "
                f"{describe_changes(entry.taken_from.config, entry.config)})")
    return f"candidate {index + 1} ({describe_changes(entry.config, entries[-1].config)})"


def _say_restarts(again: int, view: StudyView) -> None:
    """Where a script's own run ended during turns of this race (its epochs or steps ran out),
    how often its warm process was started again: each start cost the race its time."""
    if again:
        view.note(f"a script's own run ended during {again} warm turn{'s' if again != 1 else ''}"
                  " of this race (its epochs or steps ran out): each time a new process of it "
                  "started, settled and took the turn again")


def _warm_traces(entries: Sequence[Candidate], racing: Sequence[int], turns: WarmTurns,
                 traces: Path, name: str, view: StudyView) -> None:
    """Each racing candidate's profiler trace, from its warm process after the last turn: a
    fresh round's first run leaves one for the report and `best-trace.json`; turns do not."""
    for i in racing:
        try:
            entries[i].trace = turns.trace(i, traces / f"{name}-{i}.json")
        except WarmUnavailable as exc:
            view.note(f"no profiler trace of candidate {i + 1}: {exc}")
            return


def _eliminated(entries: Sequence[Candidate], racing: Sequence[int], reference: Candidate,
                margin: float = 0.0) -> list[tuple[int, str]]:
    """The candidates still racing that cannot win any more, and why: one that failed a run,
    and one whose paired interval against the leader lies below 1. The baseline stays: it is
    the reference. A configuration less one change is out once it failed a run, once it is
    slower than the one with the change by more than `margin` for sure (the change pays: a
    tie looked at after every round would now and then look slower by a little), or once that
    one is out."""
    alive = [entries[i] for i in racing]
    leader = leader_of(alive, reference)
    out = []
    for i in racing:
        entry = entries[i]
        if entry is reference or entry is leader or entry.variant:
            continue
        if not entry.ok:
            out.append((i, "it did not run within memory in every round"))
            continue
        if leader is None:
            continue
        ratio = paired(entry, leader, objective)
        if ratio.high is not None and ratio.high < 1.0:
            out.append((i, f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] of the "
                           "leader's speed"))
    gone = {entries[i].config for i, _ in out} | \
        {e.config for j, e in enumerate(entries) if j not in racing}
    for i in racing:
        entry = entries[i]
        if not entry.variant:
            continue
        if not entry.ok:
            out.append((i, "it did not run within memory in every round: the change is kept"))
        elif entry.taken_from.config in gone:
            out.append((i, "the configuration it takes a change back from is out"))
        elif (ratio := paired(entry, entry.taken_from, objective)).high is not None and \
                ratio.high < 1.0 - margin:
            out.append((i, f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] of the "
                           "speed with the change: it pays"))
    return out


def _run(entry: Candidate, index: int, round_: int, name: str, how: Measuring,
         count: int) -> Run | None:
    """One fresh run of a candidate: its figures, or None when it did not run within memory."""
    how.view.note(f"confirming: round {round_}, candidate {index + 1}/{count}")
    # The first round profiles each candidate for the report; later ones need only the rate.
    trace = how.directory / "traces" / f"{name}-{index}.json" if round_ == 1 else None
    job = MeasureJob(f"{name}-{index}-{round_ - 1}", how.time_limit_s, how.device, trace=trace,
                     profile=trace is not None, round_run=True)
    result = how.measure(entry.config, job)
    if result.measurement is not None and result.measurement.script_answer is not None:
        entry.script_answer = result.measurement.script_answer
    return run_of(result, how.scoring)
