"""Run every benchmark in this folder (``bench_*.py``, then the end-to-end comparison ``e2e.py``) in turn; each
prints its own numbers."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    failed = []
    for script in [*sorted(glob.glob(os.path.join(HERE, "bench_*.py"))), os.path.join(HERE, "e2e.py")]:
        name = os.path.basename(script)
        print(f"\n=== {name}", flush=True)
        if subprocess.run([sys.executable, script], check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
