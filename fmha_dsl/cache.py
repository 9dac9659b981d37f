"""A persistent, content-addressed artifact cache (compiled kernels).

An entry lives at ``<root>/<key[:2]>/<key>/`` with ``meta.json`` and the binary.  ``key`` is the sha256
of everything that determines the bytes (kernel key, template source hash, toolchain version, target,
compile options) -- never file times.  Entries are written into a temporary folder and renamed into
place, so a build killed at any moment leaves either a whole entry or none; a damaged entry (unreadable
meta, binary whose sha256 differs) counts as a miss and is rebuilt.

Root: ``$FMHA_DSL_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/fmha-dsl/kernels``, else
``~/.cache/fmha-dsl/kernels``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile


def cache_base() -> str:
    """fmha-dsl's cache folder: ``$FMHA_DSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/fmha-dsl``, else
    ``~/.cache/fmha-dsl`` (read at call time)."""
    from .knobs import cache_dir

    return cache_dir() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fmha-dsl")


def cache_root() -> str:
    return os.path.join(cache_base(), "kernels")


def content_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactCache:
    def __init__(self, root: str | None = None):
        self.root = root or cache_root()

    @classmethod
    def of(cls, cache_dir: str | None) -> "ArtifactCache":
        """The kernel cache inside a cache folder (``cache_dir/kernels``; None: the default folder's)."""
        return cls(os.path.join(cache_dir, "kernels") if cache_dir else None)

    def _dir(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key)

    def get(self, key: str) -> tuple[dict, bytes] | None:
        """The entry's metadata and binary, or None (missing or damaged: never raises)."""
        d = self._dir(key)
        try:
            with open(os.path.join(d, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
            with open(os.path.join(d, meta["file"]), "rb") as f:
                data = f.read()
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if sha256_bytes(data) != meta.get("sha256"):
            return None
        return meta, data

    def has(self, key: str) -> bool:
        """Whether an entry is stored under ``key`` (not read: :meth:`get` checks it)."""
        return os.path.isfile(os.path.join(self._dir(key), "meta.json"))

    def put(self, key: str, meta: dict, data: bytes, filename: str) -> bool:
        """Store atomically; a concurrent writer of the same key wins harmlessly.  A cache folder that cannot be
        written is not an error (the cache only saves time): a warning, and False."""
        final = self._dir(key)
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=os.path.dirname(final))
        except OSError as exc:
            import warnings

            warnings.warn(f"the kernel cache `{self.root}` cannot be written ({exc.strerror or exc}): compiled "
                          "kernels are not cached (set FMHA_DSL_CACHE_DIR to a writable folder)", RuntimeWarning,
                          stacklevel=2)
            return False
        try:
            with open(os.path.join(tmp, filename), "wb") as f:
                f.write(data)
            meta = dict(meta, file=filename, sha256=sha256_bytes(data), size=len(data))
            with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
                json.dump(meta, f, sort_keys=True, indent=1)
            if os.path.isdir(final) and self.get(key) is None:
                shutil.rmtree(final, ignore_errors=True)  # a damaged entry: replace it
            try:
                os.rename(tmp, final)
            except OSError:
                pass  # someone else finished the same entry first
            return True
        finally:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["ArtifactCache", "cache_base", "cache_root", "content_key", "sha256_bytes"]
