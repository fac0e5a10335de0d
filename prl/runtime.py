"""Process-wide settings the ``prl`` command makes before it loads its libraries.

- **Keep freed memory for reuse.** Steps like build-shards allocate and free shard-sized buffers over and over.
  Handed back to the OS, each comes back as fresh pages the kernel must fault in and zero. Two allocators are
  involved: Arrow's (mimalloc) holds Arrow arrays, glibc's malloc holds numpy arrays. Neither setting changes
  peak memory; freed memory simply stays with the process until it exits.
- **One BLAS thread.** prl does no linear algebra, but numpy's OpenBLAS starts a thread per core at import,
  which then spins for a while: about 0.1 CPU-seconds per command on two cores, taken from the work.

Library users can call :func:`set_process_defaults` themselves, before importing numpy or pyarrow, or set the
same environment variables.
"""

from __future__ import annotations

import ctypes
import os
import platform

GLIBC_MMAP_THRESHOLD = 32 << 20
"""Bytes from which glibc serves an allocation with its own mapping (its largest allowed value; the default
starts at 128 KiB and moves with the sizes freed). Below it, freed blocks are reused instead of unmapped."""

GLIBC_TRIM_THRESHOLD = 1 << 30
"""Free bytes glibc may keep at the top of its heap before it gives them back."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def set_process_defaults() -> dict[str, str]:
    """Make the settings above, except where the environment already says otherwise; returns the settings made,
    by the name of the environment variable that would have made them.

    - OpenBLAS: ``OPENBLAS_NUM_THREADS=1``, read when numpy is first imported.
    - Arrow (mimalloc): ``MIMALLOC_PURGE_DELAY=-1``, read when pyarrow is first imported (the ``prl`` command
      calls this first thing). About 9% of a cold build-shards, 4% of a warm one.
    - glibc malloc (numpy): ``mallopt`` with :data:`GLIBC_MMAP_THRESHOLD` and :data:`GLIBC_TRIM_THRESHOLD`,
      unless ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` are set. Together the two cut a warm
      build-shards' page faults about 4× and its CPU time by about 8%. (Either alone does not: a fixed trim
      threshold without a fixed mmap threshold makes glibc map and unmap every large buffer.) Skipped where
      the C library is not glibc.
    """
    made: dict[str, str] = {}
    for name, value in (("OPENBLAS_NUM_THREADS", "1"), ("MIMALLOC_PURGE_DELAY", "-1")):
        if name not in os.environ:
            os.environ[name] = made[name] = value
    if platform.libc_ver()[0] != "glibc":
        return made
    wanted = {"MALLOC_MMAP_THRESHOLD_": (_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD)}
    wanted["MALLOC_TRIM_THRESHOLD_"] = (_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD)
    if any(name in os.environ for name in wanted):
        return made  # the environment tunes glibc itself; the two only help together
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for name, (param, value) in wanted.items():
        if mallopt(param, value) == 1:  # 1: accepted
            made[name] = str(value)
    return made
