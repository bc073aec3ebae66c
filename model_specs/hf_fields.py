"""Typed, alias-aware reading of a HuggingFace `config.json` dictionary.

Configs in the wild spell the same quantity several ways (`hidden_size`, `n_embd`, `n_embed`;
`num_hidden_layers`, `n_layer`; ...). `ConfigFields` looks a quantity up under each of its spellings
in turn, checks its JSON type, and raises `ModelConfigError` naming the field and the `model_type`
when it is missing or malformed. A key whose value is `null` counts as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING: Any = object()


class ModelConfigError(ValueError):
    """A `config.json` that cannot be read as a `ModelSpec`; the message names the field and model_type."""


class ConfigFields:
    """Read fields of one config dictionary; `model_type` is only used in error messages."""

    def __init__(self, raw: Mapping[str, Any], model_type: str) -> None:
        self.raw = raw
        self.model_type = model_type

    def error(self, message: str) -> ModelConfigError:
        return ModelConfigError(f"{self.model_type} config: {message}")

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any] | None:
        for key in keys:
            value = self.raw.get(key)
            if value is not None:
                return key, value
        return None

    def has(self, *keys: str) -> bool:
        return self._find(keys) is not None

    def _absent(self, keys: tuple[str, ...], default: Any) -> Any:
        if default is _MISSING:
            also = f" (also looked for: {', '.join(keys[1:])})" if len(keys) > 1 else ""
            raise self.error(f"missing required field '{keys[0]}'{also}")
        return default

    def integer(self, *keys: str, default: Any = _MISSING) -> Any:
        """An integer field (JSON integers; integral floats such as 4096.0 are accepted)."""
        found = self._find(keys)
        if found is None:
            return self._absent(keys, default)
        key, value = found
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"field '{key}' must be an integer, got {value!r} ({type(value).__name__})")
        return value

    def flag(self, *keys: str, default: Any = _MISSING) -> Any:
        found = self._find(keys)
        if found is None:
            return self._absent(keys, default)
        key, value = found
        if not isinstance(value, bool):
            raise self.error(f"field '{key}' must be true or false, got {value!r} ({type(value).__name__})")
        return value

    def text(self, *keys: str, default: Any = _MISSING) -> Any:
        found = self._find(keys)
        if found is None:
            return self._absent(keys, default)
        key, value = found
        if not isinstance(value, str):
            raise self.error(f"field '{key}' must be a string, got {value!r} ({type(value).__name__})")
        return value

    def int_list(self, key: str) -> list[int] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(f"field '{key}' must be a list of integers, got {value!r}")
        return value

    def str_list(self, key: str) -> list[str] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
            raise self.error(f"field '{key}' must be a list of strings, got {value!r}")
        return value
