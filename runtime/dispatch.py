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

Decisions are cached per problem class: the matching fields, the head dims, and ``seqlen mod L`` where ``L`` is
the lcm of the tile sizes in the registry (so divisibility by every ``m0``/``n0`` is known), a dict lookup on a
small tuple; when the selection ranks (a table, or compiled kernels for the cost model) the key adds the
(seqlen_q, seqlen_k, batch x nhead_q) buckets (:func:`fmha_dsl.seqtune.bucket`: eighth-octaves) and the ranking is
evaluated at the bucket's smallest member, so a decision depends on the bucket only.  No match raises :class:`fmha_dsl.errors.FmhaError` (rule ``dispatch.no-kernel``) naming the
three closest entries, the fields where they differ, and the ``.fmha`` declaration that would add a match.

With ``jit=True`` a miss compiles the one key the problem needs instead (:mod:`fmha_dsl.runtime.jit`;
``FMHA_DSL_NO_BUILD=1`` turns that off).
"""

from __future__ import annotations

import math
import os
import threading
from functools import reduce

from fmha_dsl import seqtune
from fmha_dsl.errors import Diagnostic, FmhaError, UsageError, error
from fmha_dsl.registry import Entry, Registry

from . import abi

# Signature fields compared exactly (CK's fmha_signature_matches), besides mask, head dims and the conditionals
EXACT = ("family", "dtype", "mode", "vlayout", "bias", "lse", "dropout", "logits", "sink", "qscale", "rope",
         "paged_kv", "fp8_static_quant", "skip", "dbias", "store_randval", "deterministic")
PAGED_FAMILIES = ("fwd_pagedkv", "fwd_appendkv", "fwd_splitkv", "fwd_splitkv_combine", "batch_prefill")
ARCH_OF_CAPABILITY = {8: "sm80", 9: "sm90"}
PIPELINE_RANK = {"qr_async": 0, "qr": 1}  # ties: software-pipelined loads first
LAUNCHERS = ("cuda", "triton", "hip", "interpret")


# ---------------------------------------------------------------------------------------------------------
# arch detection and registry loading
# ---------------------------------------------------------------------------------------------------------
def detect_arch(device=None) -> str:
    """The registry arch of a torch device: NVIDIA ``sm80`` (any 8.x) / ``sm90``; AMD ``gfxNNN``."""
    try:
        import torch
    except ImportError:
        raise error("dispatch.no-device", "cannot detect the GPU arch: torch is not installed", None,
                    "pass arch='sm90' (or gfx942, ...) explicitly", cls=UsageError) from None
    if not torch.cuda.is_available():
        raise error("dispatch.no-device", "cannot detect the GPU arch: no GPU is visible to torch", None,
                    "pass arch= explicitly, or run on a machine with a GPU", cls=UsageError)
    dev = torch.cuda.current_device() if device is None else device
    if getattr(torch.version, "hip", None):
        name = str(torch.cuda.get_device_properties(dev).gcnArchName)
        return name.split(":")[0]
    major, minor = torch.cuda.get_device_capability(dev)
    arch = ARCH_OF_CAPABILITY.get(major)
    if arch is None:
        raise error("dispatch.no-arch", f"GPU compute capability {major}.{minor} has no kernels in fmha-dsl "
                    "(it targets sm80 and sm90)", None, "pass arch='sm80' to run sm80 cubins if the device "
                    "can (same major version only)", cls=UsageError)
    return arch


def open_registry(registry) -> tuple[Registry, str | None]:
    """``(Registry, root)`` from a Registry, a build directory or a registry.json path (root: where binaries are)."""
    if isinstance(registry, Registry):
        return registry, (os.path.dirname(registry.path) if getattr(registry, "path", None) else None)
    if registry is None:
        return Registry("jit"), None
    if isinstance(registry, (str, os.PathLike)):
        p = os.fspath(registry)
        if os.path.isdir(p):
            p = os.path.join(p, "registry.json")
        return Registry.load(p), os.path.dirname(os.path.abspath(p))
    raise error("usage.value", f"registry must be a Registry, a build directory or a registry.json path, got "
                f"{type(registry).__name__}", None, "e.g. Dispatcher('build/bench')", cls=UsageError)


# ---------------------------------------------------------------------------------------------------------
# matching
# ---------------------------------------------------------------------------------------------------------
def _pfield(problem, name):
    return getattr(problem, name)


def _max_sq(p) -> int:
    return p.max_seqlen_q or p.seqlen_q


def _max_sk(p) -> int:
    return p.max_seqlen_k or p.seqlen_k


def promised_aligned(build) -> tuple[str, ...]:
    """Argument names a binary was compiled to assume 16-divisible (``tt.divisibility``), from its build."""
    if not build:
        return ()
    return tuple(build.get("aligned") or ())


def mismatches(e: Entry, p, aligned: bool = True) -> list[tuple[str, str]]:
    """Why entry ``e`` cannot serve problem ``p``: ``[(field, explanation), ...]``; empty = it can."""
    s, a = e.sig, e.alg
    out = []
    for f in EXACT:
        kv, pv = s[f], _pfield(p, f)
        if kv != pv:
            out.append((f, f"kernel {_show(kv)}, problem {_show(pv)}"))
    if s["family"] != "fwd_splitkv_combine" and (s["mask"] != "no") != (p.mask != "no"):
        out.append(("mask", f"kernel {_mask_word(s['mask'])}, problem {_mask_word(p.mask)}"))
    for f, pf, pad in (("hdim_q", "hdim_q", "pad_d"), ("hdim_v", "hdim_v", "pad_dv")):
        kv, pv = s[f], _pfield(p, pf)
        if pv > kv:
            out.append((f, f"kernel {kv} < problem {pv}"))
        elif not a[pad] and pv != kv:
            out.append((f, f"kernel {kv} without padding ({pad}=0) needs exactly {kv}, problem {pv}"))
    m0, n0 = a["tile"][0], a["tile"][1]
    if not a["pad_s"] and _max_sq(p) % m0:
        out.append(("pad_s", f"kernel pads no query rows: needs max_seqlen_q % {m0} == 0, problem {_max_sq(p)}"))
    if not a["pad_sk"]:
        if p.mode != "batch":
            out.append(("pad_sk", "kernel pads no key columns: group mode (variable seqlen_k) needs pad_sk"))
        elif _max_sk(p) % n0:
            out.append(("pad_sk", f"kernel pads no key columns: needs seqlen_k % {n0} == 0, problem {_max_sk(p)}"))
    if a["max_seq_len_q"] > 0 and _max_sq(p) > a["max_seq_len_q"]:
        out.append(("max_seq_len_q", f"kernel serves max_seqlen_q <= {a['max_seq_len_q']}, problem {_max_sq(p)}"))
    if a["max_splits_log2"] > 0 and p.num_splits > (1 << a["max_splits_log2"]):
        limit = 1 << a["max_splits_log2"]
        out.append(("max_splits_log2", f"kernel serves <= {limit} splits, problem {p.num_splits}"))
    fam = s["family"]
    if fam == "batch_prefill" or p.family == "batch_prefill":
        for f in ("kv_layout", "kv_lookup"):
            if s[f] != _pfield(p, f):
                out.append((f, f"kernel {s[f]}, problem {_pfield(p, f)}"))
    if fam in PAGED_FAMILIES and s["page_size"] > 1 and s["page_size"] != p.page_size:
        out.append(("page_size", f"kernel {s['page_size']}, problem {p.page_size}"))
    if not aligned and promised_aligned(e.build):
        out.append(("aligned", "kernel assumes 16-divisible pointers and strides; these arguments are not"))
    return out


def _show(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _mask_word(m: str) -> str:
    return "no mask" if m == "no" else f"masked ({m})"


def preference(e: Entry) -> tuple:
    """Sort key among matching entries: smaller is preferred (see the module docstring)."""
    a, s = e.alg, e.sig
    padded = sum(1 for f in ("pad_s", "pad_sk", "pad_d", "pad_dv") if a[f])
    return (s["hdim_q"], s["hdim_v"], padded, a["selection_rank"], -a["tile"][0], -a["tile"][1],
            PIPELINE_RANK.get(a["pipeline"], len(PIPELINE_RANK)), e.identifier)


def _exact_key(sig_or_problem, getter) -> tuple:
    return tuple(getter(sig_or_problem, f) for f in EXACT) + ((getter(sig_or_problem, "mask") != "no"),)


def _lcm(values) -> int:
    return reduce(lambda x, y: x * y // math.gcd(x, y), values, 1)


# ---------------------------------------------------------------------------------------------------------
# the no-match error
# ---------------------------------------------------------------------------------------------------------
def declaration_for(p, arch: str, name: str = "extra") -> str:
    """``.fmha`` text declaring a Triton kernel that serves problem ``p`` on ``arch`` (padded, any seqlen)."""
    mask = "top_left" if p.mask != "no" else "no"
    label = f"fwd_{p.dtype}_d{p.hdim_q}x{p.hdim_v}_{p.mode}" + ("_causal" if mask != "no" else "")
    sig = (f"family({p.family}) dtype({p.dtype}) mode({p.mode}) vlayout({p.vlayout}) hdim({p.hdim_q}, {p.hdim_v}) "
           f"mask({mask}) bias({p.bias}) lse({_show(p.lse)}) dropout({_show(p.dropout)}) "
           f"logits({_show(p.logits)}) sink({_show(p.sink)})")
    return (f"kernel_set {name} {{\n"
            f"    backend(triton)\n"
            f"    arch({arch})\n"
            f"    kernel {label} {{\n"
            f"        signature {{ {sig} }}\n"
            f"        algorithm {{ pipeline(*) tile(*) padding(true, true, true, true) }}\n"
            f"    }}\n"
            f"}}\n")


def describe(p) -> str:
    """One line naming a problem's class."""
    extras = [f for f in ("lse", "dropout", "logits", "sink") if _pfield(p, f)]
    bias = "" if p.bias == "no" else f" bias={p.bias}"
    return (f"{p.family} {p.dtype} {p.mode} Dq={p.hdim_q} Dv={p.hdim_v} vlayout={p.vlayout} mask={p.mask}{bias}"
            f" max_seqlen_q={_max_sq(p)} seqlen_k={_max_sk(p)}" + (" " + " ".join(extras) if extras else ""))


def no_kernel_error(p, arch: str, entries, reg_name: str, all_archs=(), aligned: bool = True) -> FmhaError:
    entries = list(entries)
    notes = []
    if not entries:
        have = ", ".join(all_archs) or "none"
        notes.append(f"registry `{reg_name}` has no kernels for {arch} (it has: {have})")
    scored = []
    for e in entries:
        mm = mismatches(e, p, aligned)
        hd = abs(e.sig["hdim_q"] - p.hdim_q) + abs(e.sig["hdim_v"] - p.hdim_v)
        scored.append((len(mm), hd, e.name, e, mm))
    scored.sort(key=lambda t: t[:3])
    for _, _, _, e, mm in scored[:3]:
        diffs = "; ".join(f"{f} ({why})" for f, why in mm)
        where = f" [{e.source}]" if e.source else ""
        notes.append(f"closest: {e.name}{where}: differs in {diffs}")
    decl = declaration_for(p, arch)
    hint = ("add this declaration to a .fmha file and rebuild (`fmha-dsl build FILE --backend triton "
            f"--arch {arch} -o DIR`), or call with registry=None to compile it on first use:\n{decl}")
    return FmhaError(Diagnostic("dispatch.no-kernel", f"no kernel in registry `{reg_name}` for {arch} serves "
                                f"{describe(p)}", None, hint, tuple(notes)))


# ---------------------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------------------
class Stage:
    """One kernel launch of a plan: the registry entry and its loaded binary per device."""

    __slots__ = ("family", "entry", "kernel_id", "_dispatcher", "_kernels")

    def __init__(self, entry: Entry, dispatcher: "Dispatcher"):
        self.family = entry.sig["family"]
        self.entry = entry
        self.kernel_id = entry.identifier
        self._dispatcher = dispatcher
        self._kernels: dict[int, object] = {}

    def kernel(self, device: int):
        k = self._kernels.get(device)
        if k is None:
            k = self._dispatcher.load(self.entry, device)
            self._kernels[device] = k
        return k

    def __repr__(self) -> str:
        return f"Stage({self.family}, {self.entry.name})"


_I64 = 1 << 63
_U64 = (1 << 64) - 1


def fwd_args(ptrs, group, qs, ks, vs, os_, ls, bs, as_, nhq, nhk, dq, dv, sq, sk, msq, msk, scale, softcap,
             dropout_p, seed, offset, wl, wr, br, sink) -> list:
    """The forward kernel's run-time arguments in ABI order (:data:`fmha_dsl.runtime.abi.FWD_ARGS`).

    ``ptrs``: the 9 pointer values (Q, K, V, Out, Lse, Bias, Alibi, cu_seqlens_q, cu_seqlens_k).  ``qs``, ``ks``,
    ``vs``, ``os_``: the tensors' own strides (batch ``[B, H, S, D]``, group ``[T, H, D]``); ``ls``: LSE strides
    (``[B, Hq, Sq]`` / ``[Hq, Tq]``, or None); ``bs``: bias strides over ``[B, Hq, Sq, Sk]`` with 0 for broadcast
    dims (or None); ``as_``: ALiBi strides over ``[B, Hq]`` (or None).  ``sq``/``sk``: batch-mode lengths (0 in
    group mode); ``msq``/``msk``: the maximum lengths.  ``scale`` None = ``1/sqrt(dq)``; ``softcap`` None = off.
    """
    if group:
        qs = (0, qs[1], qs[0], qs[2])
        ks = (0, ks[1], ks[0], ks[2])
        vs = (0, vs[1], vs[0], vs[2])
        os_ = (0, os_[1], os_[0], os_[2])
        ls = (0, 0, 1) if ls is None else (0, ls[0], ls[1])
    elif ls is None:
        ls = (0, 0, 1)
    if dropout_p:
        seed = int(seed) & _U64
        if seed >= _I64:
            seed -= 1 << 64
    else:
        seed = 0
    return [*ptrs, 1.0 / math.sqrt(dq) if scale is None else float(scale), 0.0 if softcap is None else float(softcap),
            float(dropout_p or 0.0), seed, int(offset), sq, sk, msq, msk, nhq, nhk, dq, dv, wl, wr, br, sink,
            *qs, *ks, *vs, *os_, *ls, *((0, 0, 0, 1) if bs is None else bs), *((0, 1) if as_ is None else as_)]


def bias_strides(bias) -> tuple:
    sh, st = bias.shape, bias.stride()
    return tuple(0 if sh[i] == 1 else st[i] for i in range(4))


def alibi_strides(slopes) -> tuple:
    st = slopes.stride()
    return (0, st[0]) if len(st) == 1 else (st[0], st[1])


class Plan:
    """An execution plan: the stages that compute a problem class (forward: one stage).

    :meth:`run` launches it on torch tensors (any strides; the head dim, and for V the head dim or the key
    axis, must have stride 1).  Arguments must describe a problem of the class the plan was made for; the
    dispatcher (or :func:`fmha_dsl.attention`) checks that, this method does not.
    """

    __slots__ = ("api_family", "stages", "problem", "entry", "_stage", "_kernels", "block_m", "_group", "_lse",
                 "_aligned_idx")

    def __init__(self, problem, stages):
        self.api_family = problem.family
        self.problem = problem
        self.stages = tuple(stages)
        self._stage = self.stages[0]
        self._kernels = self._stage._kernels
        self.entry = self._stage.entry
        build = self.entry.build or {}
        self.block_m = int(build.get("block_m") or self.entry.alg["tile"][0])
        self._group = self.entry.sig["mode"] == "group"
        self._lse = bool(self.entry.sig["lse"])
        names = abi.FWD_NAMES
        self._aligned_idx = tuple(names.index(n) for n in promised_aligned(build) if n in names)

    @property
    def kernel_id(self) -> str:
        return self._stage.kernel_id

    def is_valid(self) -> bool:
        return bool(self.stages)

    def __repr__(self) -> str:
        return f"Plan({self.api_family}: {', '.join(s.entry.name for s in self.stages)})"

    def args(self, q, k, v, out, lse=None, *, bias=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=None, max_seqlen_k=None, scale=None, softcap=None, dropout_p=0.0, seed=0, offset=0,
             window=None, bottom_right=True, sink=0, ptr=None):
        """``(batch, nhead_q, max_seqlen_q, args)``: what :meth:`launch` takes, from tensors.

        ``ptr(x)`` turns a tensor (or None) into a pointer value (default ``x.data_ptr()``, None -> 0).
        """
        group = self._group
        if group:
            nhq, dq = q.shape[1], q.shape[2]
            nhk, dv = k.shape[1], v.shape[2]
            batch = cu_seqlens_q.shape[0] - 1
            msq, msk = int(max_seqlen_q), int(max_seqlen_k)
            sq = sk = 0
        else:
            batch, nhq, sq, dq = q.shape
            nhk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
            msq, msk = sq, sk
        tensors = (q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
        if ptr is None:
            ptrs = [0 if x is None else x.data_ptr() for x in tensors]
        else:
            ptrs = [ptr(x) for x in tensors]
        wl, wr = (-1, -1) if window is None else window
        args = fwd_args(ptrs, group, q.stride(), k.stride(), v.stride(), out.stride(),
                        None if lse is None else lse.stride(), None if bias is None else bias_strides(bias),
                        None if alibi_slopes is None else alibi_strides(alibi_slopes), nhq, nhk, dq, dv, sq, sk, msq,
                        msk, scale, softcap, dropout_p, seed, offset, wl, wr, int(bool(bottom_right)), int(sink))
        return batch, nhq, msq, args

    def launch(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, stream=None) -> None:
        """Launch on ``device`` (torch's current stream there, or ``stream``: int handle or torch stream)."""
        gx = (max_seqlen_q + self.block_m - 1) // self.block_m
        if not (gx and nhead_q and batch):
            return
        kern = self._kernels.get(device)
        if kern is None:
            kern = self._stage.kernel(device)
        if self._aligned_idx:
            for i in self._aligned_idx:
                if args[i] & 15:
                    raise error("dispatch.alignment", f"kernel {self.entry.name} assumes 16-divisible "
                                f"{abi.FWD_NAMES[i]}, got {args[i]}", None,
                                "plan with Dispatcher.plan(problem, aligned=False) for unaligned arguments",
                                cls=UsageError)
        if stream is None:
            stream = current_stream(device) if device >= 0 else 0
        elif not isinstance(stream, int):
            stream = _stream_handle(stream)
        kern.launch((gx, nhead_q, batch), args, stream)

    def run(self, q, k, v, out, lse=None, *, stream=None, **kw):
        """Compute ``out`` (and ``lse``) for tensors of this plan's problem class.  Keywords as :meth:`args`."""
        if self._lse and lse is None:
            raise error("usage.value", f"kernel {self.entry.name} stores the LSE: pass an lse tensor", None,
                        "[B, Hq, Sq] (batch) or [Hq, Tq] (group) float32", cls=UsageError)
        device = q.get_device()
        kern = self._kernels.get(device) or self._stage.kernel(device)
        batch, nhq, msq, args = self.args(q, k, v, out, lse, ptr=(lambda x: x) if kern.needs_objects else None, **kw)
        self.launch(device, batch, nhq, msq, args, stream)
        return out


def _stream_handle(stream) -> int:
    if isinstance(stream, int):
        return stream
    h = getattr(stream, "cuda_stream", None)
    if h is None:
        raise error("usage.value", f"stream must be an int handle or a torch stream, got {type(stream).__name__}",
                    cls=UsageError)
    return int(h)


_RAW_STREAM = []


def current_stream(device: int) -> int:
    """torch's current stream on ``device`` as a raw handle (``torch._C._cuda_getCurrentRawStream``)."""
    if _RAW_STREAM:
        return _RAW_STREAM[0](device)
    import torch

    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fn is None:
        def fn(dev):
            return torch.cuda.current_stream(dev).cuda_stream
    _RAW_STREAM.append(fn)
    return fn(device)


# ---------------------------------------------------------------------------------------------------------
# the dispatcher
# ---------------------------------------------------------------------------------------------------------
def default_launcher(arch: str) -> str:
    if arch.startswith("gfx"):
        return "hip"
    return os.environ.get("FMHA_DSL_LAUNCHER", "cuda") or "cuda"


class Dispatcher:
    """Selects, loads and launches registry kernels for one arch.

    ``registry``: a :class:`~fmha_dsl.registry.Registry`, a build directory or a ``registry.json`` path (``None``:
    empty, for ``jit=True``).  ``arch``: the registry arch to serve (default: the current device's).
    ``root``: where the entries' ``build["binary"]`` paths are relative to (default: the registry file's folder).
    ``launcher``: ``"cuda"`` (cuda-python, default on NVIDIA; ``FMHA_DSL_LAUNCHER`` overrides), ``"triton"``
    (Triton's C launcher), ``"hip"`` (AMD) or ``"interpret"`` (the template under ``TRITON_INTERPRET=1`` on CPU
    tensors: tests and debugging).  ``jit``: compile missing kernels on first use.
    """

    def __init__(self, registry=None, arch: str | None = None, *, root: str | None = None,
                 launcher: str | None = None, jit: bool = False, device_name: str | None = None):
        reg, found_root = open_registry(registry)
        if jit and registry is not None:  # compiled kernels are added here, not to the caller's registry
            seq = reg.seqtune
            reg = Registry(reg.name, iter(reg), reg.profiles, reg.sources)
            reg.seqtune = seq
        self.registry = reg
        self.root = root if root is not None else found_root
        self.arch = arch or detect_arch()
        self.launcher = launcher or default_launcher(self.arch)
        if self.launcher not in LAUNCHERS:
            raise error("usage.value", f"unknown launcher {self.launcher!r}", None,
                        f"one of: {', '.join(LAUNCHERS)} (FMHA_DSL_LAUNCHER sets the default)", cls=UsageError)
        self.jit = bool(jit)
        self._lock = threading.RLock()
        self._binaries: dict[str, bytes] = {}
        self._stages: dict[str, Stage] = {}
        # the seqtune table, when measured on this arch and device (else a SeqtuneDeviceWarning, and None)
        self.table_note: str | None = None
        table = seqtune.Table.of(self.registry)
        if table is not None:
            if device_name is None:
                device_name = _device_name()
            self.table_note = seqtune.device_mismatch(table, self.arch, device_name)
            table = seqtune.usable(table, self.arch, device_name)
        self.table = table
        self.compute_units = seqtune.compute_units(self.arch, table)
        self._reindex()

    # -- index ------------------------------------------------------------------------------------------
    def _reindex(self) -> None:
        self.entries = [e for e in self.registry if e.arch == self.arch]
        groups: dict[tuple, list[Entry]] = {}
        for e in self.entries:
            groups.setdefault(_exact_key(e.sig, dict.__getitem__), []).append(e)
        self._groups = groups
        tiles = [e.alg["tile"] for e in self.entries] or [(1, 1)]
        self.lq = _lcm({t[0] for t in tiles})
        self.lk = _lcm({t[1] for t in tiles})
        self.sq_bounds = sorted({e.alg["max_seq_len_q"] for e in self.entries if e.alg["max_seq_len_q"] > 0})
        self._plans: dict[tuple, Plan] = {}
        self._plan_of: dict[str, Plan] = {}  # one Plan per selected kernel
        self.fast: dict[tuple, Plan] = {}  # attention()'s own problem-class keys
        # the selection depends on seqlen / batch x heads (table or cost model): the class key adds buckets
        self.ranking = getattr(self, "table", None) is not None or any(e.build for e in self.entries)

    def add(self, entry: Entry, binary: bytes | None = None) -> None:
        """Add a kernel (and its binary bytes) to this dispatcher's registry; cached decisions are redone."""
        with self._lock:
            self.registry.add(entry)
            if binary is not None:
                self._binaries[entry.identifier] = binary
            self._reindex()

    # -- selection --------------------------------------------------------------------------------------
    def class_key(self, p, aligned: bool = True) -> tuple:
        """The problem class: everything :meth:`select` looks at, reduced so equal keys select equally."""
        sq, sk = _max_sq(p), _max_sk(p)
        key = (_exact_key(p, getattr), p.hdim_q, p.hdim_v, sq % self.lq, sk % self.lk, aligned,
               p.kv_layout, p.kv_lookup, p.page_size, p.num_splits)
        if self.sq_bounds:
            key += (sum(1 for b in self.sq_bounds if sq > b),)
        if self.ranking:
            key += self.bucket_key(sq, sk, p.batch * p.nhead_q)
        return key

    @staticmethod
    def bucket_key(sq: int, sk: int, bh: int) -> tuple:
        """The (seqlen_q, seqlen_k, batch x nhead_q) buckets a ranked decision is cached under."""
        b = seqtune.bucket
        return (b(sq), b(sk), b(bh))

    def _representative(self, p):
        """The problem the ranking of ``p``'s bucket is evaluated at (the bucket's smallest lengths)."""
        r = seqtune.bucket_rep
        sq, sk = _max_sq(p), _max_sk(p)
        rq, rk = r(seqtune.bucket(sq)), r(seqtune.bucket(sk))
        bh = p.batch * p.nhead_q
        rbh = r(seqtune.bucket(bh))
        upd = {"seqlen_q": rq, "seqlen_k": rk, "max_seqlen_q": rq if p.max_seqlen_q else 0,
               "max_seqlen_k": rk if p.max_seqlen_k else 0}
        if rbh != bh:  # keep nhead_q (it fixes the class); batch takes the rest, rounded up
            upd["batch"] = max(1, -(-rbh // p.nhead_q))
        return p.model_copy(update=upd)

    def ranked(self, p, aligned: bool = True, candidates=None) -> list[dict]:
        """The candidates of ``p`` ranked fastest first (:func:`fmha_dsl.seqtune.rank`): rows with ``entry``,
        ``source`` and the prediction."""
        c = self.candidates(p, aligned) if candidates is None else candidates
        return seqtune.rank(p, c, self.table, self.arch, self.compute_units)

    def explain(self, problem, aligned: bool = True) -> list[dict]:
        """Every kernel of this arch for ``problem``: the candidates ranked (``rank`` 0 is what :meth:`select`
        chooses for this problem's bucket), with predicted and measured times, then each excluded kernel and why."""
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
        return rows

    def candidates(self, p, aligned: bool = True) -> list[Entry]:
        """Every entry of this arch that serves ``p``, most preferred first."""
        group = self._groups.get(_exact_key(p, getattr), ())
        return sorted((e for e in group if not mismatches(e, p, aligned)), key=preference)

    def _best(self, p, c: list, aligned: bool):
        if len(c) > 1 and self.ranking:
            r = self.ranked(self._representative(p), aligned, c)
            if r:
                return r[0]["entry"]
        return c[0] if c else None

    def select(self, p, aligned: bool = True) -> Entry:
        c = self.candidates(p, aligned)
        if c:
            return self._best(p, c, aligned)
        if self.jit and os.environ.get("FMHA_DSL_NO_BUILD", "") not in ("1", "true", "yes"):
            from . import jit

            with self._lock:
                c = self.candidates(p, aligned)
                if c:
                    return self._best(p, c, aligned)
                entry, binary = jit.compile_for(p, self.arch)
                self.add(entry, binary)
                c = self.candidates(p, aligned)
                if c:
                    return self._best(p, c, aligned)
        raise no_kernel_error(p, self.arch, self.entries, self.registry.name, self.registry.archs, aligned)

    def plan(self, problem, aligned: bool = True) -> Plan:
        """The execution plan for ``problem`` (a :class:`fmha_dsl.keys.Problem`); cached per problem class."""
        if problem.arch is not None and problem.arch != self.arch:
            raise error("dispatch.arch", f"problem is for {problem.arch}, this dispatcher serves {self.arch}",
                        None, "make a Dispatcher for that arch", cls=UsageError)
        key = self.class_key(problem, aligned)
        plan = self._plans.get(key)
        if plan is None:
            entry = self.select(problem, aligned)
            key = self.class_key(problem, aligned)  # a JIT compile may have changed the tile lcm
            plan = self._plan_of.get(entry.identifier)
            if plan is None:
                plan = self._plan_of[entry.identifier] = Plan(problem, [self.stage(entry)])
            self._plans[key] = plan
        return plan

    def stage(self, entry: Entry) -> Stage:
        st = self._stages.get(entry.identifier)
        if st is None:
            st = self._stages[entry.identifier] = Stage(entry, self)
        return st

    # -- loading ----------------------------------------------------------------------------------------
    def binary(self, entry: Entry) -> bytes:
        data = self._binaries.get(entry.identifier)
        if data is not None:
            return data
        b = entry.build
        if not b or not b.get("binary"):
            raise error("dispatch.no-binary", f"kernel {entry.name} has no compiled binary in this registry", None,
                        "build the set with `fmha-dsl build FILE --backend triton -o DIR` and pass DIR")
        path = b["binary"]
        if not os.path.isabs(path):
            if self.root is None:
                raise error("dispatch.no-binary", f"kernel {entry.name}: the binary path `{path}` is relative and "
                            "this dispatcher has no root", None,
                            "pass the build directory (or root=DIR) instead of a Registry object", cls=UsageError)
            path = os.path.join(self.root, path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise error("dispatch.no-binary", f"kernel {entry.name}: cannot read `{path}`: {exc.strerror}", None,
                        "rebuild the registry; the binary is missing") from None
        want = b.get("sha256")
        if want:
            import hashlib

            if hashlib.sha256(data).hexdigest() != want:
                raise error("dispatch.binary-hash", f"kernel {entry.name}: `{path}` does not match the sha256 in "
                            "the registry", None, "the build directory was modified: rebuild it")
        self._binaries[entry.identifier] = data
        return data

    def load(self, entry: Entry, device: int):
        """The launchable kernel of ``entry`` on ``device`` (loaded once per stage and device)."""
        b = entry.build or {}
        if self.launcher == "interpret":
            from .interpret import InterpretKernel

            return InterpretKernel(entry)
        why = abi.check_params(b.get("params"))
        if why:
            raise error("runtime.abi", f"kernel {entry.name}: {why}", None,
                        "the registry was built from another template version: rebuild it")
        data = self.binary(entry)
        types = abi.fwd_types(entry.sig["dtype"])
        scratch = (int(b.get("global_scratch") or 0), int(b.get("profile_scratch") or 0))
        num_warps = int(b.get("num_warps") or entry.alg["wave"][0])
        if self.launcher == "hip":
            from .hip import load_hsaco

            return load_hsaco(data, entry=b["entry"], shared=int(b.get("shared", 0)), num_warps=num_warps,
                              device=device, types=types, warp_size=int(b.get("warp_size") or 64), scratch=scratch)
        from .cuda import load_cubin

        return load_cubin(data, entry=b["entry"], shared=int(b.get("shared", 0)), num_warps=num_warps,
                          device=device, types=types, warp_size=int(b.get("warp_size") or 32),
                          launcher=self.launcher, scratch=scratch, alloc=_torch_alloc, names=abi.FWD_NAMES)


def _device_name() -> str | None:
    """The current GPU's name when torch sees one (compared with a seqtune table's), else None."""
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
    except Exception:  # noqa: BLE001  (no device: only the arch is compared)
        return None
    return None


def _torch_alloc(nbytes: int, device: int):
    import torch

    return torch.empty(int(nbytes), dtype=torch.uint8, device=f"cuda:{device}")


__all__ = ["Dispatcher", "Plan", "Stage", "detect_arch", "open_registry", "mismatches", "preference",
           "declaration_for", "no_kernel_error", "current_stream", "EXACT"]
