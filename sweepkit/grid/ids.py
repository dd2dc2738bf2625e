"""Cell ids: how they are made from values and templates, and which are allowed.

An id names a directory (``runs/<grid>/<id>/``) and a node id (``grid.py::id``),
so it must be filesystem-safe and mean the same thing on every run.
"""

from __future__ import annotations

import re
import string
from typing import Any

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.+-]+$")
#: Names of directories sweepkit itself keeps next to the cell dirs of a grid.
RESERVED_IDS = frozenset({"report"})
# Small and huge floats read better as 3e-4 than 0.0003 (learning rates, coefficients).
SCIENTIFIC_BELOW = 0.05
SCIENTIFIC_FROM = 1e5


def format_value(value: Any) -> str:
    """A value as it reads in an id: ``3e-4``, ``1e-5``, ``0.8``, ``true``; tuples joined by ``-``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value != 0 and (abs(value) < SCIENTIFIC_BELOW or abs(value) >= SCIENTIFIC_FROM):
            mantissa, exponent = f"{value:.12e}".split("e")
            mantissa = mantissa.rstrip("0").rstrip(".")
            return f"{mantissa}e{int(exponent)}"
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "-".join(format_value(v) for v in value)
    return str(value)


class _IdFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec:
            return super().format_field(value, format_spec)
        return format_value(value)


def from_template(template: str, values: dict[str, Any]) -> str:
    """Fill ``"tbs{train_batch_size}"``; KeyError names a field the values lack."""
    return _IdFormatter().format(template, **values)


def id_problem(cell_id: Any) -> str | None:
    """Why ``cell_id`` is not allowed, or None when it is fine."""
    if not isinstance(cell_id, str) or not cell_id:
        return f"cell id {cell_id!r} must be a non-empty string"
    if not ID_PATTERN.match(cell_id) or ".." in cell_id or cell_id == ".":
        return (f"cell id {cell_id!r} is not allowed: use letters, digits and '_' '.' '+' '-' only "
                "(no '/', '..', spaces or shell metacharacters)")
    if cell_id in RESERVED_IDS:
        return f"cell id {cell_id!r} is reserved (sweepkit keeps runs/<grid>/{cell_id}/ for itself)"
    return None
