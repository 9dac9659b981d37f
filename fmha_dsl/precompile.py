"""[build] A deployment's kernel cache, filled ahead of time on any machine (no GPU): ``fmha-dsl precompile``.

    from fmha_dsl.precompile import precompile_report
    done = precompile_report(problems, "sm90", cache_dir="deploy/")   # cached, failed, no_kernel
    # where the kernels run: FMHA_DSL_CACHE_DIR=deploy/ -- first use loads them and compiles nothing

Per problem it compiles what that problem's first call may need (:func:`precompile_report`), through the same
builder and artifact cache as first use (:class:`fmha_dsl.first_use.Builder`), so the entries are the ones a
first call looks up.
"""

from __future__ import annotations

from typing import NamedTuple

from .first_use import Builder, _name_of
from .registry import Entry


def precompile(problems, arch: str, aligned: bool = True, jobs: int | None = None, cache_dir: str | None = None,
               limit: int | None = None, device: str | None = None) -> int:
    """Compile every first-use candidate of ``problems`` into the artifact cache (no GPU needed), so that a
    deployment's first calls only load binaries.  Returns how many kernels are now cached.  The arguments are
    :func:`precompile_report`'s."""
    return precompile_report(problems, arch, aligned, jobs, cache_dir, limit, device).cached


class Precompiled(NamedTuple):
    """What :func:`precompile_report` did: kernels now in the cache, ``[(kernel name, why it did not compile)]``,
    and the problems (described) for which the rules allow no kernel on the arch."""
    cached: int
    failed: list
    no_kernel: list


def precompile_report(problems, arch: str, aligned: bool = True, jobs: int | None = None,
                      cache_dir: str | None = None, limit: int | None = None,
                      device: str | None = None, progress=None) -> Precompiled:
    """:func:`precompile`, saying what failed (``fmha-dsl precompile``).  Per problem, the kernels its first call
    may need: the candidates first use would time (``limit``: only the ones the cost model ranks highest), always the
    kernels a shipped table names for its class -- the winner and the close runners-up that first use times again
    -- of the device named ``device`` (as torch names it; None: every device of ``arch`` with a table), and the
    problems a call of it also decides: a backward's training forward (with LSE) and, for a paged prefill that may
    take the gathered route, the copy kernel and the forward problem over the copy.  ``progress(done, total, failed,
    cached)`` is called as each kernel is in (``fmha-dsl precompile`` draws it)."""
    from fmha_dsl.runtime import decisions
    from fmha_dsl.runtime.match import describe

    b = Builder(cache_dir, jobs)
    tables = decisions.shipped_tables(arch)
    if device is not None:
        tables = {device: tables.get(device, {})}
    want: dict[str, Entry] = {}
    no_kernel, failed, gathers = [], [], {}
    for p in _with_related(problems, gathers, aligned):
        picked = b.candidates(p, arch, aligned, limit)
        if not picked:
            no_kernel.append(describe(p))
            continue
        for e in picked + _shipped_kernels(b, p, arch, aligned, tables, picked):
            want.setdefault(e.identifier, e)
    got = b.compile(list(want.values()), aligned, progress=progress)
    failed += [(_name_of(e) if e.name == "<first-use>" else e.name, str(why)) for e, why in got
               if not isinstance(why, dict)]  # a shipped winner is built from its record's key, unnamed
    for p in gathers.values():
        entry, why = b.gather(p, arch)
        if entry is None:
            failed.append(("kv_gather for " + describe(p), str(why)))
    return Precompiled(len(got) + len(gathers) - len(failed), failed, no_kernel)


def _with_related(problems, gathers: dict, aligned: bool):
    """``problems`` and those a call of each also decides (see :func:`precompile_report`); the paged problems that
    may take the gathered route go into ``gathers`` (by their copy kernel's fields)."""
    from fmha_dsl.kernels.paged_abi import GATHER_FIELDS
    from fmha_dsl.runtime.plan_gather import fits, forward_problem

    for p in problems:
        yield p
        if p.family == "bwd_dq_dk_dv":
            yield p.model_copy(update={"family": "fwd", "lse": True})
        elif p.family == "batch_prefill" and aligned and fits(
                p.dtype, p.hdim_q, p.hdim_v, p.batch, p.nhead_q, p.nhead_k, p.max_seqlen_q or p.seqlen_q,
                p.max_seqlen_k or p.seqlen_k):
            gathers.setdefault(tuple(getattr(p, f) for f in GATHER_FIELDS), p)
            yield forward_problem(p)


def _shipped_kernels(b: Builder, p, arch: str, aligned: bool, tables: dict, picked: list) -> list[Entry]:
    """The kernels shipped tables name for ``p``'s class and ``picked`` lacks: each current record's winner and its
    close runners-up, found as first use finds them (:mod:`fmha_dsl.runtime.autotune`)."""
    from fmha_dsl.runtime import autotune, decisions

    k, have, out, names = decisions.key(p, aligned), {e.identifier for e in picked}, [], set()
    for table in tables.values():
        rec = autotune.current_record(table.get(k), b, p.family)
        win = autotune.recorded_entry(b, rec, arch)
        if win is None:
            continue
        if win.identifier not in have:
            have.add(win.identifier)
            out.append(win)
        names.update(decisions.close_runners_up(rec))
    names -= {e.name for e in picked + out}
    return out + [e for e in autotune.named_candidates(b, p, arch, aligned, names) if e.identifier not in have]


__all__ = ["precompile", "precompile_report", "Precompiled"]
