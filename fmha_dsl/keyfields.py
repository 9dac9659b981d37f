"""A kernel's key as plain field dicts, the Pydantic key built on first use: the base of
:class:`fmha_dsl.expand.Kernel` and :class:`fmha_dsl.registry.Entry`.

It sits above :mod:`fmha_dsl.keys` (which it imports when a model is first asked for) so that ``keys`` can use
:mod:`fmha_dsl.fields` without a cycle; expansion and registry writing never import Pydantic models through it.
"""

from __future__ import annotations

from .fields import identifier_from, trusted


class KeyFields:
    """A kernel's key as plain field dicts, with the Pydantic :class:`KernelKey` built on first use.

    Expansion produces tens of thousands of these; most are only counted, named and written to
    JSON, which needs no model objects.  ``sig``/``alg`` are kept in sorted key order.
    """

    __slots__ = ("sig", "alg", "arch", "_key", "_ident")

    def __init__(self, sig: dict, alg: dict, arch: str, key=None, ident: str | None = None):
        self.sig, self.alg, self.arch, self._key, self._ident = sig, alg, arch, key, ident

    @property
    def key(self):
        """The :class:`fmha_dsl.keys.KernelKey` (built on first use, without re-validation)."""
        if self._key is None:
            from .keys import Algorithm, KernelKey, Signature

            self._key = trusted(KernelKey, {"signature": trusted(Signature, self.sig),
                                            "algorithm": trusted(Algorithm, self.alg), "arch": self.arch})
        return self._key

    @property
    def identifier(self) -> str:
        if self._ident is None:
            self._ident = identifier_from(self.sig, self.alg, self.arch)
        return self._ident


__all__ = ["KeyFields"]
