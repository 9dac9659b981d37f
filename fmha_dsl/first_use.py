"""[build] The kernels a problem can use, straight from the rules, compiled on first use.

This is the builder a compiling dispatcher is handed (``Dispatcher(None, builder=Builder())``, what
:func:`fmha_dsl.attention` makes when no registry is given).  The runtime never imports it: it only calls the two
methods below, so compiling stays on the build side of the pipeline.

``Builder.candidates(problem, arch, aligned)``
    Every kernel key the Triton rules allow for the problem's class, made from keys directly (no ``.fmha`` text):
    the problem's exact head dims (``pad_d = pad_dv = 0``: the head-dim tail is masked against a constant, which
    keeps 16-byte loads), padded sequence dims (one kernel serves every length; the tail block alone pays the
    bounds checks) -- and, for batch-mode lengths that are multiples of :data:`ALIGN`, the unpadded variant of each
    tile that divides them too --, every tile of the arch's table and every pipeline (the TMA pipelines only for aligned
    arguments), and -- for problems with few query blocks -- split-KV kernels.  Ranked by the cost model, at most
    ``FMHA_DSL_TUNE_CANDIDATES`` of them (split-KV ones included), half as many for the backward and -- on wgmma
    targets, without split kernels -- for the forward: the cost model's first 12 hold the measured best (within
    3 %) of the classes the shipped H100 and H200 tables measured, 96 of each family
    (``bench/probe_candidate_order.py``).
``Builder.compile(entries, aligned)``
    ``[(entry with build, binaries) | (entry, reason)]``: each from the artifact cache or compiled in worker
    processes (crash-isolated, ``FMHA_DSL_JOBS`` at a time), then cached.  ``binaries`` maps the entry's identifier
    (and ``<id>:combine`` for a split-KV kernel's combine kernel) to bytes.
``Builder.compile_ahead(entries, aligned)``
    Queues ``entries`` behind the next ``compile`` call's own jobs, in the same batch of workers, which goes on in
    the background (``start_ahead()``: now): a training step's backward candidates while its forward compiles.  A
    later ``compile`` of them takes their results (:mod:`fmha_dsl.compile_ahead`).
"""

from __future__ import annotations

import threading

from . import knobs
from .cache import ArtifactCache
from .errors import error
from .kernels.fwd_abi import SEQ_ALIGN as ALIGN  # lengths that are multiples of it also get unpadded candidates
from .registry import Entry
from .seqtune import seq_aligned

# problems whose query blocks fill fewer programs than this many waves of the device get split-KV candidates too
SPLIT_BELOW_WAVES = 2
SPLITS_LOG2 = (4, 5, 6)         # 16, 32 and 64 splits at most (fewer when the key axis is short)
PAGED = ("batch_prefill", "fwd_pagedkv", "fwd_appendkv")   # the serving families
# bumped when the candidate rules below change (part of Builder.fingerprint).  4: fp32's ranking on NVIDIA
# (costmodel.FP32_REGS, the forward's single-stage loads not last, the backward's TMA pipeline last): a user's
# recorded decisions are measured again (every dtype's: the fingerprint is per family); the shipped ones restamped
CANDIDATES_VERSION = 4
SERVING_CANDIDATES_VERSION = 2  # the same for the serving families' own rules (their fingerprint only)
DECODE_ROWS = 16                # a paged problem with at most this many query rows per K/V head (decode) also gets the
#                                 split-KV family's short-tile kernels, however many programs it has (they may run 1 split)


def _bindings(problem, arch: str, family: str, aligned: bool, pads=(1, 1)) -> list[dict]:
    """Rule-checked bindings of ``family`` for ``problem`` on ``arch`` (tile and pipeline free)."""
    from .rules import family_rules
    from .rules.base import FACTORY, schedule, search
    from .kernels.fwd_abi import packs_gqa
    from .data import uses_tma
    from .vocab import ALG_DEFAULTS, SIG_DEFAULTS

    fr = family_rules(family, "triton")
    pipelines = "triton_bwd" if family == "bwd_dq_dk_dv" else "triton"  # the backward's have a table of their own
    pinned = {
        "dtype": problem.dtype, "hdim": (problem.hdim_q, problem.hdim_v), "mode": problem.mode,
        "vlayout": problem.vlayout, "pad_s": pads[0], "pad_sk": pads[1], "pad_d": 0, "pad_dv": 0,
        "mask": "top_left" if problem.mask != "no" else "no", "bias": problem.bias, "logits": problem.logits,
        "lse": problem.lse, "dropout": problem.dropout, "sink": problem.sink, "dbias": problem.dbias,
        "deterministic": problem.deterministic, "kv_layout": problem.kv_layout, "kv_lookup": problem.kv_lookup,
        "page_size": problem.page_size, "rope": problem.rope, "paged_kv": problem.paged_kv, "qscale": problem.qscale,
    }
    env = {"arch": arch, "factory": FACTORY[arch], "receipt": 0, "mask_impl": "simplified", "family": family,
           "backend": "triton", **fr.fixed}
    for name, value in {**SIG_DEFAULTS, **ALG_DEFAULTS}.items():
        if name not in fr.fields and name not in env and name != "tile":
            env[name] = value

    def values(f, b):
        if f in pinned:
            return (pinned[f],)
        if f == "pipeline":  # GQA-packed rows only where there is a group to pack; TMA only for aligned arguments
            return tuple(p for p in fr.domain(f, b) if (aligned or not uses_tma(pipelines, p))
                         and (problem.nhead_q > problem.nhead_k or not packs_gqa(p)))
        if f == "max_splits_log2":
            return SPLITS_LOG2
        return fr.domain(f, b)

    return [(b, fr) for b in search(fr.fields, values, schedule(fr.fields, fr.rules), env)]


def _entry(b: dict, fr, arch: str, aligned: bool) -> Entry:
    from .expand import _fields

    name = fr.ck_name(b)
    sig, alg = _fields(dict(b))
    if not aligned:  # a distinct key (CK's constraint tag): it sits next to the aligned build of the same kernel
        alg = dict(alg, constraint="unaligned")
        name += "_unaligned"
    return Entry(None, name, "<first-use>", None, sig=sig, alg=alg, arch=arch)


class Builder:
    """Makes and compiles the default path's candidate kernels (see the module docstring)."""

    def __init__(self, cache_dir: str | None = None, jobs: int | None = None):
        self.cache_dir = cache_dir
        self.jobs = jobs
        self._fingerprints: dict[str, str] = {}
        self._ahead: dict[str, tuple] = {}  # cache key -> job: compiled after the next batch (compile_ahead)
        self._ahead_lock = threading.Lock()

    # -- keys -------------------------------------------------------------------------------------------
    def candidates(self, problem, arch: str, aligned: bool = True, limit: int | None = None) -> list[Entry]:
        """Rule-checked candidate entries (no build yet), most promising first by the cost model."""
        if problem.family not in ("fwd", "fwd_splitkv", "bwd_dq_dk_dv") + PAGED:
            raise error("runtime.jit", f"compiling on first use serves the forward, backward and serving families, "
                        f"not {problem.family}", None, "pass registry= a build of a set that declares this family")
        from .rules import family_rules

        why = family_rules("fwd", "triton").supported(arch)
        if why:
            from .arch import backend_archs
            from .errors import UsageError, did_you_mean

            have = backend_archs("triton")
            raise error("usage.arch", f"cannot compile for arch `{arch}`: {why}", None,
                        did_you_mean(str(arch), have) or f"one of: {', '.join(have)}", cls=UsageError)
        if problem.family == "bwd_dq_dk_dv":
            return self._backward(problem, arch, aligned, limit)
        if problem.family in PAGED:
            return self._serving(problem, arch, aligned, limit)
        out = [_entry(b, fr, arch, aligned) for b, fr in _bindings(problem, arch, "fwd", aligned)]
        aq, ak = seq_aligned(problem.max_seqlen_q or problem.seqlen_q, problem.max_seqlen_k or problem.seqlen_k,
                             problem.mode == "group")
        if aq or ak:  # unpadded variants of the tiles that divide ALIGN
            tight = {}
            for b, fr in _bindings(problem, arch, "fwd", aligned, (0 if aq else 1, 0 if ak else 1)):
                if ALIGN % b["tile"].tile[0] == 0 and ALIGN % b["tile"].tile[1] == 0:
                    e = _entry(b, fr, arch, aligned)
                    tight[_same_kernel(e)] = e
            # every problem of this decision key is aligned alike: the padded twin of an unpadded kernel is dropped
            out = [e for e in out if _same_kernel(e) not in tight] + list(tight.values())
        # where the cost model's forward ranking was fitted, its first half of FMHA_DSL_TUNE_CANDIDATES holds the
        # measured best of a prefill class (tests/test_runtime.py)
        from .costmodel import forward_fitted

        return _with_splits(problem, arch, aligned, limit, out, "fwd_splitkv", 3,
                            alone=_half_cut() if forward_fitted(arch) else None)

    def _backward(self, problem, arch: str, aligned: bool, limit: int | None) -> list[Entry]:
        """The backward's candidates: every tile and staging the rules allow, padded (and, for lengths that are
        multiples of ALIGN, unpadded), ranked by the cost model; by default half of ``FMHA_DSL_TUNE_CANDIDATES``."""
        from .arch import info as arch_info
        from .costmodel import compute_units, cost, fma_products
        from .data import load, uses_tma
        from .rules.triton_bwd import _vendor_has, smem_bytes, stages

        out = {}
        aq, ak = seq_aligned(problem.max_seqlen_q or problem.seqlen_q, problem.max_seqlen_k or problem.seqlen_k,
                             problem.mode == "group")
        staged = any(_vendor_has(arch, p) and stages(arch, {"pipeline": p}) > 1
                     for p in load("triton_bwd")["pipelines"])
        limit_bytes = arch_info(arch)["shared_bytes"]
        # a problem that does not ask for determinism also gets the deterministic kernels (dQ by dedicated programs in
        # a fixed order, no atomics): faster on some shapes, the timing decides
        variants = (problem,) if problem.deterministic else (
            problem, problem.model_copy(update={"deterministic": True}))
        for prob in variants:
            for pads in {(1, 1), (0 if aq else 1, 0 if ak else 1)}:
                for b, fr in _bindings(prob, arch, "bwd_dq_dk_dv", aligned, pads):
                    if staged and stages(arch, b) <= 1:  # a single-stage loop only where nothing is staged
                        continue
                    if aligned and smem_bytes(b, aligned=True) > limit_bytes:  # the rule checked any build
                        continue
                    t = b["tile"].tile
                    if pads != (1, 1) and (ALIGN % t[0] or ALIGN % t[1]):
                        continue
                    e = _entry(b, fr, arch, aligned)
                    k = _same_kernel(e) + (e.sig["deterministic"],)
                    if k not in out or _unpadded(e) > _unpadded(out[k]):
                        out[k] = e
        cus = compute_units(arch)
        # fp32 on the FMA units: the TMA pipeline ran 4.5-19x slower than the best in 9 of the 14 builds of its
        # atomic route measured (H200, bench/probe_flag_cut.py), so it comes after the others
        fp32 = fma_products(problem.dtype, arch)

        def rank(e):
            one = stages(arch, e.alg) <= 1
            late = fp32 and uses_tma("triton_bwd", e.alg["pipeline"])
            return (one, late, cost(e, problem, arch, cus)[0], -_unpadded(e), e.identifier)

        return sorted(out.values(), key=rank)[:_half_cut() if limit is None else limit]

    def _serving(self, problem, arch: str, aligned: bool, limit: int | None) -> list[Entry]:
        """The serving families' candidates: append-KV has one kernel per key; paged attention every tile and
        pipeline the rules allow, plus -- for problems with few query blocks (decode) -- the split-KV ``fwd_pagedkv``
        kernels, ranked by the cost model."""
        if problem.family == "fwd_appendkv":
            return [_entry(b, fr, arch, aligned) for b, fr in _bindings(problem, arch, "fwd_appendkv", aligned)][:1]
        out = [_entry(b, fr, arch, aligned) for b, fr in _bindings(problem, arch, "batch_prefill", aligned)]
        g = max(1, problem.nhead_q // max(problem.nhead_k, 1))
        decode = max(problem.max_seqlen_q or problem.seqlen_q, 1) * g <= DECODE_ROWS
        return _with_splits(problem, arch, aligned, limit, out, "fwd_pagedkv", 2, decode)

    def fingerprint(self, family: str = "fwd") -> str:
        """What the candidate space of ``family``'s problems and its kernels depend on: the template's source, the
        Triton backend's tables, its rules and :data:`CANDIDATES_VERSION` (not the Triton version: a decision names a
        kernel key, which any Triton compiles).  A recorded decision made under another fingerprint is measured again
        (a changed template or a new pipeline may change the winner)."""
        kind = "bwd" if family.startswith("bwd") else "paged" if family in PAGED else "fwd"
        got = self._fingerprints.get(kind)
        if got is None:
            import hashlib
            import json

            from .compile_triton import template_sha256
            from .data import load
            from .rules import triton_bwd, triton_fwd, triton_paged

            h = hashlib.sha256(template_sha256("fwd").encode())
            for name in ("triton", "archs"):
                h.update(json.dumps(load(name), sort_keys=True).encode())
            with open(triton_fwd.__file__, "rb") as f:  # the rules decide which tiles and pipelines exist
                h.update(f.read())
            if kind == "bwd":  # the backward's own template, tables and rules
                h.update(template_sha256("bwd_dq_dk_dv").encode())
                h.update(json.dumps(load("triton_bwd"), sort_keys=True).encode())
                with open(triton_bwd.__file__, "rb") as f:
                    h.update(f.read())
            if kind == "paged":  # the serving template, its tables and rules
                h.update(template_sha256("batch_prefill").encode())
                h.update(template_sha256("fwd_appendkv").encode())
                h.update(template_sha256("kv_gather").encode())  # the gathered route's copy (its route decisions)
                h.update(json.dumps(load("triton_paged"), sort_keys=True).encode())
                with open(triton_paged.__file__, "rb") as f:
                    h.update(f.read())
                h.update(f"serving{SERVING_CANDIDATES_VERSION}".encode())
            h.update(str(CANDIDATES_VERSION).encode())
            got = self._fingerprints[kind] = h.hexdigest()[:16]
        return got

    def entry_for(self, sig: dict, alg: dict, arch: str) -> Entry:
        """The entry of a stored decision's key (checked against the rules when it is compiled)."""
        alg = {k: tuple(v) if isinstance(v, list) else v for k, v in alg.items()}  # JSON gives lists
        return Entry(None, "<first-use>", "<first-use>", None, sig=dict(sig), alg=alg, arch=arch)

    def gather(self, problem, arch: str, cache_only: bool = False):
        """The gathered route's copy kernel for a paged ``problem`` (family ``kv_gather``, built with the 16-byte
        promise: the route serves aligned calls only): ``(entry, binary)``, or ``(None, reason)`` when it does not
        compile (``cache_only``: only from the artifact cache)."""
        from .build_triton import build_record, companion_job, compile_through_cache
        from .kernels.abis import companion_sig
        from .kernels.paged_abi import GATHER_FIELDS

        csig = companion_sig({f: getattr(problem, f) for f in GATHER_FIELDS}, "kv_gather")
        name, k, job = companion_job(csig, arch)
        ready, why = compile_through_cache({k: job}, ArtifactCache.of(self.cache_dir), 1, cache_only=cache_only)
        if k not in ready:
            return None, why.get(k, "not compiled")
        meta, data, _ = ready[k]
        return Entry(None, name, "<first-use>", build_record(meta, k, None, name=name), sig=csig, alg={}, arch=arch,
                     ident=name), data

    # -- binaries ---------------------------------------------------------------------------------------
    def compile_ahead(self, entries, aligned: bool = True) -> None:
        """Compile ``entries`` in the background, after the jobs of the next :meth:`compile` call (in the same batch
        of workers: the ones its own jobs leave idle start on them), or at once on :meth:`start_ahead`.  A later
        :meth:`compile` of them waits for their results instead of compiling them again.  First use calls this with
        a training step's backward candidates before the forward's compile."""
        wanted, _ = _jobs(entries, aligned)  # (a key another batch compiles already is left to it then)
        with self._ahead_lock:
            self._ahead.update(wanted)

    def start_ahead(self) -> None:
        """Start the kernels :meth:`compile_ahead` queued that no :meth:`compile` call has taken, in the background."""
        ahead = self._take_ahead()
        if ahead:
            from .build_triton import compile_through_cache

            compile_through_cache({}, ArtifactCache.of(self.cache_dir), self.jobs or knobs.jobs(), ahead=ahead)

    def _take_ahead(self) -> dict:
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, {}
        return ahead

    def compile(self, entries, aligned: bool = True, cache_only: bool = False,
                progress=None) -> list[tuple[Entry, object]]:
        """``[(entry with build, {identifier: bytes}) | (entry, reason str)]`` in the order given.  ``cache_only``:
        what the artifact cache holds, nothing compiled (a miss is ``(entry, reason)``).  ``progress(done, total,
        failed, cached)`` is called as each kernel (a companion counts as one) is in."""
        try:
            import triton  # noqa: F401
        except ImportError:
            raise error("runtime.jit", "compiling kernels on first use needs Triton, which is not installed", None,
                        "pip install triton, or pass registry= a prebuilt build directory") from None
        from .build_triton import build_record, compile_through_cache

        entries = list(entries)
        wanted, keys = _jobs(entries, aligned)
        ahead = None if cache_only else self._take_ahead()
        counts = [0, 0, 0]   # done, failed, cached

        def counted(key, ok, cached):
            counts[0] += 1
            counts[1] += not ok
            counts[2] += bool(cached)
            progress(counts[0], len(wanted), counts[1], counts[2])
        on_result = None if progress is None else counted
        ready, why = compile_through_cache(wanted, ArtifactCache.of(self.cache_dir), self.jobs or knobs.jobs(),
                                           on_result=on_result, cache_only=cache_only, ahead=ahead)
        if progress is not None and counts[0] < len(wanted):   # (cache_only: the misses were not reported)
            progress(len(wanted), len(wanted), counts[1] + len(wanted) - counts[0], counts[2])
        out = []
        for e, (k, comps) in zip(entries, keys):
            if k not in ready:
                out.append((e, why.get(k, "not compiled")))
                continue
            missing = next(((role, ck) for role, _, ck in comps if ck not in ready), None)
            if missing is not None:
                out.append((e, f"its {missing[0]} kernel failed: " + why.get(missing[1], "not compiled")))
                continue
            meta, data, _ = ready[k]
            build = build_record(meta, k, None)
            bins = {e.identifier: data}
            for role, cname, ck in comps:
                cmeta, cdata, _ = ready[ck]
                build[role] = build_record(cmeta, ck, None, name=cname)
                bins[f"{e.identifier}:{role}"] = cdata
            name = e.name if e.name != "<first-use>" else _name_of(e)
            out.append((Entry(None, name, "<first-use>", build, sig=e.sig, alg=e.alg, arch=e.arch,
                              ident=e.identifier), bins))
        return out


def _jobs(entries: list, aligned: bool) -> tuple[dict, list]:
    """``(cache key -> job, [(kernel key, [(role, companion name, companion key)])])`` of ``entries``: each kernel's job
    and its companions' (shared between the kernels of one companion signature)."""
    from .build_triton import companion_jobs, kernel_job

    wanted: dict[str, tuple] = {}
    keys = []
    for e in entries:
        k, job = kernel_job(e.sig, e.alg, e.arch, aligned)
        wanted[k] = job
        comps = companion_jobs(e.sig, e.arch, aligned, e.alg)
        for _, _, ck, cjob in comps:
            wanted[ck] = cjob
        keys.append((k, [(role, name, ck) for role, name, ck, _ in comps]))
    return wanted, keys


def _with_splits(problem, arch: str, aligned: bool, limit: int | None, out: list, split_family: str,
                 share: int, always: bool = False, alone: int | None = None) -> list[Entry]:
    """``out`` (a family's candidates) plus -- for a problem of ``split_family``, one whose grid fills fewer than
    :data:`SPLIT_BELOW_WAVES` waves of the device, or ``always`` -- that split-KV family's, ranked by the cost model
    (pipelined before single-stage loads, but for the fp32 forward; unpadded before padded) and cut to
    ``FMHA_DSL_TUNE_CANDIDATES``, keeping ``n // share`` split kernels in the cut (the timing decides between the
    kinds); without split kernels, cut to ``alone`` where given."""
    from .costmodel import compute_units, cost, fma_products
    from .rules.triton_fwd import stages

    sq = max(problem.max_seqlen_q or problem.seqlen_q, 1)
    # fp32 on the FMA units (the forward; the serving families were not measured): single-stage loads are not put
    # behind the pipelined ones, fp32 d64's best was one (H200, bench/probe_flag_cut.py)
    fma = fma_products(problem.dtype, arch) and split_family == "fwd_splitkv"
    cus = compute_units(arch)
    few = min((_programs(e, problem, sq) for e in out), default=0)
    splits = always or problem.family == split_family or few < SPLIT_BELOW_WAVES * cus
    if splits:
        out = out + [_entry(b, fr, arch, aligned) for b, fr in _bindings(problem, arch, split_family, aligned)]

    def rank(e):
        one = stages({"arch": arch, "pipeline": e.alg["pipeline"]}) <= 1 and not fma
        return (one, cost(e, problem, arch, cus)[0], -_unpadded(e), e.identifier)

    ranked = sorted(out, key=rank)
    if limit is not None:
        n = limit
    elif alone is not None and not splits:
        n = alone
    else:
        n = knobs.tune_candidates()
    if len(ranked) > n and n >= share:  # keep both kinds in the cut when there are split kernels
        base = [e for e in ranked if e.sig["family"] != split_family]
        spl = [e for e in ranked if e.sig["family"] == split_family]
        if spl and base:
            ns = min(len(spl), max(n // share, 1))
            ranked = sorted(base[:n - ns] + spl[:ns], key=rank)
    return ranked[:n]


def _half_cut() -> int:
    """The candidates first use times where the cost model's ranking was fitted to measurements (the backward; the
    forward on wgmma targets): half of ``FMHA_DSL_TUNE_CANDIDATES``."""
    return max(1, knobs.tune_candidates() // 2)


def _programs(e: Entry, problem, sq: int) -> int:
    """Programs of ``e``'s grid for ``problem`` (a GQA-packed pipeline runs one per K/V head: a decode step of a GQA
    model fills the device with fewer programs than its query heads suggest)."""
    from .costmodel import programs
    from .kernels.fwd_abi import packs_gqa

    g = max(1, problem.nhead_q // max(problem.nhead_k, 1)) if packs_gqa(e.alg["pipeline"]) else 1
    return programs(sq * g, e.alg["tile"][0], problem.nhead_q // g, problem.batch)


def _same_kernel(e: Entry) -> tuple:
    a = e.alg
    return (e.sig["family"], tuple(a["tile"]), tuple(a["wave"]), a["pipeline"], a["max_splits_log2"])


def _unpadded(e: Entry) -> int:
    return int(not e.alg["pad_s"]) + int(not e.alg["pad_sk"])


def _name_of(e: Entry) -> str:
    """The CK-style instance name of a stored decision's key."""
    from .rules import family_rules
    from .rules.base import FACTORY, Tile

    a, s = e.alg, e.sig
    b = dict(s, **{k: v for k, v in a.items() if k != "tile"}, arch=e.arch, factory=FACTORY[e.arch],
             hdim=(s["hdim_q"], s["hdim_v"]),
             tile=Tile(tuple(a["tile"]), tuple(a["wave"]), tuple(a["warp"]), a["block_per_cu"], a["max_seq_len_q"]))
    name = family_rules(s["family"], "triton").ck_name(b)
    return name + "_unaligned" if a.get("constraint") == "unaligned" else name


__all__ = ["Builder"]
