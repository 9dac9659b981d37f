"""What `fmha-dsl tune` (:mod:`fmha_dsl.runtime.tune`) runs each family's kernels on, and the truth it checks them
against: one call object per shape-matrix point (made with :func:`call_for`), with

* ``runner(plan)``: the function that is timed (one run of the whole plan: a split-KV kernel with its combine, the
  backward's three stages);
* ``error()``: the relative error (:func:`relative_error`) of the last run's output against an independent truth,
  computed once per point.

Forward (:class:`ForwardCall`): random q, k, v ``[B, H, S, D]``, checked against torch SDPA.  Backward
(:class:`BackwardCall`): the forward's out and LSE in torch arithmetic, gradients checked against SDPA's autograd.
Serving (:class:`PagedCall`): ``fmha_dsl.paged_attention``'s arguments over a paged cache whose pages lie scattered at
random, checked against SDPA on each sequence's K/V gathered from the cache by torch indexing.
"""

from __future__ import annotations

import math

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8bf16": "float8_e4m3fn"}
SERVING = ("batch_prefill",)   # the families of serving classes: paged_attention's problem (class_key adds the cache)


def _dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def make_inputs(cls: dict, pt, seed: int = 0):
    """Random q, k, v (fixed seed), an output, the LSE buffer the class needs, and the causal run-time
    arguments, for one measured point ``(seqlen_q, seqlen_k, batch, nhead_q, nhead_k)`` on the GPU."""
    import torch

    sq, sk, b, hq, hk = pt
    dt = _dtype(cls["dtype"])
    torch.manual_seed(seed)
    q = torch.randn(b, hq, sq, cls["hdim_q"], device="cuda", dtype=dt)
    k = torch.randn(b, hk, sk, cls["hdim_q"], device="cuda", dtype=dt)
    v = torch.randn(b, hk, sk, cls["hdim_v"], device="cuda", dtype=dt)
    out = q.new_empty(b, hq, sq, cls["hdim_v"])
    lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32) if cls["lse"] else None
    kw = {"window": (-1, 0), "bottom_right": False} if cls["mask"] == "causal" else {}
    return q, k, v, out, lse, kw


def sdpa_reference(q, k, v, cls: dict, pt):
    """torch SDPA's output for one shape-matrix point, in fp32 (what every timed kernel is checked against)."""
    import torch.nn.functional as F

    hq, hk = pt[3], pt[4]
    return F.scaled_dot_product_attention(q, k, v, is_causal=cls["mask"] == "causal", enable_gqa=hq != hk).float()


def relative_error(out, ref) -> float:
    """``|out - ref| / |ref|`` (Frobenius), NaN-propagating; 0/0 counts as 0."""
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class ForwardCall:
    """One shape-matrix point of a forward class: :func:`make_inputs`, checked against :func:`sdpa_reference`."""

    def __init__(self, cls: dict, pt):
        self.cls, self.pt = cls, pt
        self.q, self.k, self.v, self.out, self.lse, self.kw = make_inputs(cls, pt)
        self._ref = None

    def runner(self, plan):
        def run():
            plan.run(self.q, self.k, self.v, self.out, self.lse, **self.kw)
        return run

    def error(self) -> float:
        if self._ref is None:
            self._ref = sdpa_reference(self.q, self.k, self.v, self.cls, self.pt)
        return relative_error(self.out, self._ref)


class BackwardCall:
    """One shape-matrix point of a backward class: inputs, the forward's out and LSE (torch arithmetic), gradient
    buffers, and SDPA's gradients as the check (computed on first use)."""

    def __init__(self, cls: dict, pt):
        import torch

        self.q, self.k, self.v, _, _, _ = make_inputs(cls, pt)
        self.cls, self.pt = cls, pt
        self.causal = cls["mask"] == "causal"
        self.out, self.lse = _forward(self.q, self.k, self.v, self.causal)
        self.dout = torch.randn_like(self.out)
        self.grads = (torch.empty_like(self.q), torch.empty_like(self.k), torch.empty_like(self.v))
        self.kw = {"window": (-1, 0), "bottom_right": False} if self.causal else {}

    def runner(self, plan):
        args = (self.q, self.k, self.v, self.out, self.lse, self.dout) + self.grads

        def run():
            plan.run(*args, **self.kw)
        return run

    def error(self) -> float:
        """The largest relative error of dQ, dK, dV against SDPA's autograd (fp32)."""
        import torch

        q, k, v = (x.detach().float().requires_grad_() for x in (self.q, self.k, self.v))
        ref = sdpa_reference(q, k, v, self.cls, self.pt)
        want = torch.autograd.grad(ref, (q, k, v), self.dout.float())
        return max(relative_error(g, w) for g, w in zip(self.grads, want))


def _forward(q, k, v, causal: bool, heads_per_step: int = 4):
    """``(out, lse)`` of the forward in fp32 torch arithmetic (top-left causal or none), a few heads at a time: what a
    backward kernel's arguments need, without a forward kernel in the registry being tuned."""
    import torch

    b, hq, sq, d = q.shape
    g = hq // k.shape[1]
    out = torch.empty(b, hq, sq, v.shape[-1], device=q.device, dtype=q.dtype)
    lse = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32)
    sk = k.shape[2]
    keep = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril() if causal else None
    for bi in range(b):
        for h0 in range(0, hq, heads_per_step):
            hs = slice(h0, min(hq, h0 + heads_per_step))
            kv = [x[bi].repeat_interleave(g, 0)[hs].float() for x in (k, v)]
            s = q[bi, hs].float() @ kv[0].transpose(-1, -2) / math.sqrt(d)
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            m = torch.logsumexp(s, -1)
            lse[bi, hs] = m
            out[bi, hs] = (torch.exp(s - m[..., None]) @ kv[1]).to(q.dtype)
    return out, lse


# ---------------------------------------------------------------------------------------------------------
# serving: paged_attention's arguments
# ---------------------------------------------------------------------------------------------------------
def promise_kept(cls: dict, pt) -> bool:
    """Whether a point's arguments keep the 16-divisibility promise of aligned builds (what ``paged_attention`` checks
    per call): a serving point's strides are products of its head dims (fresh allocations, contiguous pages), so
    head dims that are multiples of 16 and a cache of fewer than 2**31 rows keep it.  Forward and backward points:
    always (as before)."""
    if cls["family"] not in SERVING:
        return True
    sq, sk, b, hq, hk = pt
    rows = (b * -(-sk // cls["page_size"]) + 1) * cls["page_size"]        # PagedCall's cache, its spare page too
    return cls["hdim_q"] % 16 == 0 and cls["hdim_v"] % 16 == 0 and rows < 1 << 31


def serving_caches(layout: str, k_cache, v_cache):
    """The linear caches ``[P, page, Hk, D]`` in ``layout`` (CK's vectorized one: the reference's conversion)."""
    if layout == "linear":
        return k_cache, v_cache
    from fmha_dsl.reference_paged import vectorized_caches

    return vectorized_caches(k_cache, v_cache)


class PagedCall:
    """One point ``(seqlen_q, seqlen_k, batch, nhead_q, nhead_k)`` of a serving class: ``batch`` sequences of
    ``seqlen_k`` cached tokens (the new ones included) and ``seqlen_q`` queries each (group mode, ``q [B x Sq, Hq,
    D]``), over a cache of the class's page size whose pages are a random permutation (one spare page, never read),
    in the class's table form (vLLM's ``block_table`` or SGLang's ``kv_indptr``/``kv_indices``) and layout.  A causal
    class is bottom-right aligned (``paged_attention(causal=True)``).  The truth: SDPA on each sequence's K/V gathered
    from the linear cache through the same table by torch indexing.  ``device``: ``"cpu"`` for a dispatcher that
    launches through Triton's interpreter (tests)."""

    def __init__(self, cls: dict, pt, seed: int = 0, device: str = "cuda"):
        import torch

        sq, sk, b, hq, hk = pt
        self.cls, self.pt = cls, pt
        dt, dev, i32 = _dtype(cls["dtype"]), device, torch.int32
        fp8 = cls["dtype"] == "fp8bf16"   # e4m3 values drawn as bf16 normals, then rounded; descales of 1
        gen = torch.bfloat16 if fp8 else dt
        page = cls["page_size"]
        n = -(-sk // page)                                          # pages per sequence
        torch.manual_seed(seed)
        pages = torch.randperm(b * n + 1, device=dev)[:b * n].view(b, n).to(i32)
        self.k_lin = torch.randn(b * n + 1, page, hk, cls["hdim_q"], device=dev, dtype=gen).to(dt)
        self.v_lin = torch.randn(b * n + 1, page, hk, cls["hdim_v"], device=dev, dtype=gen).to(dt)
        self.k_cache, self.v_cache = serving_caches(cls["kv_layout"], self.k_lin, self.v_lin)
        self.q = torch.randn(b * sq, hq, cls["hdim_q"], device=dev, dtype=gen).to(dt)
        self.out = self.q.new_empty(b * sq, hq, cls["hdim_v"], dtype=torch.bfloat16 if fp8 else dt)
        self.lse = torch.empty(hq, b * sq, device=dev, dtype=torch.float32) if cls["lse"] else None
        if cls["kv_lookup"] == "vllm":
            tables = {"block_table": pages}
        else:
            tables = {"kv_indptr": torch.arange(b + 1, device=dev, dtype=i32) * n, "kv_indices": pages.flatten()}
        self.pages = pages
        self.causal = cls["mask"] == "causal"
        self.kw = dict(tables, seqlens_k=torch.full((b,), sk, device=dev, dtype=i32),
                       cu_seqlens_q=torch.arange(b + 1, device=dev, dtype=i32) * sq, max_seqlen_q=sq, max_seqlen_k=sk,
                       window=(-1, 0) if self.causal else (-1, -1), bottom_right=True)
        if fp8:  # descales of 1 (the truth reads the e4m3 values as they are): per tensor, per (page, K/V head) or
            # per (token, head)
            kind = cls.get("qscale")
            kv = {"kv_blockscale": (b * n + 1, hk), "per_token_head": (b * n + 1, page, hk)}.get(kind, (1,))
            qd = (b * sq, hq) if kind == "per_token_head" else (1,)
            self.kw["descales"] = (torch.ones(qd, device=dev),) + tuple(torch.ones(kv, device=dev) for _ in range(2))
        self._ref = None

    def runner(self, plan):
        """The whole plan's launches (a split-KV plan: the split kernel and its combine) on arguments packed once,
        with a workspace allocated once: what a serving step replays."""
        import torch

        sq, sk, b, hq, hk = self.pt
        n = plan.workspace_numel(batch=b, nhead_q=hq, nhead_k=hk, max_seqlen_q=sq, max_seqlen_k=sk)
        ws = torch.empty(n, device=self.q.device, dtype=torch.float32) if n else None
        dev = self.q.get_device()
        batch, nhq, msq, args = plan.args(self.q, self.k_cache, self.v_cache, self.out, self.lse, objects=dev < 0,
                                          **self.kw)

        def run():
            plan.launch(dev, batch, nhq, msq, args, workspace=ws)
        return run

    def truth(self):
        """SDPA (fp32 output, ``[B, Hq, Sq, Dv]``) on the K/V of each sequence's pages, gathered by torch indexing."""
        import torch
        import torch.nn.functional as F

        sq, sk, b, hq, hk = self.pt
        rows = self.pages.long()
        k, v = (c[rows].flatten(1, 2)[:, :sk].transpose(1, 2).float() for c in (self.k_lin, self.v_lin))
        q = self.q.view(b, sq, hq, -1).transpose(1, 2).float()
        mask = None
        if self.causal and sq != sk:  # bottom-right: query i sees keys j <= i + sk - sq
            mask = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril(sk - sq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and sq == sk,
                                              enable_gqa=hq != hk).float()

    def error(self) -> float:
        if self._ref is None:
            self._ref = self.truth()
        sq, sk, b, hq, hk = self.pt
        return relative_error(self.out.view(b, sq, hq, -1).transpose(1, 2), self._ref)


def call_for(cls: dict, pt):
    """The call object of one point of ``cls``: forward, backward or serving."""
    if cls["family"] in SERVING:
        return PagedCall(cls, pt)
    if cls["family"] == "bwd_dq_dk_dv":
        return BackwardCall(cls, pt)
    return ForwardCall(cls, pt)


__all__ = ["make_inputs", "sdpa_reference", "relative_error", "ForwardCall", "BackwardCall", "PagedCall",
           "call_for", "promise_kept", "serving_caches", "SERVING"]
