"""Vendor units to SI, converted once when a catalog or cluster file is loaded.

A quantity is written ``"<number> <unit>[ <direction>]"`` as it is printed on a datasheet, e.g.
``"989.4 TFLOPS"``, ``"80 GB"``, ``"81559 MiB"``, ``"3.35 TB/s"``, ``"900 GB/s bidirectional"``,
``"400 Gb/s"``, ``"1.9 us"``, ``"700 W"``. A bare number is taken to be SI already.

Conventions (docs/architecture.md, "Units"):
- ``GB``, ``TB``, ``MB`` are powers of 1000 and ``GiB``, ``TiB``, ``MiB`` powers of 1024. We never
  guess which one a vendor meant: write the unit the source prints.
- ``B/s`` units are bytes, ``b/s`` (and ``bps``) units are bits and are divided by 8.
- Rates are stored *per direction*. ``bidirectional`` (NVIDIA's NVLink and PCIe figures, AMD's
  aggregate Infinity Fabric figure) is halved; ``unidirectional``, ``per direction`` and ``one way``
  are kept. Where a rate may be quoted either way (GPU links), the loader requires the qualifier.
"""

from __future__ import annotations

import re

_FLOPS = {"flops": 1.0, "gflops": 1e9, "tflops": 1e12, "pflops": 1e15}
_BYTES = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_RATES = {
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,  # bytes
    "mib/s": 2.0**20, "gib/s": 2.0**30,
    "gbit/s": 1e9 / 8, "gbps": 1e9 / 8, "tbit/s": 1e12 / 8, "mbit/s": 1e6 / 8,  # bits
}  # fmt: skip
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_WATTS = {"w": 1.0, "kw": 1e3}
_DIRECTIONS = {"": None, "bidirectional": 0.5, "unidirectional": 1.0, "per direction": 1.0, "one way": 1.0}

_QUANTITY = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([^\s]+)\s*(.*?)\s*$")


def _split(text: str) -> tuple[float, str, str]:
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"cannot read quantity {text!r}: expected '<number> <unit>'")
    return float(m.group(1)), m.group(2), m.group(3).lower()


def _unit_key(unit: str) -> str:
    # "Gb/s" (bits) and "GB/s" (bytes) differ only in case: keep that distinction explicit.
    if unit.endswith("b/s") and not unit.endswith("B/s"):
        return unit[:-3].lower() + "bit/s"
    return unit.lower()


def _convert(value: object, table: dict, kind: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise TypeError(f"{kind}: {value!r} is not a quantity")
    if isinstance(value, int | float):
        return float(value), ""
    if not isinstance(value, str):
        raise TypeError(f"{kind}: {value!r} is not a quantity")
    number, unit, rest = _split(value)
    key = _unit_key(unit)
    if key not in table:
        raise ValueError(f"{kind}: unknown unit {unit!r} in {value!r}; known: {sorted(table)}")
    return number * table[key], rest


def _no_rest(value: object, rest: str, kind: str) -> None:
    if rest:
        raise ValueError(f"{kind}: unexpected {rest!r} in {value!r}")


def flops_per_s(value: object) -> float:
    """``"989.4 TFLOPS"`` -> 9.894e14 FLOP/s."""
    out, rest = _convert(value, _FLOPS, "FLOP/s")
    _no_rest(value, rest, "FLOP/s")
    return out


def n_bytes(value: object) -> int:
    """``"80 GB"`` -> 80_000_000_000; ``"81559 MiB"`` -> 85_520_809_984."""
    out, rest = _convert(value, _BYTES, "bytes")
    _no_rest(value, rest, "bytes")
    return round(out)


def bytes_per_s(value: object, *, require_direction: bool = False) -> float:
    """A rate in bytes/s, one direction. ``"900 GB/s bidirectional"`` -> 4.5e11."""
    out, rest = _convert(value, _RATES, "bytes/s")
    if rest not in _DIRECTIONS:
        raise ValueError(
            f"bytes/s: unknown direction {rest!r} in {value!r}; use one of {sorted(_DIRECTIONS)}"
        )
    factor = _DIRECTIONS[rest]
    if factor is None:
        if require_direction and isinstance(value, str):
            raise ValueError(f"bytes/s: {value!r} must say 'bidirectional' or 'unidirectional'")
        factor = 1.0
    return out * factor


def seconds(value: object) -> float:
    """``"1.9 us"`` -> 1.9e-6 s."""
    out, rest = _convert(value, _TIMES, "seconds")
    _no_rest(value, rest, "seconds")
    return out


def watts(value: object) -> float:
    """``"700 W"`` -> 700.0."""
    out, rest = _convert(value, _WATTS, "watts")
    _no_rest(value, rest, "watts")
    return out
