"""One validator for configuration values: recipe tables and shard options (``[shards]``, ``--set KEY=VALUE``).

A :class:`Validator` checks the values of one table and raises :class:`~prl.errors.UsageError` (exit 2) with a
message that names the file (when known), the table and the key, what was expected and what was given::

    recipe.toml: [shards] kl_coef: expected a number ≥ 0, got 'x'

With ``text=True`` (values that may come from the command line as strings) numbers, booleans and lists are
also parsed from text: ``"20"``, ``"0.5"``, ``"true"``, ``"stop,length"``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from prl.errors import UsageError

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class Validator:
    """Type and range checks of the values of table ``table`` (``where``: the file, or None)."""

    def __init__(self, table: str, where: str | None = None, *, text: bool = False) -> None:
        self.table = table
        self.where = where
        self.text = text

    # --- messages ----------------------------------------------------------------------------------------------
    def prefix(self) -> str:
        return f"{self.where}: " if self.where else ""

    def fail(self, key: str, message: str) -> UsageError:
        """An error about ``key``: ``<where>: [table] key: message`` (no ``[table]`` for a library call's option)."""
        table = f"[{self.table}] " if self.table else ""
        return UsageError(f"{self.prefix()}{table}{key}: {message}")

    def bad(self, key: str, expected: str, value: Any) -> UsageError:
        """An error saying what ``key`` expects and what it got."""
        return self.fail(key, f"expected {expected}, got {value!r}")

    def known(self, values: Mapping[str, Any], keys: Iterable[str]) -> None:
        """Reject keys of ``values`` outside ``keys``, listing the known ones."""
        keys = list(keys)
        unknown = sorted(set(values) - set(keys))
        if unknown:
            raise UsageError(
                f"{self.prefix()}unknown key(s) in [{self.table}]: {', '.join(unknown)}; known keys: {', '.join(keys)}"
            )

    # --- scalar kinds ------------------------------------------------------------------------------------------
    def string(self, key: str, value: Any, choices: Iterable[str] | None = None) -> str:
        """A non-empty string, one of ``choices`` when given."""
        if choices is not None:
            options = tuple(choices)
            if value not in options:
                raise self.bad(key, f"one of {', '.join(options)}", value)
        if not isinstance(value, str) or not value:
            raise self.bad(key, "a non-empty string", value)
        return value

    def boolean(self, key: str, value: Any) -> bool:
        """``true`` or ``false`` (also ``"true"``/``"false"``/``"yes"``/``"no"``/``"1"``/``"0"`` with ``text``)."""
        if self.text and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def integer(self, key: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
        """An integer (not a bool), ≥ ``minimum`` and ≤ ``maximum`` when given."""
        expected = "an integer" if minimum is None else f"an integer ≥ {minimum}"
        if maximum is not None:
            expected = f"an integer in [{minimum}, {maximum}]" if minimum is not None else f"an integer ≤ {maximum}"
        if self.text and isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise self.bad(key, expected, value) from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(key, expected, value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise self.bad(key, expected, value)
        return value

    def number(
        self,
        key: str,
        value: Any,
        minimum: float | None = None,
        maximum: float | None = None,
        above_minimum: bool = False,
    ) -> float:
        """A finite number (not a bool) in ``[minimum, maximum]`` (``(minimum, maximum]`` with ``above_minimum``)."""
        expected = _number_range(minimum, maximum, above_minimum)
        if self.text and isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise self.bad(key, expected, value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.bad(key, expected, value)
        low_fails = minimum is not None and (value <= minimum if above_minimum else value < minimum)
        if low_fails or (maximum is not None and value > maximum):
            raise self.bad(key, expected, value)
        return float(value)

    def rate(self, key: str, value: Any) -> float:
        """A fraction in ``[0, 1]``."""
        return self.number(key, value, 0.0, 1.0)

    def names(self, key: str, value: Any, choices: Iterable[str] | None = None) -> tuple[str, ...]:
        """A list of names (with ``text``, also one comma-separated string), each one of ``choices`` when given."""
        if self.text and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise self.bad(key, "a list of names", value)
        if choices is not None:
            options = tuple(choices)
            for name in value:
                if name not in options:
                    raise self.bad(key, f"names from {', '.join(options)}", name)
        return tuple(value)

    def weights(self, key: str, value: Any) -> dict[str, float]:
        """Named weights: a table ``name = weight`` (with ``text``, also ``"a=1,b=0.2"``, or one name: weight 1)."""
        if self.text and isinstance(value, str):
            if "=" not in value:
                value = {value.strip(): 1.0}
            else:
                pairs = [part.partition("=") for part in value.split(",") if part.strip()]
                try:
                    value = {name.strip(): float(weight) for name, _, weight in pairs}
                except ValueError:
                    raise self.bad(key, "NAME=WEIGHT pairs separated by commas", value) from None
        if not isinstance(value, Mapping) or not value:
            raise self.bad(key, "a table of name = weight (at least one)", value)
        out = {}
        for name, weight in value.items():
            if not isinstance(name, str) or not name:
                raise self.bad(key, "non-empty component names", name)
            out[name] = self.number(f"{key}.{name}", weight)
        return out


def _number_range(minimum: float | None, maximum: float | None, above_minimum: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"a number in {'(' if above_minimum else '['}{minimum:g}, {maximum:g}]"
    if minimum is not None:
        return f"a number {'>' if above_minimum else '≥'} {minimum:g}"
    return "a finite number"


__all__ = ["Validator"]
