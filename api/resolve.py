"""Turn a request's model and cluster references into specs: preset names, team specs stored with
POST /v1/models and /v1/clusters, or inline specs. Names never reach the filesystem (the CLI's
`get_model` also reads a config.json at a path; a service must not)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import ApiError
from api.models import TeamCluster, TeamModel
from api.numbers import check_no_bool_numbers, schema_of
from cluster_specs.presets import MissingUnitError, cluster_from_dict, get_cluster, list_clusters
from cluster_specs.spec import ClusterSpec
from model_specs.hf import from_hf_config
from model_specs.presets import PRESETS, list_models
from model_specs.spec import ModelSpec


def _invalid(loc: Sequence[str | int], msg: str, type: str = "value_error") -> ApiError:
    return ApiError(422, msg, loc, type)


def preset_model(name: str) -> ModelSpec | None:
    try:
        return PRESETS[name]
    except KeyError:
        return None


def preset_cluster(name: str) -> ClusterSpec | None:
    try:
        return get_cluster(name)
    except KeyError:
        return None


def model_from_fields(spec: dict[str, Any], loc: Sequence[str | int], name: str | None = None) -> ModelSpec:
    """ModelSpec fields or {"hf_config": {...}, "name": ...}; errors carry the request path `loc`."""
    try:
        if "hf_config" in spec:
            extra = set(spec) - {"hf_config", "name"}
            if extra:
                raise _invalid([*loc, sorted(extra)[0]], "with hf_config only 'name' may be given")
            cfg = spec["hf_config"]
            if not isinstance(cfg, dict):
                raise _invalid([*loc, "hf_config"], "hf_config must be a JSON object (a config.json)")
            given = spec.get("name")
            if given is not None and not isinstance(given, str):
                raise _invalid([*loc, "name"], "name must be a string")
            model = from_hf_config(cfg, name=name or given)
        else:
            check_no_bool_numbers(spec, schema_of(ModelSpec), loc)
            fields = dict(spec)
            if name is not None:
                fields["name"] = name
            model = ModelSpec(**fields)
    except ApiError:
        raise
    except ValidationError as exc:
        raise ApiError.from_validation(exc, [*loc, "hf_config"] if "hf_config" in spec else loc) from exc
    except Exception as exc:  # from_hf_config reads arbitrary user JSON: every failure is the input's
        raise _invalid([*loc, "hf_config"], f"cannot read this config.json: {type(exc).__name__}: {exc}") from exc
    return model


def cluster_from_fields(spec: dict[str, Any], loc: Sequence[str | int], name: str | None = None) -> ClusterSpec:
    check_no_bool_numbers(spec, schema_of(ClusterSpec), loc)
    try:
        return cluster_from_dict(spec, name=name)
    except ValidationError as exc:
        raise ApiError.from_validation(exc, loc) from exc
    except KeyError as exc:
        msg = exc.args[0] if exc.args else str(exc)
        raise _invalid([*loc, "gpu"], str(msg), "unknown_gpu") from exc
    except MissingUnitError as exc:
        raise _invalid([*loc, *exc.path], str(exc), "missing_unit") from exc
    except (ValueError, TypeError, AttributeError) as exc:
        raise _invalid(loc, str(exc)) from exc


def _stored(kind: Any, spec: dict[str, Any], what: str, name: str, loc: Sequence[str | int]) -> Any:
    """A team spec as stored; one stored before today's bounds (`model_specs`, `cluster_specs`) and
    outside them is refused by name, with the field and the bound, instead of failing the request."""
    try:
        return kind(**spec)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise _invalid(
            loc, f"team {what} {name!r} was stored before the service bounded its sizes and is outside them now "
            f"({field}: {first['msg']}); store it again under a new name (POST /v1/{what}s) with the field in bounds",
            "stale_team_spec",
        ) from exc


def resolve_model_ref(session: Session, ref: str | dict[str, Any], loc: Sequence[str | int]) -> ModelSpec:
    if isinstance(ref, dict):
        return model_from_fields(ref, loc)
    spec = preset_model(ref)
    if spec is not None:
        return spec
    row = session.scalar(select(TeamModel).where(TeamModel.name == ref))
    if row is not None:
        return _stored(ModelSpec, row.spec, "model", ref, loc)
    raise _invalid(
        loc, f"unknown model {ref!r}: not a preset ({', '.join(list_models())}) nor a team model (GET /v1/models)",
        "unknown_model",
    )


def resolve_cluster_ref(session: Session, ref: str | dict[str, Any], loc: Sequence[str | int]) -> ClusterSpec:
    if isinstance(ref, dict):
        return cluster_from_fields(ref, loc)
    spec = preset_cluster(ref)
    if spec is not None:
        return spec
    row = session.scalar(select(TeamCluster).where(TeamCluster.name == ref))
    if row is not None:
        return _stored(ClusterSpec, row.spec, "cluster", ref, loc)
    raise _invalid(
        loc,
        f"unknown cluster {ref!r}: not a preset ({', '.join(list_clusters())}) nor a team cluster (GET /v1/clusters)",
        "unknown_cluster",
    )
