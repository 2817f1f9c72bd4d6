"""A study's answer in words, first: what to change and how much faster it is, with its interval
and the rounds behind it, or why the user's settings are kept; then what was checked of it
beyond its speed (its worst batch, its loss) and what the checks ruled out. `show`, the report,
`--json`, summary.md and best.json all print these sentences."""

from __future__ import annotations

from autotune.config import TrainConfig, numerics_changes
from autotune.formatting import describe_changes
from autotune.study.checks import answer_lines
from autotune.study.confirmation import (
    HURTS,
    LOSS_NO_TIME,
    NO_MEMORY,
    NO_ROUNDS,
    NO_TIME,
    NOISE,
    NOT_SHOWN,
    UNMEASURED_TOGETHER,
    CandidateSummary,
    Confirmation,
)


def confirmed_verdict(confirmation: Confirmation, baseline: TrainConfig) -> str:
    """The verdict of the paired rounds: the recommendation with its speedup over the user's
    settings, or the user's settings kept, with the closest contender's figure."""
    winner, contender = confirmation.winner, confirmation.contender
    in_rounds = confirmation.in_rounds
    if winner is None:
        return "not known: no configuration ran in every confirmation round"
    if winner.config != baseline:
        changes = describe_changes(winner.config, baseline)
        if confirmation.no_measurable_difference is False and confirmation.speedup_ci:
            return (f"{changes}: {confirmation.speedup:.2f}x faster than your settings "
                    f"{_interval(confirmation.speedup_ci)}, 95% interval, {in_rounds}"
                    f"{_taken_back(confirmation)}")
        return (f"{changes}: {confirmation.speedup:.2f}x your settings "
                f"{_interval(confirmation.speedup_ci)}, {in_rounds}{_taken_back(confirmation)}")
    if contender is not None and (unjudged := confirmation.unjudged):
        return (f"not known: {describe_changes(contender.config, baseline)} measured "
                f"{confirmation.speedup:.2f}x your settings {_interval(confirmation.speedup_ci)}"
                f" in {in_rounds}, but {_listed([t.change for t in unjudged])} "
                f"{'was' if len(unjudged) == 1 else 'were'} not measured to pay "
                f"({_UNJUDGED.get(unjudged[0].why, unjudged[0].why)}), and only what is "
                "measured to pay is recommended; your settings kept")
    if contender is not None and (unchecked := confirmation.unchecked):
        return (f"not known: {describe_changes(contender.config, baseline)} measured "
                f"{confirmation.speedup:.2f}x your settings {_interval(confirmation.speedup_ci)}"
                f" in {in_rounds}, but {_listed([t.change for t in unchecked])} changes the "
                f"numerics and {LOSS_NO_TIME}, and a change of the numerics is recommended only "
                "with its loss run; your settings kept")
    if contender is None:
        fastest = confirmation.fastest
        if fastest is not None and fastest.config != baseline:
            return f"not known: {_figure(fastest, baseline)} in {in_rounds}, too few for an " \
                "interval; your settings kept"
        if ruled := confirmation.ruled_out:
            return (f"kept your settings: {_count(len(ruled), 'configuration')} faster in the "
                    f"search {'was' if len(ruled) == 1 else 'were'} ruled out by the checks, "
                    f"and your settings measured fastest of the rest in {in_rounds}")
        return f"kept your settings: they measured fastest in {in_rounds}"
    named = describe_changes(contender.config, baseline)
    interval = confirmation.speedup_ci  # the contender's, widened where the search disagreed
    if interval is None:
        return (f"not known: {named} is {contender.speedup:.2f}x in {in_rounds}, too few for an "
                "interval; your settings kept")
    low, high = interval
    if low <= 1.0 <= high:
        return (f"not known: {named} is {contender.speedup:.2f}x {_interval(interval)}, inside "
                "the noise; your settings kept")
    if high < 1.0:
        return (f"kept your settings: the closest contender, {named}, is "
                f"{contender.speedup:.2f}x {_interval(interval)}")
    return (f"kept your settings: as fast as {named} ({contender.speedup:.2f}x "
            f"{_interval(interval)}) by the objective, with fewer changes")


def checks_verdict(confirmation: Confirmation, baseline: TrainConfig) -> str:
    """What the checks found of the answer (`study.checks`), in sentences: its worst batch's
    peak and the memory it leaves, its loss against the user's settings' (where it changes the
    numerics), or why each was not checked; then what they ruled out, and why."""
    winner, checks = confirmation.winner, confirmation.checks
    if winner is None or checks is None:
        return ""
    owner = "your settings'" if winner.config == baseline else "the answer's"
    said = answer_lines(winner.worst_batch, winner.loss_check, checks,
                        bool(numerics_changes(winner.config, baseline)), owner)
    reasons: dict[str, list[str]] = {}
    for candidate in confirmation.ruled_out:
        reasons.setdefault(candidate.excluded, []).append(
            describe_changes(candidate.config, baseline))
    if reasons:
        said.append("ruled out by the checks: " + "; ".join(
            f"{_listed(names)} ({why})" for why, names in reasons.items()))
    return " ".join(f"{text[0].upper()}{text[1:]}." for text in said)


def _listed(names: list[str], most: int = 3) -> str:
    """`a`, `a and b`, `a, b and c`; beyond `most`, `a, b, c and 4 more`."""
    if len(names) > most:
        return f"{', '.join(names[:most])} and {len(names) - most} more"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def search_verdict(best: TrainConfig | None, speedup: float | None,
                   baseline: TrainConfig | None, tried: bool = True) -> str:
    """The verdict of a study with no confirmation: the search's single trials; where no
    configuration besides the baseline was `tried` (the time or `--trials` ended first), not
    known."""
    if best is None:
        return "no answer: no configuration was measured within memory"
    if not tried:
        return ("not known: the run ended (its time or its --trials) before any configuration "
                "besides your settings was tried; run it again with more (--budget, --trials): "
                "the study resumes with its probe's findings")
    if baseline is None or best == baseline:
        return "kept your settings: no configuration measured faster in the search"
    figure = f" {speedup:.2f}x your settings" if speedup else ""
    return (f"not confirmed: {describe_changes(best, baseline)} measured{figure} in single "
            "search trials; confirm it (--confirm-repeats) before you change your training")


def _taken_back(confirmation: Confirmation) -> str:
    """What the answer left out of the race's recommendation, and why, in a clause each: the
    changes whose taking back was inside the noise or faster, those not shown to pay (with
    their measured effect)."""
    said = []
    for outcome, words in ((NOISE, "dropped as inside the noise"),
                           (HURTS, "dropped as faster without")):
        if names := [t.change for t in confirmation.dropped if t.outcome == outcome]:
            said.append(f"{words}: {', '.join(names)}")
    if shown := [f"{t.change} ({t.cost_text()} slower without it)"
                 for t in confirmation.dropped if t.outcome == NOT_SHOWN]:
        said.append(f"not shown to pay here, left out: {', '.join(shown)}")
    if unchecked := [f"{t.change} ({t.cost_text()} slower without it)"
                     for t in confirmation.unchecked]:
        said.append(f"left out as {LOSS_NO_TIME}: {', '.join(unchecked)}")
    return "".join(f"; {clause}" for clause in said)


# Why a change never ran without it, and what would measure it.
_UNJUDGED = {NO_TIME: "the run's time ended first: a longer --budget measures it",
             NO_ROUNDS: "--confirm-max-rounds ended the rounds first",
             NO_MEMORY: "the device's memory held no warm process of it beside the best's",
             UNMEASURED_TOGETHER: "each was measured alone, the answer less all of them in too "
             "few rounds: a longer --budget measures it"}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _figure(candidate: CandidateSummary, baseline: TrainConfig) -> str:
    return f"{describe_changes(candidate.config, baseline)} is {candidate.speedup:.2f}x"


def _interval(interval: tuple[float, float] | None) -> str:
    return f"[{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "(no interval)"
