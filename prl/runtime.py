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
import sys

GLIBC_MMAP_THRESHOLD = 32 << 20
"""Bytes from which glibc serves an allocation with its own mapping (its largest allowed value on 64-bit hosts;
the default starts at 128 KiB and moves with the sizes freed). Below it, freed blocks are reused instead of
unmapped."""

GLIBC_TRIM_THRESHOLD = 1 << 30
"""Free bytes glibc may keep at the top of its heap before it gives them back."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def set_process_defaults() -> dict[str, str]:
    """Make the settings above, except where the environment already says otherwise; returns the settings made,
    by the name of the environment variable that would have made them.

    - OpenBLAS: ``OPENBLAS_NUM_THREADS=1``, read when numpy is first imported (not set, nor reported, once it
      has been). It applies to the whole process, so a library user who runs BLAS work beside prl should not
      call this.
    - Arrow (mimalloc): ``MIMALLOC_PURGE_DELAY=-1``, read when pyarrow is first imported (likewise). About 9% of
      a cold build-shards, 4% of a warm one.
    - glibc malloc (numpy): ``mallopt`` with :data:`GLIBC_MMAP_THRESHOLD` and :data:`GLIBC_TRIM_THRESHOLD`,
      unless ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or a ``glibc.malloc`` tunable in
      ``GLIBC_TUNABLES`` is set. Together the two cut a warm build-shards' page faults about 4× and its CPU
      time by about 8%, for 1–3% more peak memory. (A fixed trim threshold without a fixed mmap threshold makes
      glibc map and unmap every large buffer, so the second is only set once the first is.) Skipped where the
      C library is not glibc.
    """
    made: dict[str, str] = {}
    # each variable is read once, when its library loads: set it only while that can still happen
    for name, value, library in (("OPENBLAS_NUM_THREADS", "1", "numpy"), ("MIMALLOC_PURGE_DELAY", "-1", "pyarrow")):
        if name not in os.environ and library not in sys.modules:
            os.environ[name] = made[name] = value
    if platform.libc_ver()[0] != "glibc":
        return made
    tuned = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ)
    if tuned or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return made  # the environment tunes glibc's malloc itself; the two settings only help together
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the trim threshold alone would pin the mmap threshold at its 128 KiB default: set it only after the other
    if mallopt(_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD) != 1:  # 1: accepted
        return made
    made["MALLOC_MMAP_THRESHOLD_"] = str(GLIBC_MMAP_THRESHOLD)
    if mallopt(_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD) == 1:
        made["MALLOC_TRIM_THRESHOLD_"] = str(GLIBC_TRIM_THRESHOLD)
    return made
