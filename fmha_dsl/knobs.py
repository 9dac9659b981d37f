"""Every ``FMHA_DSL_*`` environment variable fmha-dsl reads, declared once: name, type, default, what it does.

    from fmha_dsl import knobs
    knobs.cache_dir()        # str | None: $FMHA_DSL_CACHE_DIR, None when unset or empty
    knobs.no_build()         # bool
    knobs.KNOBS              # every knob (docs/knobs.md is checked against it by tests/test_knobs.py)

Each accessor reads ``os.environ`` when called (nothing happens at import, and a test's ``monkeypatch.setenv``
takes effect at once).  An empty value counts as unset.  Boolean knobs accept ``1 true yes on`` and
``0 false no off`` (any case); another value is a :class:`~fmha_dsl.errors.UsageError` naming the knob.  No other
module reads an ``FMHA_DSL_*`` variable (``tests/test_knobs.py`` greps the source tree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One environment variable: ``kind`` is ``"path"``, ``"bool"``, ``"int"`` (>= 1) or ``"choice"`` (``choices`` lists the values;
    the module that uses the value checks it, so the error names the API argument too)."""

    name: str
    kind: str
    default: object
    doc: str
    choices: tuple[str, ...] = ()
    minimum: int = 1  # an "int" knob's least value

    def raw(self) -> str | None:
        """The variable's text, None when unset or empty."""
        return os.environ.get(self.name) or None

    def get(self):
        """The typed value, read now (the default when unset)."""
        text = self.raw()
        if text is None:
            return self.default
        if self.kind == "int":
            try:
                value = int(text.strip())
            except ValueError:
                value = None  # not a number: refused below, whatever the minimum
            if value is None or value < self.minimum:
                from .errors import UsageError, error

                raise error("usage.env", f"unable to use {self.name}={text}: expected a whole number >= "
                            f"{self.minimum}", None,
                            f"unset it for the default ({self.default or 'the CPU count'})", cls=UsageError)
            return value
        if self.kind == "bool":
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            from .errors import UsageError, error

            raise error("usage.env", f"unable to use {self.name}={text}: expected a boolean", None,
                        f"one of: {', '.join(_TRUE + _FALSE)}", cls=UsageError)
        return text


CACHE_DIR = Knob("FMHA_DSL_CACHE_DIR", "path", None,
                 "fmha-dsl's cache folder: compiled kernels (`kernels/`), the native launcher and torch fast path "
                 "(`native/`), parser tables (`parser/`). Default `$XDG_CACHE_HOME/fmha-dsl`, else "
                 "`~/.cache/fmha-dsl`.")
LAUNCHER = Knob("FMHA_DSL_LAUNCHER", "choice", "auto",
                "The default launcher of a `Dispatcher` on NVIDIA (an explicit `launcher=` wins; AMD always uses "
                "`hip`): `auto` = `native` where the C launcher compiles, else `cuda`.",
                ("auto", "native", "cuda", "triton", "hip", "interpret"))
NO_BUILD = Knob("FMHA_DSL_NO_BUILD", "bool", False,
                "Never compile on first use: a kernel missing from the registry and the cache is an error "
                "(production guard for compiling dispatchers, `Dispatcher(builder=...)`, and `attention(registry=None)`).")
NATIVE_LAUNCH = Knob("FMHA_DSL_NATIVE_LAUNCH", "bool", True,
                     "`0` turns off fmha-dsl's C launcher (`runtime/native_launch.c`); `auto` then uses `cuda`.")
TORCH_FAST = Knob("FMHA_DSL_TORCH_FAST", "bool", True,
                  "`0` turns off the torch fast path (`runtime/torch_fast.cpp`): `attention()` takes the Python "
                  "path on every call, and repeat `paged_attention()`/`append_kv()` calls the Python replay.")

AUTOTUNE = Knob("FMHA_DSL_AUTOTUNE", "bool", True,
                "First-use selection by measurement (`attention()` without a registry, and registries without a "
                "seqtune table): `0` compiles the cost model's choice instead of timing the candidates.")
TUNE_CANDIDATES = Knob("FMHA_DSL_TUNE_CANDIDATES", "int", 24,
                       "How many rule-checked candidates a first-use decision compiles and times at most (the "
                       "cost model's best first); a backward decision takes half as many, and so does a forward "
                       "one on sm90 unless split-KV kernels are among its candidates.")
TUNED_SHIPPED = Knob("FMHA_DSL_TUNED_SHIPPED", "bool", True,
                     "`0` ignores the first-use decisions shipped with the package (`fmha_dsl/data/tuned/`): every "
                     "decision is measured on this machine (benchmarks of the first call use it).")
TUNED_CONFIRM = Knob("FMHA_DSL_TUNED_CONFIRM", "bool", True,
                     "A shipped decision whose runners-up were timed within 6 % of its winner is decided again on "
                     "this machine on first use (the winner and up to 4 runners-up are timed on the caller's "
                     "arguments, sustained: the first after 0.2 s of itself, the others after 50 ms; the result is "
                     "recorded in the cache's table, about 0.7 s once the kernels are cached): two "
                     "devices of one model can order such kernels differently. `0` runs the shipped winner as it is.")
COMPILE_AHEAD = Knob("FMHA_DSL_COMPILE_AHEAD", "bool", True,
                     "A training forward's first use also compiles what its backward's first use will need, behind "
                     "its own candidates in the same batch of compile workers, in the background: the backward's "
                     "first call then compiles nothing. `0` compiles each on its own first call (a forward on "
                     "tensors that require grad whose backward never comes then costs no background compile).")
GATHER_MIB = Knob("FMHA_DSL_GATHER_MIB", "int", 1024,
                  "The most MiB of workspace `paged_attention()` may use to copy a prefill batch's cached K/V into "
                  "contiguous rows for the forward kernels (the gathered route, timed against the paged kernels on "
                  "first use); `0` turns the route off.", minimum=0)
JOBS = Knob("FMHA_DSL_JOBS", "int", None,
            "Compile worker processes for first-use compiles (default: the CPU count). They stay idle for 30 s "
            "after a compile for the process's next one (a worker takes about a second to start), then stop.")
MAX_KERNELS = Knob("FMHA_DSL_MAX_KERNELS", "int", 200_000,
                   "The most kernels one declaration may expand to: past it, `check`, `build` and the Python API stop "
                   "with a located error instead of filling memory (a wildcard left open can mean millions: CK's "
                   "receipt 0 under the Triton backend is 4.8 million kernels for sm90 alone, 10 GB). The largest "
                   "declaration CK's generator gives (receipt 0 with profile `all`, every target) is 59,250.",
                   minimum=1)

KNOBS: tuple[Knob, ...] = (CACHE_DIR, LAUNCHER, NO_BUILD, NATIVE_LAUNCH, TORCH_FAST, AUTOTUNE, TUNE_CANDIDATES,
                           TUNED_SHIPPED, TUNED_CONFIRM, COMPILE_AHEAD, GATHER_MIB, JOBS, MAX_KERNELS)


def cache_dir() -> str | None:
    return CACHE_DIR.get()


def launcher() -> str:
    return LAUNCHER.get()


def no_build() -> bool:
    return NO_BUILD.get()


def torch_fast() -> bool:
    return TORCH_FAST.get()


def autotune() -> bool:
    return AUTOTUNE.get()


def tune_candidates() -> int:
    return TUNE_CANDIDATES.get()


def tuned_shipped() -> bool:
    return TUNED_SHIPPED.get()


def tuned_confirm() -> bool:
    return TUNED_CONFIRM.get()


def compile_ahead() -> bool:
    return COMPILE_AHEAD.get()


def gather_bytes() -> int:
    return GATHER_MIB.get() << 20


def jobs() -> int:
    return JOBS.get() or max(1, os.cpu_count() or 1)


def max_kernels() -> int:
    return MAX_KERNELS.get()


def by_name(name: str) -> Knob:
    """The knob called ``name`` (``KeyError`` if none)."""
    for k in KNOBS:
        if k.name == name:
            return k
    raise KeyError(name)


def markdown_table() -> str:
    """The knobs as the Markdown table docs/knobs.md carries (``tests/test_knobs.py`` compares them)."""
    rows = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for k in KNOBS:
        kind = k.kind if not k.choices else " \\| ".join(f"`{c}`" for c in k.choices)
        default = "unset" if k.default is None else f"`{str(k.default).lower() if k.kind == 'bool' else k.default}`"
        rows.append(f"| `{k.name}` | {kind} | {default} | {k.doc} |")
    return "\n".join(rows)


__all__ = ["Knob", "KNOBS", "CACHE_DIR", "LAUNCHER", "NO_BUILD", "NATIVE_LAUNCH", "TORCH_FAST", "cache_dir",
           "launcher", "no_build", "torch_fast", "AUTOTUNE", "TUNE_CANDIDATES", "JOBS", "TUNED_SHIPPED",
           "TUNED_CONFIRM", "autotune", "tune_candidates", "tuned_shipped", "tuned_confirm", "jobs", "by_name",
           "markdown_table", "GATHER_MIB", "gather_bytes", "COMPILE_AHEAD", "compile_ahead"]
