"""JSON booleans are never numbers: `true` where a body's schema wants an integer or a number is a 422.

pydantic's lax mode turns `true` into 1 (and 1.0), so `{"gpus": true}` would plan for one GPU. The
request bodies are built from many packages' models (`TrainingSpec`, `SearchConstraints`, the
evaluation `Job`, the API's own), so the rule is enforced once, for every body, by `strict_numbers`:
a dependency of the token checks (`api.deps.user` / `agent`, after the token) that walks the JSON
body against the JSON schema of the route's body model before pydantic sees it. Inline model and cluster specs (`dict` fields, validated later in
`api.resolve`) are walked against the `ModelSpec` / `ClusterSpec` schema by `check_no_bool_numbers`.

A boolean is refused where no alternative of the schema (`anyOf`, `oneOf`, nullable types) admits
a boolean and some alternative wants an integer or a number. Keys the schema does not name are left
to the model's own validation (unknown fields, vendor-unit spellings read by a before-validator).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from pydantic import TypeAdapter

from api.errors import ApiError

FieldPath = list[str | int]
Schema = dict[str, Any]
NUMBER_TYPES = frozenset({"integer", "number"})


def check_no_bool_numbers(data: Any, schema: Schema, loc: Sequence[str | int]) -> None:
    """Raise a 422 ApiError naming the first boolean given where `schema` wants a number."""
    hit = bool_as_number(data, schema)
    if hit is None:
        return
    path, wanted = hit
    raise ApiError(
        422, f"{json.dumps(_value_at(data, path))} is a boolean, not {wanted}: give a number",
        [*loc, *path], "bool_is_not_a_number",
    )


def bool_as_number(data: Any, schema: Schema) -> tuple[FieldPath, str] | None:
    """(path, 'an integer' | 'a number') of the first boolean where `schema` wants a number, or None."""
    return _walk(data, schema, schema.get("$defs", {}), [])


def _walk(data: Any, schema: Schema, defs: Schema, path: FieldPath) -> tuple[FieldPath, str] | None:
    if not isinstance(data, bool | dict | list):
        return None  # numbers, strings and null: nothing to coerce here
    alternatives = _alternatives(schema, defs)
    if isinstance(data, bool):
        return _judge_bool(alternatives, path)
    if isinstance(data, dict):
        for key, value in data.items():
            hit = _walk_child(value, [_property(alt, key) for alt in alternatives], defs, [*path, key])
            if hit:
                return hit
        return None
    prefix = max(len(alt.get("prefixItems", [])) for alt in alternatives)
    shared = [_item(alt, prefix) for alt in alternatives]  # past every prefixItems: the items schemas
    for i, value in enumerate(data):
        if not isinstance(value, bool | dict | list):
            continue
        schemas = [_item(alt, i) for alt in alternatives] if i < prefix else shared
        hit = _walk_child(value, schemas, defs, [*path, i])
        if hit:
            return hit
    return None


def _walk_child(value: Any, schemas: list[Schema | None], defs: Schema, path: FieldPath) -> tuple[FieldPath, str] | None:
    if not isinstance(value, bool | dict | list):
        return None
    known = [s for s in schemas if s is not None]
    if not known:
        return None  # a key or index no alternative describes: the model's validation answers
    return _walk(value, {"anyOf": known}, defs, path)


def _judge_bool(alternatives: list[Schema], path: FieldPath) -> tuple[FieldPath, str] | None:
    kinds: set[str] = set()
    for alt in alternatives:
        kinds |= _kinds(alt)
    if "boolean" in kinds or "any" in kinds or not kinds & NUMBER_TYPES:
        return None
    return path, ("a number" if "number" in kinds else "an integer")


def _kinds(schema: Schema) -> set[str]:
    """The JSON types a schema admits ('any' when it does not say)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is None:
        return {"any"}
    return {_json_kind(v) for v in values}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string" if isinstance(value, str) else "any"


def _alternatives(schema: Schema, defs: Schema, depth: int = 0) -> list[Schema]:
    """`schema` with `$ref` resolved and `anyOf` / `oneOf` / `allOf` flattened into alternatives."""
    if depth > 64:
        return [{}]
    while "$ref" in schema:
        schema = {**defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), **{k: v for k, v in schema.items() if k != "$ref"}}
    out: list[Schema] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            out += _alternatives(sub, defs, depth + 1)
    own = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "allOf")}
    if not out or _constrains(own):
        out.append(own)
    return out


def _constrains(schema: Schema) -> bool:
    return any(k in schema for k in ("type", "enum", "const", "properties", "items", "prefixItems"))


def _property(schema: Schema, key: str) -> Schema | None:
    props = schema.get("properties", {})
    if key in props:
        return dict(props[key])
    extra = schema.get("additionalProperties")
    return dict(extra) if isinstance(extra, dict) else None


def _item(schema: Schema, index: int) -> Schema | None:
    prefix = schema.get("prefixItems", [])
    if index < len(prefix):
        return dict(prefix[index])
    items = schema.get("items")
    return dict(items) if isinstance(items, dict) else None


def _value_at(data: Any, path: FieldPath) -> Any:
    for step in path:
        data = data[step]
    return data


@functools.cache
def schema_of(annotation: Any) -> Schema:
    """The validation JSON schema of a body type (cached: the types are module-level classes)."""
    return TypeAdapter(annotation).json_schema(mode="validation")


async def strict_numbers(request: Request) -> None:
    """Dependency of every authenticated route (`api.deps.user` / `agent`, after the token is
    checked): refuse a JSON body holding a boolean where the route's body model wants a number (runs
    before the body is validated; a route without a body, or a body that is not JSON, is left alone).
    `request.json()` is the parse FastAPI already made of the body."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    if body_field is None or not await request.body():
        return
    try:
        data = await request.json()
    except ValueError:
        return
    check_no_bool_numbers(data, schema_of(body_field.field_info.annotation), ["body"])
