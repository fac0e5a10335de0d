"""Process-wide settings the ``prl`` command makes before it loads its libraries.

- **Arrow keeps freed memory for reuse.** Steps like build-shards allocate and free shard-sized Arrow buffers
  over and over. Handed back to the OS, each comes back as fresh pages the kernel must fault in and zero; with
  ``MIMALLOC_PURGE_DELAY=-1`` Arrow's allocator (mimalloc) keeps them. Peak memory rises a little (60–100 MB
  on a small build-shards, about nothing at 200 M tokens: ``bench/bench_shards_memory.py``).
- **One BLAS thread.** prl does no linear algebra, but numpy's OpenBLAS starts a thread per core at import,
  which then spins for a while: about 0.1 CPU-seconds per command on two cores, taken from the work.

glibc's own malloc is left as the environment sets it (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
or ``GLIBC_TUNABLES`` tune it without any code).

Library users can call :func:`set_process_defaults` themselves, before importing numpy or pyarrow, or set the
same environment variables.
"""

from __future__ import annotations

import os
import sys

SETTINGS = (("OPENBLAS_NUM_THREADS", "1", "numpy"), ("MIMALLOC_PURGE_DELAY", "-1", "pyarrow"))
"""``(environment variable, value, the library that reads it once when it loads)``."""


def set_process_defaults() -> dict[str, str]:
    """Make the settings above, except where the environment already says otherwise; returns the settings made,
    by environment variable.

    - OpenBLAS: ``OPENBLAS_NUM_THREADS=1``, read when numpy is first imported (not set, nor reported, once it
      has been). It applies to the whole process, so a library user who runs BLAS work beside prl should not
      call this.
    - Arrow (mimalloc): ``MIMALLOC_PURGE_DELAY=-1``, read when pyarrow is first imported (likewise). About 9% of
      a cold build-shards, 4% of a warm one.
    """
    made: dict[str, str] = {}
    for name, value, library in SETTINGS:  # each is read once, when its library loads: set it while that can happen
        if name not in os.environ and library not in sys.modules:
            os.environ[name] = made[name] = value
    return made
