"""The import graph of prl/: which packages import which, and where the rules are broken.

Rules: no import circle between prl's packages, and no stage imports another stage (stages meet through the store
and the shared modules). Run `python scripts/import_graph.py` to print the graph; `--check` (run by `make lint`) exits 1
on an edge that closes a circle or crosses between stages and is not in the known list below, and on a known edge that
is gone (so the list only shrinks until it is empty).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "prl"
STAGES = ("ingestion", "checks", "score", "shards", "maintain")
# edges that close a circle or cross between stages and are allowed: none
KNOWN: set[tuple[str, str]] = set()


def package_of(module: str) -> str:
    """The node a module belongs to: its package below prl, or the top-level module itself (prl.cli: `cli`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "prl"


def imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name == "prl" or a.name.startswith("prl."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "prl" or target.startswith("prl."):
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        src = package_of(module)
        for target in imports(path, module):
            dst = package_of(target)
            if dst != src:
                edges[src].add(dst)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    edges = graph()
    for src in sorted(edges):
        print(f"{src} -> {', '.join(sorted(edges[src]))}")
    loops = circles(edges)
    in_loop = {(s, d) for loop in loops for s in loop for d in edges.get(s, ()) if d in loop}
    crossings = {(s, d) for s, ds in edges.items() for d in ds if s in STAGES and d in STAGES}
    bad = in_loop | crossings
    for loop in loops:
        print(f"circle: {' <-> '.join(loop)}")
    for s, d in sorted(bad):
        why = "crosses stages" if (s, d) in crossings else "closes a circle"
        print(f"{s} -> {d}: {why}{'' if (s, d) in KNOWN else '  (new)'}")
    gone = sorted(KNOWN - bad)
    for s, d in gone:
        print(f"known edge {s} -> {d} no longer {'crosses stages or closes a circle'}: take it off KNOWN")
    if args.check and (bad - KNOWN or gone):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
