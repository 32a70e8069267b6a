"""Name lookups with a "did you mean": one helper for every registry (flows, tasks, grids,
algorithms, config fields, commands), so a typo gets the same answer everywhere."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the closest choice, case aside (``BF16`` finds ``bf16``), or
    ``""``."""
    folded = {}
    for c in choices:
        folded.setdefault(str(c).lower(), c)
    close = difflib.get_close_matches(str(value).lower(), list(folded), n=1)
    return f" Did you mean '{folded[close[0]]}'?" if close else ""


def unknown(field: str, value: Any, choices: Iterable[str]) -> ValueError:
    """The error for a value outside ``choices``, naming the field and what is allowed."""
    choices = list(choices)
    return ValueError(f"{field}: unknown value '{value}'.{did_you_mean(value, choices)} Allowed: "
                      f"{', '.join(choices)}.")


def lookup(field: str, name: Any, table: Mapping[str, Any]) -> Any:
    """``table[name]``, or ``unknown(...)`` raised."""
    if name not in table:
        raise unknown(field, name, table)
    return table[name]
