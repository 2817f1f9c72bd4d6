"""When the search stops finding: an expert runs their first moves (the bottleneck's fixes, the
fast corner and the trials that follow from them), then stops exploring once the trials stop
paying, and spends the time left proving what they found. Under a time budget the search ends
the same way (`stopped_finding`), and its time goes to the confirmation.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.study.records import COUNTS_AGAINST_BUDGET, Role, TrialRecord

# The sampler's measured trials in a row that beat the best before them by no more than a
# search trial's noise: past them, the search ends. Repeats and known failures ran nothing and
# are not trials; the expert's own trials (every role but the sampler's) are the first moves
# and their follow-ups, which always run.
STALE_TRIALS = 6
# A gain over the best so far within this share is inside a search trial's noise.
NOISE_GAIN = 0.05


def stopped_finding(records: Sequence[TrialRecord]) -> str | None:
    """Why the search ends now, in words, where the last `STALE_TRIALS` trials the sampler
    proposed (after every expert trial so far) found nothing beyond the noise of the best
    before them; else None."""
    best, stale = None, 0
    for record in sorted(records, key=lambda r: r.number):
        if not record.finished or record.duplicate or \
                record.status not in COUNTS_AGAINST_BUDGET:
            continue
        value = record.value
        found = value is not None and (best is None or value > best * (1 + NOISE_GAIN))
        stale = 0 if found or record.role != Role.SEARCH else stale + 1
        if value is not None:
            best = value if best is None else max(best, value)
    if stale < STALE_TRIALS:
        return None
    return (f"the search stopped finding: its last {stale} trials came within "
            f"{NOISE_GAIN:.0%} of the best before them, so the rest of the time goes to "
            "proving the answer")
