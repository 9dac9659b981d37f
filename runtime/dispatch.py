"""Choose a registry kernel for a problem and launch it.

    disp = Dispatcher("build/bench")                  # a build dir, a registry.json or a Registry
    plan = disp.plan(Problem(dtype="fp16", hdim_q=128, hdim_v=128, seqlen_q=1024, seqlen_k=1024, mask="top_left"))
    plan.run(q, k, v, out, lse)                      # torch CUDA tensors, BHSD logical shapes

Matching (CK's ``supports()``: ``fmha_signature_matches`` + ``fmha_algorithm_supports``), for the entries of the
dispatcher's arch:

* exact: family, dtype, mode, vlayout, bias, lse, dropout, logits (soft-cap), sink, qscale, rope, paged_kv,
  fp8_static_quant, skip, dbias, store_randval, deterministic (and kv_layout/kv_lookup for batch_prefill,
  page_size for paged families when the kernel's is > 1);
* mask: ``no`` only by a ``no`` kernel; every other mask (causal top-left or bottom-right, sliding window) by
  one causal kernel (corner and window are run-time arguments);
* head dims are upper bounds: ``Dq <= hdim_q`` and, when ``pad_d == 0``, ``Dq == hdim_q`` (same for ``Dv``);
* ``pad_s == 0`` needs ``max_seqlen_q % m0 == 0``; ``pad_sk == 0`` needs batch mode and
  ``seqlen_k % n0 == 0``; ``max_seq_len_q > 0`` needs ``max_seqlen_q <= max_seq_len_q``;
* a binary whose build promised 16-divisible pointers/strides (``build["aligned"]``) only serves problems
  whose arguments keep the promise.

Selection among the matches (:mod:`fmha_dsl.seqtune`): with a usable seqtune table in the registry (measured on
this arch and device; another device's table is ignored with :class:`fmha_dsl.seqtune.SeqtuneDeviceWarning`), by
the predicted time (interpolated in log seqlen, scaled by wave quantisation for batch x heads); kernels without
measurements after those, by the cost model (tile waste, waves over the compute units, occupancy from the build's
resource usage) when every one has a build, else by the static order.  The static order (``candidates()``, and the
whole selection for registries without builds or table): the smallest padded head dims ``(hdim_q, hdim_v)``, then
the fewest padded dims (pad_s, pad_sk, pad_d, pad_dv), then the lowest ``selection_rank``, then the larger ``m0``,
then the larger ``n0``, then ``qr_async`` before ``qr``, then the identifier (deterministic).

Decisions are cached per problem class (:mod:`fmha_dsl.runtime.class_keys`: the matching fields, the head dims,
the lengths' residues or buckets, a sliding window's octave), a dict lookup on a small tuple.  No match raises :class:`fmha_dsl.errors.FmhaError` (rule ``dispatch.no-kernel``) naming the
three closest entries, the fields where they differ, and the ``.fmha`` declaration that would add a match.

A compiling dispatcher (``builder=``, e.g. :class:`fmha_dsl.first_use.Builder`; what ``fmha_dsl.attention`` uses
without a registry) selects by measurement on first use instead (:mod:`fmha_dsl.runtime.autotune`): per decision key
(the problem class and the octaves of the lengths and of batch x heads) it compiles the candidates the builder ranks
highest, times them on the caller's arguments (``plan(problem, measure=...)``), keeps the fastest and records it per
device; without ``measure`` (or with ``FMHA_DSL_AUTOTUNE=0``) the cost model chooses among the compiled candidates,
never one that spills while one that does not exists.  ``FMHA_DSL_NO_BUILD=1`` makes a missing kernel an error.
A registry without a seqtune table gets the same treatment when the caller can measure: its candidates are timed
once per decision key.
"""

from __future__ import annotations

import os
import threading

from fmha_dsl import costmodel, knobs, seqtune
from fmha_dsl.arch import names as _arch_names
from fmha_dsl.errors import RegistryError, UsageError, did_you_mean, error
from fmha_dsl.registry import Entry

from . import abi, autotune, binaries, decisions
from .autotune import MAX_TIMED, MeasuredSelection
from .class_keys import ClassKeys
from .match import (EXACT, _lcm, _max_sk, _max_sq, declaration_for, group_key, mismatches, no_kernel_error,
                    preference)
from fmha_dsl.kernels.abis import abi_of

from .plan import Plan, Stage, current_stream
from .plan_bwd import BackwardPlan
from .plan_paged import AppendPlan, PagedPlan
from .device import _device_name, checked_limits, detect_arch, device_limits, open_registry, over_limits


# the plan class of each family a plan starts from (its stages, workspace and launch order); Plan otherwise
PLANS = {"bwd_dq_dk_dv": BackwardPlan, "batch_prefill": PagedPlan, "fwd_pagedkv": PagedPlan, "fwd_appendkv": AppendPlan}


def plan_class(family: str):
    return PLANS.get(family, Plan)


LAUNCHERS = ("auto", "native", "cuda", "triton", "hip", "interpret")


# ---------------------------------------------------------------------------------------------------------
# the dispatcher
# ---------------------------------------------------------------------------------------------------------
def default_launcher(arch: str) -> str:
    if arch.startswith("gfx"):
        return "hip"
    return knobs.launcher()


class Dispatcher(MeasuredSelection, ClassKeys):
    """Selects, loads and launches registry kernels for one arch.

    ``registry``: a :class:`~fmha_dsl.registry.Registry`, a build directory or a ``registry.json`` path (``None``:
    empty, for a compiling dispatcher).  ``arch``: the registry arch to serve (default: the current device's).
    ``root``: where the entries' ``build["binary"]`` paths are relative to (default: the registry file's folder).
    ``launcher``: ``"auto"`` (default on NVIDIA, ``FMHA_DSL_LAUNCHER`` overrides: ``"native"`` where fmha-dsl's
    C launcher compiles, else ``"cuda"``), ``"native"``, ``"cuda"`` (cuda-python), ``"triton"`` (Triton's C
    launcher), ``"hip"`` (AMD) or ``"interpret"`` (the template under ``TRITON_INTERPRET=1`` on CPU
    tensors: tests and debugging).  ``builder``: compile on first use (see the module docstring); it has
    ``candidates(problem, arch, aligned)`` and ``compile(entries, aligned)`` (:class:`fmha_dsl.first_use.Builder`).
    ``tuned_dir``: where first-use decisions are recorded (default: fmha-dsl's cache folder; ``""``: nowhere).
    ``limits``: what the GPU allows, ``{"shared_bytes": ..., "compute_units": ...}`` (default: read from the current
    device, :func:`fmha_dsl.runtime.device.device_limits`): kernels needing more shared memory are never selected.
    """

    def __init__(self, registry=None, arch: str | None = None, *, root: str | None = None,
                 launcher: str | None = None, builder=None, device_name: str | None = None,
                 tuned_dir: str | None = None, limits: dict | None = None):
        reg, found_root = open_registry(registry)
        if builder is not None and registry is not None:  # compiled kernels are added here, not to the caller's
            reg = reg.filter()
        self.registry = reg
        self.root = root if root is not None else found_root
        self.arch = arch or detect_arch()
        if self.arch not in _arch_names():
            raise error("usage.arch", f"unknown arch `{self.arch}`", None, did_you_mean(str(self.arch), _arch_names())
                        or f"one of: {', '.join(_arch_names())}", cls=UsageError)
        self.launcher = launcher or default_launcher(self.arch)
        if self.launcher not in LAUNCHERS:
            raise error("usage.value", f"unknown launcher {self.launcher!r}", None,
                        f"one of: {', '.join(LAUNCHERS)} (FMHA_DSL_LAUNCHER sets the default)", cls=UsageError)
        self.builder = builder
        # what the GPU allows (kernels needing more shared memory per block are never selected); none when interpreted
        self.limits = checked_limits(limits) if limits is not None else (
            device_limits(self.arch) if self.launcher != "interpret" else {})
        self._lock = threading.RLock()
        self._decided: dict[str, Entry] = {}   # decision key -> the entry chosen (measured or recorded)
        self.measured: dict[str, dict] = {}    # decision key -> {kernel name: microseconds} timed in this process
        self._write_warned = False
        self._binaries: dict[str, bytes] = {}
        self._stages: dict[str, Stage] = {}
        # the seqtune table, when measured on this arch and device (else a SeqtuneDeviceWarning, and None)
        self.table_note: str | None = None
        table = seqtune.Table.of(self.registry)
        if table is not None:
            if device_name is None:
                device_name = _device_name()
            self.table_note = seqtune.device_mismatch(table, self.arch, device_name)
            if self.table_note:
                seqtune.warn_ignored(self.table_note)
                table = None
        self.table = table
        cus = table.device.get("compute_units") if table is not None else None
        self.compute_units = int(cus or self.limits.get("compute_units") or costmodel.compute_units(self.arch))
        self.tuned = None
        if builder is not None or table is None:
            if device_name is None:
                device_name = _device_name()
            if tuned_dir is None:
                from fmha_dsl.cache import cache_base

                tuned_dir = cache_base()
            self.tuned = decisions.TunedTable(self.arch, device_name, tuned_dir or None,
                                             decisions.shipped(self.arch, device_name) if builder is not None else None)
        self._reindex()
        missing = binaries.missing(self.entries, self.root)
        if missing:
            what = "1 kernel binary is" if len(missing) == 1 else f"{len(missing)} kernel binaries are"
            raise error("registry.binary-missing", f"{what} missing from `{self.root}`: " + "; ".join(missing[:3])
                        + (" ..." if len(missing) > 3 else ""),
                        None, "the build directory is incomplete (a copy or a clean-up lost files): rebuild it with "
                        "`fmha-dsl build`", cls=RegistryError)

    # -- index ------------------------------------------------------------------------------------------
    def _reindex(self) -> None:
        self.entries, self.too_big = [], []  # too big: built for the arch, needing more shared memory than this GPU
        for e in self.registry:
            if e.arch == self.arch:
                (self.too_big if over_limits(e, self.limits) else self.entries).append(e)
        groups: dict[tuple, list[Entry]] = {}
        for e in self.entries:
            groups.setdefault(group_key(e.sig, dict.__getitem__), []).append(e)
        self._groups = groups
        tiles = [e.alg["tile"] for e in self.entries] or [(1, 1)]
        self.lq = _lcm({t[0] for t in tiles if t[0] > 0})
        self.lk = _lcm({t[1] for t in tiles if t[1] > 0})  # (append-KV's tile has no key block)
        self.sq_bounds = sorted({e.alg["max_seq_len_q"] for e in self.entries if e.alg["max_seq_len_q"] > 0})
        if self.builder is None or not hasattr(self, "_plans"):  # a compiling dispatcher's keys do not depend on
            # the tiles it holds (seq_key: octaves): its cached plans stay valid when kernels are added
            self._plans: dict[tuple, Plan] = {}
            self._plan_of: dict[tuple, Plan] = {}  # one Plan per (selected kernel, split count)
            self.fast: dict[tuple, Plan] = {}  # attention()'s own problem-class keys
            self.fast_bwd: dict[tuple, object] = {}  # attention_backward()'s
            self.fast_paged: dict[tuple, object] = {}  # paged_attention()'s and append_kv()'s
        # the selection depends on seqlen / batch x heads (table or cost model): the class key adds buckets --
        # only when some problem has a choice: a problem's candidates all lie in one exact-key group, so a
        # choice needs a group of two or more.  A JIT dispatcher holds one kernel per class: no buckets.
        ranked_data = self.table is not None or any(e.build for e in self.entries)
        self.ranking = self.builder is None and ranked_data and any(len(g) > 1 for g in groups.values())

    def add(self, entry: Entry, binary=None) -> None:
        """Add a kernel (and its binary: bytes, or ``{identifier: bytes}`` with a split kernel's
        ``<id>:combine``) to this dispatcher's registry; cached decisions are redone."""
        self.add_many([(entry, binary)])

    def add_many(self, items) -> None:
        with self._lock:
            for entry, binary in items:
                self.registry.add(entry)
                if isinstance(binary, dict):
                    self._binaries.update(binary)
                elif binary is not None:
                    self._binaries[entry.identifier] = binary
            self._reindex()

    # -- selection --------------------------------------------------------------------------------------
    def ranked(self, p, aligned: bool = True, candidates=None) -> list[dict]:
        """The candidates of ``p`` ranked fastest first (:func:`fmha_dsl.seqtune.rank`): rows with ``entry``,
        ``source`` and the prediction."""
        c = self.candidates(p, aligned) if candidates is None else candidates
        return seqtune.rank(p, c, self.table, self.arch, self.compute_units)

    def explain(self, problem, aligned: bool = True) -> list[dict]:
        """Every kernel of this arch for ``problem``: the candidates ranked (``rank`` 0 is what :meth:`select`
        chooses for this problem's bucket), with predicted and measured times, then each excluded kernel and why."""
        _a_problem("explain", problem)
        cands = self.candidates(problem, aligned)
        rows = []
        decided = self.ranked(self._representative(problem), aligned, cands) if self.ranking else [
            {"entry": e, "source": "static"} for e in cands]
        chosen = decided[0]["entry"].identifier if decided else None
        exact = seqtune.rank(problem, cands, self.table, self.arch, self.compute_units) if self.ranking else decided
        pts = self.table.points(seqtune.class_of_problem(problem)) if self.table is not None else {}
        here = pts.get((_max_sq(problem), _max_sk(problem), problem.batch, problem.nhead_q, problem.nhead_k))
        order = {r["entry"].identifier: i for i, r in enumerate(decided)}
        for r in sorted(exact, key=lambda r: order.get(r["entry"].identifier, len(order))):
            e = r["entry"]
            row = {"kernel": e.identifier, "name": e.name, "rank": order.get(e.identifier), "selected":
                   e.identifier == chosen, "source": r["source"], "predicted_us": r.get("predicted_us"),
                   "measured_us": (here or {}).get("times_us", {}).get(e.identifier), "points": r.get("points", []),
                   "tile": list(e.alg["tile"][:2]), "pipeline": e.alg["pipeline"]}
            if "cost" in r:
                row["cost"] = r["cost"]
                row["cost_detail"] = r["detail"]
            rows.append(row)
        for e, why in seqtune.excluded_by_table(problem, cands, self.table):
            rows.append({"kernel": e.identifier, "name": e.name, "excluded": True, "why": [why]})
        ids = {e.identifier for e in cands}
        for e in self.entries:
            if e.identifier not in ids:
                rows.append({"kernel": e.identifier, "name": e.name, "excluded": True,
                             "why": [f"{f}: {w}" for f, w in mismatches(e, problem, aligned)]})
        for e in (e for e in self.too_big if not mismatches(e, problem, aligned)):
            rows.append({"kernel": e.identifier, "name": e.name, "excluded": True,
                         "why": [f"shared memory: needs {over_limits(e, self.limits)} bytes per block, this GPU "
                                 f"allows {self.limits['shared_bytes']}"]})
        return rows

    def candidates(self, p, aligned: bool = True) -> list[Entry]:
        """Every entry of this arch that serves ``p``, most preferred first."""
        group = self._groups.get(group_key(p, getattr), ())
        return sorted((e for e in group if not mismatches(e, p, aligned)), key=preference)

    def _best(self, p, c: list, aligned: bool):
        if len(c) > 1 and self.ranking:
            r = self.ranked(self._representative(p), aligned, c)
            if r:
                return r[0]["entry"]
        return c[0]

    def select(self, p, aligned: bool = True, measure=None) -> Entry:
        """The entry that runs ``p``.  ``measure(plan, n) -> [microseconds]`` (optional) times a candidate plan on the
        caller's arguments: a compiling dispatcher, and a registry without a seqtune table, then choose by it."""
        _a_problem("select", p)
        if self.builder is not None:
            return self._first_use(p, aligned, measure)
        c = self.candidates(p, aligned)
        if c:
            if measure is not None and len(c) > 1 and self.table is None and autotune.enabled():
                return self._measured(p, aligned, c[:MAX_TIMED], measure)
            return self._best(p, c, aligned)
        raise no_kernel_error(p, self.arch, self.entries, self.registry.name, self.registry.archs, aligned,
                              self.too_big, self.limits)

    def plan(self, problem, aligned: bool = True, measure=None) -> Plan:
        """The execution plan for ``problem`` (a :class:`fmha_dsl.keys.Problem`); cached per problem class.
        ``measure``: see :meth:`select`."""
        _a_problem("plan", problem)
        if problem.arch is not None and problem.arch != self.arch:
            raise error("dispatch.arch", f"problem is for {problem.arch}, this dispatcher serves {self.arch}",
                        None, "make a Dispatcher for that arch", cls=UsageError)
        key = self.class_key(problem, aligned)
        plan = self._plans.get(key)
        if plan is None:
            entry = self.select(problem, aligned, measure)
            key = self.class_key(problem, aligned)  # a JIT compile may have changed the tile lcm
            pk = (entry.identifier, problem.num_splits if problem.family == "fwd_splitkv" else 0)
            plan = self._plan_of.get(pk)
            if plan is None:
                plan = self._plan_of[pk] = self.plan_for(entry, problem)
            self._plans[key] = plan
        return plan

    def plan_for(self, entry: Entry, problem) -> Plan:
        """The plan that runs ``entry`` for ``problem``'s class: its stage, then the companion kernels its family
        is built with (:mod:`fmha_dsl.kernels.abis`: a split-KV kernel's combine, the backward's dot_do_o and
        convert_dq), as the family's plan class (:data:`fmha_dsl.runtime.plan.PLANS`) orders and launches them."""
        family = entry.sig["family"]
        kabi = abi_of(family)
        stages = [self.stage(entry)]
        for role, cfam in (kabi.companions if kabi is not None else ()):
            build = entry.build or {}
            if not build.get(role):
                if self.launcher != "interpret":  # the interpreter runs the companion from source
                    raise error("dispatch.no-binary", f"kernel {entry.name} has no {role} kernel in its build",
                                None, "rebuild the set with `fmha-dsl build FILE --backend triton -o DIR`")
                entry = Entry(None, entry.name, entry.source, dict(build, **{role: {}}), sig=entry.sig,
                              alg=entry.alg, arch=entry.arch, ident=entry.identifier)
            stages.append(self.stage(companion_entry(entry, role, cfam)))
        return plan_class(family)(problem, stages)

    def loose_stage(self, entry: Entry, binary: bytes | None) -> Stage:
        """The stage of a kernel kept outside the registry (the gathered route's copy kernel), with its binary."""
        if binary is not None:
            with self._lock:
                self._binaries[entry.identifier] = binary
        return self.stage(entry)

    def stage(self, entry: Entry) -> Stage:
        st = self._stages.get(entry.identifier)
        if st is None:
            st = self._stages[entry.identifier] = Stage(entry, self)
        return st

    # -- loading ----------------------------------------------------------------------------------------
    def binary(self, entry: Entry) -> bytes:
        """``entry``'s binary (read once: :func:`.binaries.read`)."""
        data = self._binaries.get(entry.identifier)
        if data is None:
            data = self._binaries[entry.identifier] = binaries.read(entry, self.root)
        return data

    def load(self, entry: Entry, device: int):
        """The launchable kernel of ``entry`` on ``device`` (loaded once per stage and device)."""
        b = entry.build or {}
        if self.launcher == "interpret":
            from .interpret import InterpretKernel

            return InterpretKernel(entry)
        kabi = abi_of(entry.sig["family"])
        if kabi is None:
            raise error("runtime.abi", f"kernel {entry.name}: the triton backend has no kernels of family "
                        f"{entry.sig['family']}", None, "build this family with the CK backend's launcher")
        names = kabi.names
        why = abi.check_params(b.get("params"), names)
        if why:
            raise error("runtime.abi", f"kernel {entry.name}: {why}", None,
                        "the registry was built from another template version: rebuild it")
        data = self.binary(entry)
        types = kabi.types(entry.sig["dtype"])
        scratch = (int(b.get("global_scratch") or 0), int(b.get("profile_scratch") or 0))
        num_warps = int(b.get("num_warps") or entry.alg["wave"][0])
        if self.launcher == "hip":
            from .hip import load_hsaco

            return load_hsaco(data, entry=b["entry"], shared=int(b.get("shared") or 0), num_warps=num_warps,
                              device=device, types=types, warp_size=int(b.get("warp_size") or 64), scratch=scratch)
        from .cuda import load_cubin

        return load_cubin(data, entry=b["entry"], shared=int(b.get("shared") or 0), num_warps=num_warps,
                          device=device, types=types, warp_size=int(b.get("warp_size") or 32),
                          launcher=self.launcher, scratch=scratch, alloc=_torch_alloc, names=names,
                          after_prior=bool(b.get("after_prior")))


def companion_entry(entry: Entry, role: str, family: str) -> Entry:
    """The ``role`` kernel built with ``entry`` (a split-KV kernel's ``combine``, a backward kernel's ``dot_do_o`` /
    ``convert_dq``) as an entry of its own: family ``family``, identifier ``<id>:<role>``, build ``build[role]``."""
    b = entry.build[role] or {}
    name = b.get("name") or os.path.splitext(os.path.basename(b.get("binary") or ""))[0] or f"{entry.name}_{role}"
    return Entry(None, name, entry.source, b, sig=dict(entry.sig, family=family), alg=entry.alg, arch=entry.arch,
                 ident=f"{entry.identifier}:{role}")


def _torch_alloc(nbytes: int, device: int):
    import torch

    return torch.empty(int(nbytes), dtype=torch.uint8, device=f"cuda:{device}")



def _a_problem(method: str, p) -> None:
    """The problem a Dispatcher method is asked about is a :class:`fmha_dsl.keys.Problem` (a dict or None reached
    an AttributeError inside)."""
    from fmha_dsl.keys import Problem

    if not isinstance(p, Problem):
        raise error("usage.type", f"Dispatcher.{method}() takes a fmha_dsl.Problem, got {type(p).__name__}", None,
                    "fmha_dsl.Problem(family='fwd', dtype='bf16', hdim_q=128, seqlen_q=..., ...)", cls=UsageError)

__all__ = ["Dispatcher", "Plan", "Stage", "detect_arch", "open_registry", "mismatches", "preference",
           "declaration_for", "no_kernel_error", "current_stream", "EXACT"]
