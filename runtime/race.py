"""How first use times its candidates: the race among compiled plans on the caller's own arguments.

``measure(plan, n, warm=0) -> [microseconds] * n`` (:func:`fmha_dsl.api_dispatch.timer`) times ``n`` launches of a
plan, each after flushing the L2 cache, behind ``warm`` untimed ones.  :func:`race` decides a first-use decision:

1. every candidate is timed once; those :data:`PRUNE` times slower than the fastest drop out;
2. the others in short bursts, round-robin -- three launches of each per round, so that clock and temperature drift
   spread over all of them -- for about :data:`TUNE_SECONDS` (2 to 8 rounds); none when the fastest takes
   :data:`LONG_US` or more (one launch of milliseconds reads within a few per cent, and the sustained runs below
   decide: bursts of two dozen such candidates would cost half a second of the first call);
3. the finalists (the fastest and those within :data:`FINALIST_SPREAD` of it, 2 to :data:`MAX_FINALISTS`) are timed
   again: when they take at least :data:`SUSTAIN_MIN_US`, *sustained* -- each after :data:`SETTLE_SECONDS` of
   back-to-back launches of itself, so the board is in the power state a long run of it puts it in (a burst on a
   rested GPU reads 64x64 tiles 7-14 % faster than a long benchmark does, TMA tiles 0-5 %:
   ``bench/probe_sustain.py``), and those within :data:`RETIME_SPREAD` of the fastest once more, in reverse order;
   shorter ones, launch-bound from Python, in as many bursts again.

The finalists' medians decide.  :func:`confirm` decides among a few finalists named in advance (a shipped decision's
winner and its close runners-up) the same way, with a longer settle for the first of them
(:data:`CONFIRM_SETTLE_SECONDS`): 40 ms leaves a power-hungry 64 x 64 tile reading a few per cent faster than a
long run of it does, 200 ms does not (``bench/probe_sustain.py``, session 22).  Once the board is under that load,
the others settle for :data:`CONFIRM_NEXT_SETTLE_SECONDS` each: on 8 classes of an H100 that decided as well as
200 ms each (regret against 0.5 s settles: mean 1.3-1.5 % against 1.3-2.6 %, two runs each) in 0.7 s instead of
1.5-1.7 s (``bench/probe_confirm.py``, session 35).  This module launches nothing itself and imports no compiler.
"""

from __future__ import annotations

from fmha_dsl.errors import FmhaError

TUNE_SECONDS = 0.3   # the timing budget of one decision's bursts (more rounds for short kernels)
PRUNE = 1.3          # candidates whose first timed launch is this much slower than the fastest's are not timed again
LONG_US = 1000.0     # candidates this long go from their first timing straight to the finalists' sustained runs
FINALIST_SPREAD = 1.15   # the bursts' fastest and those within 15 % of it (a sustained run moves them up to 14 %)
MAX_FINALISTS = 6        # ... at most this many of them, at least two, are timed again to decide
SUSTAIN_MIN_US = 100.0   # finalists this long are timed sustained (shorter ones are host-bound from Python)
SETTLE_SECONDS = 0.04    # back-to-back launches of a finalist ahead of its timed ones (the power state settles)
SUSTAIN_TIMED_SECONDS = 0.015  # then timed launches worth about this much (4 to 64 of them)
CONFIRM_SETTLE_SECONDS = 0.2  # confirm()'s settle for its first finalist: the board reaches a long run's state
CONFIRM_NEXT_SETTLE_SECONDS = 0.05  # ... and for each one after it (the board is already under that load)
RETIME_SPREAD = 1.03     # finalists this close to the sustained fastest are timed sustained once more, in reverse order


def race(measure, plans: dict) -> tuple | None:
    """``(key of the winner, {key: microseconds}, {finalist key: sustained microseconds})`` of ``plans`` (key ->
    plan) by ``measure``; the times are each candidate's burst median (its single first time when it dropped out or
    when the bursts were skipped: :data:`LONG_US`), the sustained ones empty when the finalists were timed in bursts.
    None when nothing could be timed."""
    first = _first_times(measure, plans)
    if not first:
        return None
    best = min(first.values())
    samples = {i: [] for i, t in first.items() if t <= PRUNE * best}
    rounds = int(min(8, max(2, TUNE_SECONDS * 1e6 / max(3 * sum(first[i] for i in samples), 1.0))))
    if best >= LONG_US:
        raced = {i: first[i] for i in samples}
    else:
        _rounds(measure, plans, list(samples), rounds, samples)
        raced = {i: _median(v) for i, v in samples.items() if v}
    if not raced:
        return None
    order = sorted(raced, key=lambda i: (raced[i], i))
    top = [i for i in order if raced[i] <= FINALIST_SPREAD * raced[order[0]]][:MAX_FINALISTS]
    top = top if len(top) > 1 else order[:2]
    times = {**first, **raced}
    sustained = {}
    if len(top) > 1 and raced[top[0]] >= SUSTAIN_MIN_US:
        sustained = _sustained(measure, plans, top, raced)
    elif len(top) > 1:
        _rounds(measure, plans, top, rounds, samples)
        times.update({i: _median(samples[i]) for i in top})
    decide = sustained or {i: times[i] for i in top}
    return min(decide, key=lambda i: (decide[i], i)), times, sustained


def confirm(measure, plans: dict) -> tuple | None:
    """:func:`race`'s answer for a few finalists named in advance (``plans``, at most a handful): each is timed once,
    then -- when the fastest takes :data:`SUSTAIN_MIN_US` or more -- sustained: the first after
    :data:`CONFIRM_SETTLE_SECONDS` of itself, each later one after :data:`CONFIRM_NEXT_SETTLE_SECONDS` of itself;
    else in bursts.  None when nothing could be timed."""
    first = _first_times(measure, plans)
    if not first:
        return None
    ids = sorted(first, key=lambda i: (first[i], i))
    if first[ids[0]] >= SUSTAIN_MIN_US:
        decide = sustained = _sustained(measure, plans, ids, first, CONFIRM_SETTLE_SECONDS, CONFIRM_NEXT_SETTLE_SECONDS)
    else:
        decide, sustained = fastest(measure, {i: plans[i] for i in ids})[1], {}
    if not decide:
        return None
    return min(decide, key=lambda i: (decide[i], i)), {**first, **decide}, sustained


def fastest(measure, plans: dict, rounds: int = 4) -> tuple:
    """``(key of the fastest of plans, {key: median microseconds})`` by ``measure`` (round-robin bursts only:
    :func:`_rounds`); ``(None, {})`` when none could be timed."""
    samples: dict = {k: [] for k in plans}
    _rounds(measure, plans, list(plans), rounds, samples)
    med = {k: _median(v) for k, v in samples.items() if v}
    return (min(med, key=lambda k: (med[k], str(k))) if med else None), med


def _first_times(measure, plans: dict) -> dict:
    """``{key: microseconds}``: each plan launched twice (the first loads its kernels), the second timed; a plan
    that cannot run is left out (it is then never chosen)."""
    first = {}
    for i, pl in plans.items():
        got = _time_n(measure, pl, 2)
        if got:
            first[i] = got[-1]
    return first


def _rounds(measure, plans: dict, ids, n: int, samples: dict) -> None:
    """``n`` rounds of three timed launches of each plan ``plans[i]`` (``i`` in ``ids``) into ``samples[i]``."""
    for _ in range(n):
        for i in ids:
            samples[i] += _time_n(measure, plans[i], 3)


def _sustained(measure, plans: dict, ids: list, est_us: dict, settle: float = SETTLE_SECONDS,
               next_settle: float | None = None) -> dict:
    """``{i: median microseconds}`` of plans ``plans[i]`` (``i`` in ``ids``, the bursts' order) each timed after
    ``settle`` seconds of back-to-back launches of itself (their count from ``est_us``, the burst estimate) -- or,
    with ``next_settle`` given, the first one after ``settle`` and every later one after ``next_settle``.  A
    second round, in reverse order (so that no plan always follows the same one), times again those within
    :data:`RETIME_SPREAD` of the first round's fastest, when there are two or more: the others cannot win."""
    samples: dict = {i: [] for i in ids}
    later = settle if next_settle is None else next_settle

    def timed(order, first_settle):
        for j, i in enumerate(order):
            t = max(est_us[i], 1.0)
            warm = int(min(4000, (first_settle if j == 0 else later) * 1e6 / t))
            n = int(min(64, max(4, SUSTAIN_TIMED_SECONDS * 1e6 / t)))
            samples[i] += _time_n(measure, plans[i], n, warm)

    timed(ids, settle)
    once = {i: _median(v) for i, v in samples.items() if v}
    if once:
        limit = RETIME_SPREAD * min(once.values())
        close = [i for i in ids if once.get(i, limit + 1) <= limit]
        if len(close) > 1:
            timed(close[::-1], later)
    return {i: _median(v) for i, v in samples.items() if v}


def _median(xs: list) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _time_n(measure, plan, n: int, warm: int = 0) -> list:
    """``measure(plan, n, warm=warm)``: ``n`` launch times in microseconds (after ``warm`` untimed launches), or []
    when that candidate cannot run (it is then never chosen).  ``warm`` is passed only when asked for, so a
    ``measure(plan, n)`` of a caller's own still serves the bursts."""
    try:
        ts = measure(plan, n, warm=warm) if warm else measure(plan, n)
    except (FmhaError, RuntimeError, OSError, ValueError):
        return []
    return [float(t) for t in ts if t == t and t > 0]


__all__ = ["race", "confirm", "fastest", "CONFIRM_SETTLE_SECONDS", "CONFIRM_NEXT_SETTLE_SECONDS", "TUNE_SECONDS",
           "PRUNE", "LONG_US", "FINALIST_SPREAD", "MAX_FINALISTS", "SUSTAIN_MIN_US", "SETTLE_SECONDS",
           "SUSTAIN_TIMED_SECONDS", "RETIME_SPREAD"]
