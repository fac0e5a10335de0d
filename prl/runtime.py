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
