"""[select] The keys a dispatcher caches its decisions under: a problem's class (:meth:`ClassKeys.class_key`) and
what of its lengths and window a decision depends on (:meth:`~ClassKeys.seq_key`, :meth:`~ClassKeys.window_key`,
with :meth:`~ClassKeys.seq_span` the key lengths sharing one) -- a dict lookup on a small tuple.

* A registry's dispatcher: the matching fields, the head dims, and ``seqlen mod L`` where ``L`` is the lcm of the
  tile sizes in the registry (so divisibility by every ``m0``/``n0`` is known); when the selection ranks (a table,
  or compiled kernels for the cost model) the key adds the (seqlen_q, seqlen_k, batch x nhead_q) buckets
  (:func:`fmha_dsl.seqtune.bucket`: eighth-octaves) and the ranking is evaluated at the bucket's smallest member
  (:meth:`~ClassKeys._representative`), so a decision depends on the bucket only.
* A compiling dispatcher: its decision keys' parts (:mod:`fmha_dsl.runtime.decisions`): the octaves of the lengths
  and of batch x heads, the GQA group's, a sliding window's where it is below the key length's.

A mixin of :class:`fmha_dsl.runtime.dispatch.Dispatcher`: it reads the dispatcher's ``builder``, ``lq``/``lk`` (the
tiles' lcm), ``sq_bounds`` and ``ranking``.
"""

from __future__ import annotations

from fmha_dsl import seqtune
from fmha_dsl.kernels.fwd_abi import SEQ_ALIGN

from . import decisions
from .match import _exact_key, _max_sk, _max_sq
from .plan import _I32_MAX


class ClassKeys:
    """What a cached decision is keyed by (see the module docstring)."""

    def class_key(self, p, aligned: bool = True) -> tuple:
        """The problem class: everything :meth:`select` looks at, reduced so equal keys select equally."""
        gqa = decisions.gqa_octave(p.nhead_q, p.nhead_k) if self.builder is not None else 0  # packed candidates
        return ((_exact_key(p, getattr), p.hdim_q, p.hdim_v, aligned, p.kv_layout, p.kv_lookup, p.page_size,
                 p.num_splits, gqa, self._window_of(p, _max_sk(p))) + self.seq_key(_max_sq(p), _max_sk(p),
                                                                                 p.batch * p.nhead_q))

    def seq_key(self, sq: int, sk: int, bh: int) -> tuple:
        """What of the lengths (and batch x heads) a decision depends on: the residues modulo the tiles' lcm,
        the ``max_seq_len_q`` band, and with ranked selection the seqlen / batch x heads buckets (a compiling
        dispatcher: only the octaves of its decision keys, :func:`fmha_dsl.runtime.decisions.buckets`).  Part of
        every cached decision's key (:meth:`class_key`, ``fmha_dsl.attention``'s own keys)."""
        if self.builder is not None:
            return decisions.buckets(sq, sk, bh)
        key = (sq % self.lq, sk % self.lk)
        if self.sq_bounds:
            key += (sum(1 for b in self.sq_bounds if sq > b),)
        if self.ranking:
            key += self.bucket_key(sq, sk, bh)
        return key

    def window_key(self, window_left: int, window_right: int, sk: int) -> int:
        """What of a masked call's window a decision depends on (0: unbounded; part of every cached decision's key
        next to :meth:`seq_key`): a compiling dispatcher's decision keys hold the window's octave where it is below
        the key length's (:func:`fmha_dsl.runtime.decisions.window_octave`, constant over a :meth:`seq_span`);
        ranked selection sees the window through the cost model, its keys hold the window's octave."""
        return decisions.window_octave(window_left, window_right, sk if self.builder is not None else None)

    def _window_of(self, p, sk: int) -> int:
        """:meth:`window_key` of problem ``p`` (0 without a mask: a window then hides nothing)."""
        return self.window_key(p.window_left, p.window_right, sk) if p.mask != "no" else 0

    def seq_span(self, sq: int, sk: int, bh: int) -> tuple[int, int, int, int, bool]:
        """The key lengths ``n`` that share :meth:`seq_key` ``(sq, n, bh)`` with ``sk > 0``, as ``(lo, hi, mod, res,
        eq)``: every ``n`` in ``[lo, hi]`` with ``(n % mod == res) == eq`` does.  The torch fast path serves a whole
        span from one recipe (a decode loop whose K/V grow by a token per step stays on it)."""
        if self.builder is not None:  # decisions.buckets: the octave, and whether n is a multiple of SEQ_ALIGN
            o = decisions.octave(sk)
            return 1 << (o - 1), (1 << o) - 1, SEQ_ALIGN, 0, sk % SEQ_ALIGN == 0
        lo, hi = 1, _I32_MAX
        if self.ranking:  # seqtune.bucket's range
            b = seqtune.bucket(sk)
            lo, hi = seqtune.bucket_rep(b), seqtune.bucket_rep(b + 1) - 1
        return lo, hi, self.lk, sk % self.lk, True

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
        # batch x heads enters the ranking only as their product (programs, nearest measured point): the
        # representative is one head of batch = the bucket's smallest product, so every problem of the cached
        # bucket is ranked at the same point, whichever of them comes first
        rbh = r(seqtune.bucket(p.batch * p.nhead_q))
        up = {"seqlen_q": rq, "seqlen_k": rk, "max_seqlen_q": rq if p.max_seqlen_q else 0,
              "max_seqlen_k": rk if p.max_seqlen_k else 0, "batch": rbh, "nhead_q": 1, "nhead_k": 1}
        w = self._window_of(p, sk)
        if w:  # a window's octave (window_key) by its smallest span: every window of the octave ranked alike
            span = 1 << (w - 1)
            right = min(p.window_right, span - 1)
            up.update(window_left=span - 1 - right, window_right=right)
        return p.model_copy(update=up)


__all__ = ["ClassKeys"]
