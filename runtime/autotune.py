"""Selection by measurement on first use: the dispatcher's half of it.

On the first call of a decision key (:func:`fmha_dsl.runtime.decisions.key`) a compiling dispatcher compiles the
rule-checked candidates the cost model ranks highest, times each on the caller's own arguments
(:func:`fmha_dsl.runtime.race.race`), keeps the fastest and records it in the device's table
(:class:`fmha_dsl.runtime.decisions.TunedTable`).  A decision recorded on this device is used as it is; a shipped
one whose runners-up came close is timed again here first (:meth:`MeasuredSelection._confirmed`).
``FMHA_DSL_AUTOTUNE=0`` turns measuring off (the cost model's first choice is compiled instead).

:class:`MeasuredSelection` is inherited by the dispatcher: the builder it was handed compiles, the caller's
``measure`` launches and times; this module imports no compiler and launches nothing itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fmha_dsl import costmodel, knobs
from fmha_dsl.errors import FmhaError, error

from .decisions import close_runners_up, key, record_of
from .device import over_limits
from .match import describe, mismatches, no_kernel_error
from .race import confirm, race

if TYPE_CHECKING:
    from fmha_dsl.registry import Entry


def enabled() -> bool:
    return knobs.autotune()


# ---------------------------------------------------------------------------------------------------------------
# selection by measurement (the Dispatcher's first-use half)
# ---------------------------------------------------------------------------------------------------------------
class MeasuredSelection:
    """First-use selection for :class:`fmha_dsl.runtime.dispatch.Dispatcher` (which inherits it).  It uses the
    dispatcher's ``arch``, ``entries``, ``too_big``, ``builder``, ``tuned``, ``compute_units``, ``limits``,
    ``registry``, ``_lock``, ``_decided``, ``measured``, ``add_many()`` and ``plan_for()``."""

    def _first_use(self, p, aligned: bool, measure) -> Entry:
        tk = key(p, aligned)
        e = self._decided.get(tk)  # decided keys never wait for another key's compile
        if e is not None:
            return e
        with self._lock:
            e = self._decided.get(tk)
            if e is not None:
                return e
            no_build = knobs.no_build()
            confirming = not no_build and measure is not None and enabled() and knobs.tuned_confirm()
            close = self._runner_up_entries(tk, p, aligned) if confirming else []
            got = self._recorded(tk, p, aligned, cache_only=no_build, also=close)
            alone = key(p.model_copy(update={"window_left": -1}), aligned) if no_build and got is None else tk
            if alone != tk:  # nothing compiles here: a window's class without a decision of its own runs the kernel
                # decided for its mask alone (which serves every window: the window is a run-time argument)
                got = self._recorded(alone, p, aligned, cache_only=True)
            if got is not None:
                if close:
                    got = self._confirmed(p, aligned, got, close, measure)
                self._decided[tk] = got
                return got
            if no_build:
                raise no_kernel_error(p, self.arch, self.entries, self.registry.name, self.registry.archs, aligned,
                                      self.too_big, self.limits)
            cands = self.builder.candidates(p, self.arch, aligned)
            if not cands:
                raise error("runtime.jit", f"the Triton rules allow no kernel for {describe(p)} on {self.arch}",
                            None, "the head dims, dtype or features exceed what the Triton template supports here")
            timed = measure is not None and enabled()
            if timed:  # all of them; when none compiled, the ones after them, as below
                built, tried = self._usable(cands, p, aligned), {e.identifier for e in cands}
                short = sum(e.identifier in tried for e in self.too_big)  # built, but beyond this GPU
                rest = [] if built and not short else [e for e in self.builder.candidates(
                    p, self.arch, aligned, ALL_CANDIDATES) if e.identifier not in tried]
                while built and short > 0 and rest:  # the next candidates take their places: as many are timed
                    n = max(short, _UNTIMED)
                    got = self._usable(rest[:n], p, aligned)[:short]
                    built, rest, short = built + got, rest[n:], short - len(got)
                if built:
                    rest = []
            else:
                built, rest = [], cands
            for i in range(0, len(rest), _UNTIMED):  # a few at a time, until one compiles without spilling
                built += self._usable(rest[i:i + _UNTIMED], p, aligned)
                if built and (len(_without_spills(built)) < len(built) or not any(_spills(x) for x in built)):
                    break
            if not built:
                if any(not mismatches(e, p, aligned) for e in self.too_big):  # they built, this GPU cannot run them
                    raise no_kernel_error(p, self.arch, [], self.registry.name, self.registry.archs, aligned,
                                          self.too_big, self.limits)
                raise error("runtime.jit", f"no candidate kernel for {describe(p)} on {self.arch} compiled", None,
                            "report this with the problem's shapes; meanwhile pass a registry built elsewhere")
            if timed and len(built) > 1:  # measured: a kernel whose resource report shows a stack frame (counted
                # as spills) may still be the fastest (sm90's (128, 64, 4) d128 tiles are), the timing decides
                e = self._measured(p, aligned, built, measure)
            else:  # the cost model: never a candidate that spills while one that does not exists
                e = self._cheapest(p, built)
            self._decided[tk] = e
            return e

    def compile_ahead(self, p, aligned: bool) -> bool:
        """Have the builder compile, in the background after its next batch (or at :meth:`start_ahead`), what first
        use of ``p`` would compile: its candidates, or a recorded decision's winner and the runners-up it is
        confirmed against.  A training step names its backward this way before its forward compiles, so the workers
        the forward leaves idle start on the backward.  True when something was queued; False when ``p``'s key is
        decided, measuring is off, this dispatcher compiles nothing (a prebuilt registry), everything is built, or
        ``FMHA_DSL_COMPILE_AHEAD=0``."""
        builder = self.builder
        if (builder is None or not hasattr(builder, "compile_ahead") or not enabled() or knobs.no_build()
                or not knobs.compile_ahead()):
            return False
        tk = key(p, aligned)
        if tk in self._decided:
            return False
        try:
            rec = self._current(tk, p)
            if rec is None:
                entries = builder.candidates(p, self.arch, aligned)
            else:
                want = recorded_entry(builder, rec, self.arch)
                close = self._runner_up_entries(tk, p, aligned) if knobs.tuned_confirm() else []
                entries = ([want] if want is not None else []) + close
        except FmhaError:  # first use reports it when the backward comes
            return False
        have = {e.identifier for e in self.entries + self.too_big}
        entries = [e for e in entries if e.identifier not in have]
        if entries:
            builder.compile_ahead(entries, aligned)
        return bool(entries)

    def start_ahead(self) -> None:
        """Start what :meth:`compile_ahead` queued and no compile has taken (the forward was decided already)."""
        if self.builder is not None and hasattr(self.builder, "start_ahead"):
            self.builder.start_ahead()

    def _current(self, tk: str, p) -> dict | None:
        """The recorded decision for ``tk`` when it was measured under this builder's candidate space for ``p``'s
        family; None when there is none or it is stale (another template or candidate space: measured again)."""
        return current_record(self.tuned.get(tk) if self.tuned is not None else None, self.builder, p.family)

    def decided_kernel(self, p, aligned: bool) -> str | None:
        """The name of the kernel first use would run for ``p`` without measuring anything: decided in this process
        or recorded under the current candidate space; None when it would be chosen afresh."""
        tk = key(p, aligned)
        e = self._decided.get(tk)
        if e is not None:
            return e.name
        rec = self._current(tk, p)
        name = rec.get("kernel") if rec is not None else None
        return None if any(e.name == name for e in self.too_big) else name  # this GPU cannot run it: chosen afresh

    def _recorded(self, tk: str, p, aligned: bool, cache_only: bool, also: list = ()) -> Entry | None:
        """The recorded decision for ``tk`` (measured under this builder's candidate space), compiled or loaded from
        the artifact cache (only loaded with ``cache_only``) -- in one batch with the entries ``also`` (a shipped
        decision's close runners-up); None when there is none or it cannot serve ``p``."""
        want = recorded_entry(self.builder, self._current(tk, p), self.arch)
        if want is None:
            return None
        try:
            got = self._compile([want] + [e for e in also if e.identifier != want.identifier], aligned, cache_only)
        except (KeyError, TypeError, ValueError, AttributeError):  # a damaged record: as if there were none
            return None
        got = [e for e in got if e.identifier == want.identifier]
        return got[0] if got and not mismatches(got[0], p, aligned) else None

    def _runner_up_entries(self, tk: str, p, aligned: bool) -> list:
        """The candidate entries (not compiled) of a *shipped* decision's runners-up that came within 6 % of its winner
        (:func:`fmha_dsl.runtime.decisions.close_runners_up`, at most 4); none for a decision recorded on this device,
        one with a clear winner, or none at all."""
        rec = self._current(tk, p)
        names = close_runners_up(rec) if rec is not None and self.tuned.is_shipped(tk) else []
        return named_candidates(self.builder, p, self.arch, aligned, names)

    def _confirmed(self, p, aligned: bool, win: Entry, close: list, measure) -> Entry:
        """A shipped decision ``win`` (measured on another device of this model) decided again here against its close
        runners-up ``close`` (compiled with it): they are timed on the caller's arguments
        (:func:`fmha_dsl.runtime.race.confirm`: each sustained, the first after 0.2 s of itself, the others after
        50 ms), and the result goes into this device's own table (later processes read it).  Two H200s were seen to
        order two such kernels by about 5 % each way.  When no runner-up could be built, ``win`` as it is."""
        built = [e for e in self._usable(close, p, aligned) if e.identifier != win.identifier]
        return self._measured(p, aligned, [win] + built, measure, confirm, fallback=win) if built else win

    def _usable(self, entries: list, p, aligned: bool) -> list:
        """``entries`` compiled (or loaded): those that built (a kernel needing more shared memory than the arch has
        does not, :func:`fmha_dsl.build_triton.compile_through_cache`), fit this GPU (:attr:`limits`: a device of
        the arch may allow less) and serve ``p``."""
        return self._serving(self._compile(entries, aligned), p, aligned)

    def _serving(self, entries: list, p, aligned: bool) -> list:
        """The compiled entries that serve ``p`` (a split kernel serves a plain forward problem once its combine
        kernel is built; a ``num_splits`` request needs a split kernel that allows as many)."""
        return [e for e in entries if not mismatches(e, p, aligned)]

    def _cheapest(self, p, entries: list) -> Entry:
        if len(entries) == 1:  # nothing to rank (append-KV has one kernel per key)
            return entries[0]
        return min(_without_spills(entries),
                   key=lambda x: (costmodel.cost(x, p, self.arch, self.compute_units)[0], x.identifier))

    def _compile(self, entries, aligned: bool, cache_only: bool = False) -> list[Entry]:
        """Compile (or load) ``entries`` through the builder and add them; the ones that compiled and fit this GPU's
        shared memory, in order.  ``cache_only``: load from the artifact cache, compile nothing
        (``FMHA_DSL_NO_BUILD``)."""
        have = {e.identifier: e for e in self.entries + self.too_big}  # a kernel too big for the GPU: not again
        out, new = [], []
        todo = [e for e in entries if e.identifier not in have]
        if todo:
            kw = {"cache_only": True} if cache_only else {}
            for e, bins in self.builder.compile(todo, aligned, **kw):
                if isinstance(bins, dict):
                    new.append((e, bins))
                    have[e.identifier] = e
        if new:
            self.add_many(new)
        for e in entries:  # a kernel that needs more shared memory than this GPU has is never a candidate
            got = have.get(e.identifier)
            if got is not None and got.build and not over_limits(got, self.limits):
                out.append(got)
        return out

    def _measured(self, p, aligned: bool, cands: list, measure, decide=race, fallback: Entry | None = None) -> Entry:
        """Time every candidate on the caller's arguments (``measure``, by ``decide``: :func:`runtime.race.race`, or
        :func:`runtime.race.confirm` for a shipped decision's finalists), keep the winner and record the decision.
        A candidate whose plan cannot be made drops out (the first one's error is raised when none is left); when
        nothing could be timed, ``fallback`` (a confirmed decision's shipped winner), else the cost model's choice."""
        tk = key(p, aligned)
        if self.tuned is not None and self.builder is None:
            rec = self.tuned.get(tk)
            if rec is not None:
                for e in cands:
                    if e.name == rec.get("kernel") and dict(e.sig) == rec["sig"]:
                        return e
        by_id, plans, failed = {e.identifier: e for e in cands}, {}, []
        for e in cands:
            try:
                plans[e.identifier] = self.plan_for(e, p)
            except FmhaError as exc:  # e.g. a build without its companion kernel: it cannot run, so it cannot win
                failed.append(exc)
        if not plans:
            raise failed[0]
        got = decide(measure, plans)
        if got is None:  # nothing could be timed (e.g. no memory for the L2 flush)
            if fallback is not None:
                return fallback
            import warnings

            warnings.warn(f"fmha-dsl: no candidate for {describe(p)} could be timed; the cost model chose",
                          RuntimeWarning, stacklevel=3)
            return self._cheapest(p, [by_id[i] for i in plans])
        win_id, times, sustained = got
        win = by_id[win_id]
        names = {i: by_id[i].name for i in times}
        if self.tuned is not None:
            rec = record_of(win, times, names, sustained)
            if self.builder is not None:
                rec["space"] = self.builder.fingerprint(p.family)
            self.record_decision(tk, rec)
        self.measured[tk] = {names[i]: t for i, t in times.items()}
        return win

    def record_decision(self, tk: str, rec: dict) -> None:
        """Record a measured decision under key ``tk`` in the tuned table (persisted with the others); when it cannot
        be written the decision holds for this process, later ones measure again, and one warning says why."""
        why = self.tuned.record(tk, rec)
        if why and not self._write_warned:
            import warnings

            self._write_warned = True
            warnings.warn(f"fmha-dsl: first-use decisions cannot be recorded ({why}); set FMHA_DSL_CACHE_DIR "
                          "to a writable folder", RuntimeWarning, stacklevel=4)


ALL_CANDIDATES = 1 << 30  # a candidate limit that keeps every candidate (a named runner-up is found whatever the knob)


def current_record(rec, builder, family: str) -> dict | None:
    """``rec`` (a recorded decision) when it was measured under ``builder``'s candidate space for ``family``; None
    when it is missing, not a record, or stale (another template or candidate space: measured again)."""
    if not isinstance(rec, dict) or rec.get("space") != getattr(builder, "fingerprint", lambda family: None)(family):
        return None
    return rec


def recorded_entry(builder, rec: dict | None, arch: str):
    """The entry (not compiled) of a record's winner, built from its key fields as first use builds it; None for no
    record or a damaged one."""
    if rec is None:
        return None
    try:
        return builder.entry_for(rec["sig"], rec["alg"], arch)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def named_candidates(builder, p, arch: str, aligned: bool, names) -> list:
    """The candidate entries (not compiled) of ``p`` whose names are in ``names`` (a record's runners-up), found among
    every candidate the rules allow; none for no names."""
    if not names:
        return []
    return [e for e in builder.candidates(p, arch, aligned, limit=ALL_CANDIDATES) if e.name in names]

_UNTIMED = 4   # candidates compiled when the choice is the cost model's (it weighs the builds' resource reports)
MAX_TIMED = 16  # registry candidates a first-use measurement times at most (the static order's first)


def _spills(e) -> int:
    return int(((e.build or {}).get("resources") or {}).get("spills") or 0)


def _without_spills(entries: list) -> list:
    """Never a candidate that spills while one that does not exists (the build's resource report)."""
    clean = [e for e in entries if not _spills(e)]
    return clean or entries


__all__ = ["enabled", "MeasuredSelection", "MAX_TIMED", "ALL_CANDIDATES", "current_record", "recorded_entry",
           "named_candidates"]
