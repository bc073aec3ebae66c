"""The one JSON reader every request body passes before any route sees it (`api.app.BodyLimit`).

A body is refused (422, with the path of the offending value) when it holds something no database
column stores faithfully and no planner prices sensibly:

- nesting deeper than `MAX_DEPTH` arrays / objects (Python's recursive parser would raise
  RecursionError, a 500, at about 1,000 levels; no request schema nests beyond a dozen);
- a number that overflows a float64 to infinity (`1e400`: Python reads it as `inf`, PostgreSQL's
  JSONB and float8 refuse it, SQLite stores `Infinity`), NaN or an infinity spelled out
  (`NaN`, `Infinity`: not JSON, but Python's parser accepts them);
- an integer beyond the signed 64-bit range (no `BigInteger` column or float64 holds it exactly);
- a NUL character (PostgreSQL text refuses it) or a lone surrogate (not UTF-8).

Numbers are read by `parse_number`, the same rule for every body; query parameters are typed by
their route (integers, enums, dates: FastAPI refuses `?limit=1e400` as not an integer)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

FieldPath = list[str | int]
Problem = tuple[FieldPath, str]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects in a body (the deepest request schema, a plan with an
inline HF config's `rope_scaling`, nests 5 levels; the agent's profile `environment` is free-form
but flat)."""
MAX_INT = 2**63 - 1
"""Largest integer magnitude a body may hold (signed 64-bit: `BigInteger` columns, exact floats
end at 2**53 but a byte count up to 2**63 is still ordered correctly)."""

_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
"""A JSON string (skipped whole: brackets inside it are text) or one bracket."""


class _Bad:
    """A number the parser refused, kept as a marker so that the walk can name its path."""

    def __init__(self, text: str, why: str):
        self.text, self.why = text, why


def depth_problem(body: bytes, limit: int = MAX_DEPTH) -> Problem | None:
    """(['body'], reason) when arrays / objects nest deeper than `limit`; found without parsing
    (strings are skipped by a regular expression, so a bracket inside text does not count)."""
    depth = 0
    for match in _TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return ["body"], f"JSON nested more than {limit} arrays / objects deep (at byte {match.start()})"
        elif token in (b"]", b"}"):
            depth -= 1
    return None


def parse_number(text: str) -> float | int | _Bad:
    """A JSON number as Python reads it, or a refusal marker: a float that overflows to infinity,
    an integer beyond 64 bits (the one rule for every number of every body)."""
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            return _Bad(text, f"{text} overflows a 64-bit float (its largest finite value is about 1.8e308)")
        return value
    number = int(text)
    if abs(number) > MAX_INT:
        return _Bad(text, f"{text} is beyond the signed 64-bit integer range (|n| <= 2**63 - 1)")
    return number


def _constant(name: str) -> _Bad:
    return _Bad(name, f"{name} is not a number JSON allows")


def parse(body: bytes) -> tuple[Any, Problem | None]:
    """(the parsed body, None), or (None, (path, reason)) of the first value refused (module
    docstring). A body that is not JSON at all gives (None, None): the route's own validation
    answers that, with the position of the syntax error."""
    problem = depth_problem(body)
    if problem is not None:
        return None, problem
    try:
        data = json.loads(body or b"null", parse_float=parse_number, parse_int=parse_number, parse_constant=_constant)
    except (ValueError, RecursionError):
        return None, None
    hit = _walk(data, [])
    return (None, hit) if hit is not None else (data, None)


def unsafe_json(body: bytes) -> Problem | None:
    """(path, reason) of the first value refused in a JSON body, else None."""
    return parse(body)[1]


def _walk(x: object, path: FieldPath) -> Problem | None:
    # iterative, with an explicit stack: the depth is bounded already, but a wide body must not
    # cost a Python frame per value
    stack: list[tuple[object, FieldPath]] = [(x, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, _Bad):
            return ["body", *where], value.why
        if isinstance(value, str):
            reason = _text_problem(value)
            if reason:
                return ["body", *where], reason
        elif isinstance(value, dict):
            items = list(value.items())
            for key, child in reversed(items):
                stack.append((child, [*where, key]))
            for key, _ in reversed(items):
                stack.append((key, where))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((value[i], [*where, i]))
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "NUL characters are not allowed in text"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "lone surrogates are not text (not valid UTF-8)"
    return None
