"""Process-wide settings the ``prl`` command makes before it loads its libraries.

- **Freed memory goes back to the OS after a second.** Arrow's allocator (mimalloc) and polars' (jemalloc) each
  keep pages they freed, for reuse; by default Arrow's hands them back after 10 ms and jemalloc's after 10 s, and
  with ``MIMALLOC_PURGE_DELAY=-1`` Arrow would keep them for good. Pages one allocator keeps are lost to the
  other, so a build-shards whose plan (polars joins, Arrow scans) is followed by shard writing (Arrow, numpy) kept
  the high-water mark of both: 1,061 MB peak at 200 M tokens against 804 MB with both at 1 s
  (``MIMALLOC_PURGE_DELAY=1000``, ``_RJEM_MALLOC_CONF=dirty_decay_ms:1000,muzzy_decay_ms:0``;
  ``bench/bench_shards_memory.py``). A second is long enough that shard-sized buffers freed and allocated again
  back to back are reused rather than faulted in afresh: no CPU time measured against keeping them for good.
- **One BLAS thread.** prl does no linear algebra, but numpy's OpenBLAS starts a thread per core at import,
  which then spins for a while: about 0.1 CPU-seconds per command on two cores, taken from the work.

glibc's own malloc is left as the environment sets it (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
or ``GLIBC_TUNABLES`` tune it without any code).

Library users can call :func:`set_process_defaults` themselves, before importing numpy, pyarrow or polars, or set
the same environment variables.

:func:`release_free_memory` hands the free pages of Arrow's pool and glibc's malloc back at once, whatever the
settings: build-shards calls it every few dozen scanned batches, after its plan reads and before its shards, so
pages freed by one step are not held beside the next one's.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SETTINGS = (
    ("OPENBLAS_NUM_THREADS", "1", "numpy"),
    ("MIMALLOC_PURGE_DELAY", "1000", "pyarrow"),
    ("_RJEM_MALLOC_CONF", "dirty_decay_ms:1000,muzzy_decay_ms:0", "polars"),
)
"""``(environment variable, value, the library that reads it once when it loads)``."""


def set_process_defaults() -> dict[str, str]:
    """Make the settings above, except where the environment already says otherwise; returns the settings made,
    by environment variable.

    - OpenBLAS: ``OPENBLAS_NUM_THREADS=1``, read when numpy is first imported (not set, nor reported, once it
      has been). It applies to the whole process, so a library user who runs BLAS work beside prl should not
      call this.
    - Arrow (mimalloc): ``MIMALLOC_PURGE_DELAY=1000``, read when pyarrow is first imported (likewise).
    - polars (jemalloc): ``_RJEM_MALLOC_CONF=dirty_decay_ms:1000,muzzy_decay_ms:0``, read when polars is first
      imported (likewise).
    """
    made: dict[str, str] = {}
    for name, value, library in SETTINGS:  # each is read once, when its library loads: set it while that can happen
        if name not in os.environ and library not in sys.modules:
            os.environ[name] = made[name] = value
    return made


@contextmanager
def young_collections() -> Iterator[None]:
    """The cyclic garbage collector's automatic runs off for the block; :func:`collect_young` runs it on the
    objects made since its last run. Restored on exit.

    Ingest holds a batch of rows (two Python objects per sample, tens of thousands per batch) while it decodes
    more records, each a few dozen short-lived containers: every full collection the allocations trigger walks
    all the rows again (about 45% of the CPU time of short records, measured by ``gc.callbacks``). Collecting
    only the young objects, once per batch, still frees every cycle made in between (an exception's
    traceback, the usual one) and walks each row once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def collect_young() -> None:
    """Collect the objects made since the last collection (generations 0 and 1), then promote what lives on
    out of the young generations. Under :func:`young_collections` this is the only collection."""
    gc.collect(1)


def release_free_memory() -> None:
    """Hand the pages the allocators hold free back to the OS now, rather than when their delays run out: Arrow's
    pool (:meth:`pyarrow.MemoryPool.release_unused`) and, where the C library is glibc, its malloc
    (``malloc_trim(0)``, which returns the free pages in the middle of its heap too, as its own trimming never
    does). A build calls it between its plan and its shard writing, so that the pages the plan freed are not
    held beside the shards in flight. Neither changes an allocator's settings."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    import ctypes

    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the symbols the process has loaded
    except (OSError, TypeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int  # int malloc_trim(size_t pad)
    return trim


class _NoPandasYet:
    """A finder under which ``import pandas`` fails: Arrow's first Python conversion looks pandas up once (to
    recognise pandas objects) and so imported it, about 0.3 s of every command, whether or not pandas is used."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is loaded on demand", name=name)


class _AfterLoad(importlib.abc.Loader):
    """A loader that runs ``then`` once its module is executed (the module's own loader does the work)."""

    def __init__(self, loader: Any, then: Any) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.then()


class _Watch:
    """A finder that runs ``then`` once the top-level module ``name`` has loaded, then leaves ``sys.meta_path``.
    A look-up that does not load (``importlib.util.find_spec``, as polars probes for its optional libraries)
    leaves it in place."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.busy:
            return None
        from importlib.util import find_spec

        self.busy = True
        try:
            spec = find_spec(name)  # what the other finders say
        finally:
            self.busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterLoad(spec.loader, self._loaded)
        return spec

    def _loaded(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
            self.then()


def _arrow_looked_pandas_up() -> None:
    """Let Arrow's one-time pandas lookup find none (it is not loaded, so no pandas object exists yet), then
    watch for pandas being loaded after all, to show it to Arrow then."""
    import pyarrow as pa

    blocker = _NoPandasYet()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0.5, None])  # the conversion that looks pandas up
    finally:
        sys.meta_path.remove(blocker)
    sys.meta_path.insert(0, _Watch("pandas", _show_pandas_to_arrow))


def _show_pandas_to_arrow() -> None:
    import pyarrow as pa

    pa.lib._pandas_api.pd  # noqa: B018 - the shim's loading lookup: pandas objects are recognised from here on


def pandas_on_demand() -> bool:
    """Load pandas only if something uses it. Arrow looks pandas up on its first conversion of Python values and
    imports it if installed (0.3 s or more on every command, for nothing on a prl command). Under this, that
    lookup finds no pandas while none is loaded; should anything import pandas later, Arrow is shown it at once,
    so ``pa.array(series)`` and ``to_pandas()`` work as usual. One thing stays off for the process: Arrow's
    reading of pandas' ``NaT`` / ``NA`` singletons inside plain Python lists (``from_pandas=True``); prl makes
    none. For the ``prl`` command, which owns its process; returns whether the lookup was deferred (False once
    pandas or pyarrow has loaded)."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return False
    sys.meta_path.insert(0, _Watch("pyarrow", _arrow_looked_pandas_up))
    return True
