"""Named models, stored as HuggingFace `config.json` files under `model_specs/data/<name>.json`.

Each preset is the published `config.json` of the checkpoint named in its `_name_or_path`, built
through `from_hf_config`, so every preset also exercises the importer. Exceptions, marked by a
`_comment` key: `gpt3-175b` (no HF checkpoint exists; GPT-2 layout with the shapes of Brown et al.
2020, Table 2.1), `nemotron-4-340b` (transformers-format conversion of the NeMo checkpoint) and the
`tiny*` models (made up for CPU tests, written in the format of their family).

Names are case-insensitive. `get_model` also accepts the path of a `config.json` or of a model
directory holding one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path

from model_specs.hf import from_hf_config, load_hf_config
from model_specs.spec import ModelSpec

__all__ = ["PRESETS", "UnknownModelError", "get_model", "list_models"]

_DATA = resources.files("model_specs") / "data"

ALIASES: dict[str, str] = {
    "llama3.1-8b": "llama3-8b",
    "llama-3.1-8b": "llama3-8b",
    "llama3.1-70b": "llama3-70b",
    "llama-3.1-70b": "llama3-70b",
    "llama3.1-405b": "llama3-405b",
    "llama-3.1-405b": "llama3-405b",
    "gpt3": "gpt3-175b",
    "deepseek-v3-671b": "deepseek-v3",
    "qwen3-235b": "qwen3-235b-a22b",
}


class UnknownModelError(KeyError):
    """No preset of that name and no config.json at that path."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


def list_models() -> list[str]:
    """Names of all presets, sorted."""
    return list(_names())


@cache
def _names() -> tuple[str, ...]:
    """The packaged preset files are read once per process."""
    return tuple(sorted(p.name.removesuffix(".json") for p in _DATA.iterdir() if p.name.endswith(".json")))


@cache
def _load(name: str) -> ModelSpec:
    return from_hf_config(load_hf_config(Path(str(_DATA / f"{name}.json"))), name=name)


class _Presets(Mapping[str, ModelSpec]):
    """Read-only mapping name -> `ModelSpec`; each config is parsed on first use."""

    def __getitem__(self, name: str) -> ModelSpec:
        key = name.lower()
        key = ALIASES.get(key, key)
        if key not in _names():
            raise KeyError(name)
        return _load(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list_models())

    def __len__(self) -> int:
        return len(list_models())


PRESETS: Mapping[str, ModelSpec] = _Presets()


def get_model(name: str) -> ModelSpec:
    """The preset called `name` (case-insensitive). Never a file path: a name may come from a request
    (the API, a --jobs line), and reading the server's files is not ours to offer; the CLI reads a
    local `config.json` itself (`model_specs.hf.load_hf_spec`)."""
    try:
        return PRESETS[name]
    except KeyError:
        pass
    raise UnknownModelError(
        f"unknown model {name!r}: not a preset ({', '.join(list_models())}); "
        "pass a HuggingFace config as {\"hf_config\": {...}} or, on the command line, a path to config.json"
    )
