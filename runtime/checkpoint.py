"""Start a run from a HuggingFace checkpoint: each rank reads only the slices of the tensors it holds.

A checkpoint directory holds `config.json` and the weights as safetensors: one `model.safetensors`,
or shards listed by `model.safetensors.index.json` (its `weight_map`: tensor name -> file), as
transformers' `save_pretrained` writes them. `HFCheckpoint.open(directory, spec)` checks it against
the run before anything is built, and refuses, naming what does not match:

- the model type must be one whose names this module maps (`FAMILIES`: llama, mistral, qwen2, qwen3,
  mixtral, phi3);
- the config's architecture (`model_specs.hf.from_hf_config`) must equal the run's ModelSpec in every
  field that shapes a tensor or the forward (`ARCHITECTURE_FIELDS`);
- every parameter of the runtime's model must find its tensor, of the right shape, and every tensor
  of the checkpoint must be used (a rotary `inv_freq` buffer, which older checkpoints saved, and a
  tied LM head's copy aside).

Names (transformers' `modeling_*.py` of each family, read for v4.40-5.x; the runtime's names are
`runtime.model`'s):

    model.embed_tokens.weight -> tok_embeddings.weight     model.norm.weight -> norm.weight
    lm_head.weight -> output.weight (absent when tied)
    model.layers.{i}.input_layernorm / post_attention_layernorm -> layers.{i}.attention_norm / ffn_norm
    model.layers.{i}.self_attn.{q,k,v,o}_proj -> layers.{i}.attention.w{q,k,v,o} (weight, bias)
    model.layers.{i}.self_attn.{q,k}_norm -> layers.{i}.attention.{q,k}_norm (Qwen3)
    model.layers.{i}.mlp.{gate,up,down}_proj -> layers.{i}.mlp.w{1,3,2}
    Phi-3's fused model.layers.{i}.self_attn.qkv_proj (rows q | k | v) and mlp.gate_up_proj
    (rows gate | up) are cut into wq, wk, wv and w1, w3;
    Mixtral: model.layers.{i}.block_sparse_moe.gate -> layers.{i}.mlp.router and the per-expert
    block_sparse_moe.experts.{e}.w{1,2,3} stacked into layers.{i}.mlp.experts.w{1,2,3} (the format
    save_pretrained writes, transformers 5.24 included), or transformers 5's fused
    mlp.experts.gate_up_proj (E, 2 x ffn, h: gate | up) and mlp.experts.down_proj, with mlp.gate.

Both use rotate-half RoPE on q and k as stored (HF's convention, which `runtime.model` follows), so
no row permutation. What `ModelSpec` does not carry is read from config.json and handed to the model
(`numerics`): the RoPE base (`rope_theta`, or `rope_parameters.rope_theta` in transformers 5), its
scaling (`rope_scaling` / `rope_parameters`: default, linear or llama3; any other type is refused)
and the norms' epsilon (`rms_norm_eps`).

Loading (`HFCheckpoint.load`): for every local parameter (a tensor or a DTensor shard: its global
offset and shape, `runtime.weights.local_box`) the rank reads the box it holds with
`safe_open(...).get_slice(name)[slices]` (safetensors reads those bytes only), converts it to the
parameter's dtype and copies it into place; Mixtral's stacked experts read only the local experts.
Each tensor is read with the file opened and closed around it, so the file pages a read maps are
released before the next (they count in the process's resident memory while mapped). LoRA adapters
are not in a base checkpoint: they keep their seeded values (B = 0: the run starts at the base).
A QLoRA base weight is read whole in the checkpoint's dtype and quantized to NF4 on the rank's
device (`runtime.quantize.store_`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model_specs.hf import from_hf_config
from model_specs.spec import ModelSpec
from runtime.quantize import is_quantized, store_
from runtime.weights import global_names, is_symbolic, local_box

__all__ = ["ARCHITECTURE_FIELDS", "FAMILIES", "CheckpointError", "HFCheckpoint", "Source", "architecture_differences"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "phi3")
"""HF model types whose tensor names `_sources` maps onto `runtime.model`."""

ARCHITECTURE_FIELDS = (
    "vocab_size", "hidden_size", "num_layers", "num_heads", "kv_heads", "qk_head_dim", "ffn_hidden_size", "mlp",
    "norm", "qkv_bias", "attn_out_bias", "mlp_bias", "qk_norm", "qk_norm_scope", "norm_placement",
    "tie_embeddings", "position_embedding", "parallel_residual", "sliding_window", "sliding_window_every",
    "window_kind", "attention", "num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts",
    "router_bias",
)
"""ModelSpec fields that must agree between the run and the checkpoint's config.json: they shape a
tensor or the forward. Head width and KV heads are compared as resolved (`qk_head_dim`, `kv_heads`):
transformers 5 writes `head_dim` where a preset leaves it to hidden / heads. The RoPE base and
scaling come from the checkpoint (`numerics`)."""

IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")
"""Checkpoint tensors that are buffers the model recomputes (older Llama checkpoints saved them)."""

ROPE_TYPES = ("default", "linear", "llama3")
"""RoPE scalings `runtime.model.RotaryEmbedding` computes (HF `ROPE_INIT_FUNCTIONS` of those names)."""


class CheckpointError(ValueError):
    """The checkpoint does not match the run (the message names what)."""


@dataclass(frozen=True)
class Source:
    """Where one runtime parameter lives in the checkpoint: the tensor `keys[0]`, or, `stacked`,
    one tensor per index of the parameter's dim 0 (Mixtral's experts); within it, `dim` / `start`
    give the parameter's offset in a fused tensor (Phi-3's qkv_proj, gate_up_proj)."""

    keys: tuple[str, ...]
    dim: int = 0
    start: int = 0
    stacked: bool = False
    fused: bool = False  # a part of `keys[0]` along `dim`, from `start`


def _llama_layer(i: int, spec: ModelSpec, keys: set[str], fused: bool) -> dict[str, Source]:
    p, o = f"model.layers.{i}.", f"layers.{i}."
    out = {
        o + "attention_norm.weight": Source((p + "input_layernorm.weight",)),
        o + "ffn_norm.weight": Source((p + "post_attention_layernorm.weight",)),
        o + "attention.wo.weight": Source((p + "self_attn.o_proj.weight",)),
    }
    d = spec.qk_head_dim
    q_rows, kv_rows = spec.num_heads * d, spec.kv_heads * d
    for ours, hf, start in (("wq", "q_proj", 0), ("wk", "k_proj", q_rows), ("wv", "v_proj", q_rows + kv_rows)):
        for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
            if fused:
                out[f"{o}attention.{ours}.{kind}"] = Source((f"{p}self_attn.qkv_proj.{kind}",), 0, start, fused=True)
            else:
                out[f"{o}attention.{ours}.{kind}"] = Source((f"{p}self_attn.{hf}.{kind}",))
    if spec.qk_norm:
        out[o + "attention.q_norm.weight"] = Source((p + "self_attn.q_norm.weight",))
        out[o + "attention.k_norm.weight"] = Source((p + "self_attn.k_norm.weight",))
    if spec.is_moe_layer(i):
        out.update(_mixtral_moe(p, o, spec, keys))
    elif fused:
        out[o + "mlp.w1.weight"] = Source((p + "mlp.gate_up_proj.weight",), 0, 0, fused=True)
        out[o + "mlp.w3.weight"] = Source((p + "mlp.gate_up_proj.weight",), 0, spec.ffn_hidden_size, fused=True)
        out[o + "mlp.w2.weight"] = Source((p + "mlp.down_proj.weight",))
    else:
        for ours, hf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[f"{o}mlp.{ours}.weight"] = Source((f"{p}mlp.{hf}.weight",))
    return out


def _mixtral_moe(p: str, o: str, spec: ModelSpec, keys: set[str]) -> dict[str, Source]:
    """Mixtral's experts: per-expert tensors (save_pretrained's format) or transformers 5's fused ones."""
    if p + "mlp.experts.gate_up_proj" in keys:
        ffn = spec.moe_ffn_hidden_size or 0
        return {
            o + "mlp.router.weight": Source((p + "mlp.gate.weight",)),
            o + "mlp.experts.w1": Source((p + "mlp.experts.gate_up_proj",), 1, 0, fused=True),
            o + "mlp.experts.w3": Source((p + "mlp.experts.gate_up_proj",), 1, ffn, fused=True),
            o + "mlp.experts.w2": Source((p + "mlp.experts.down_proj",)),
        }
    experts = range(spec.num_experts)
    return {
        o + "mlp.router.weight": Source((p + "block_sparse_moe.gate.weight",)),
        **{
            f"{o}mlp.experts.{w}": Source(tuple(f"{p}block_sparse_moe.experts.{e}.{w}.weight" for e in experts), stacked=True)
            for w in ("w1", "w2", "w3")
        },
    }


def _sources(model_type: str, spec: ModelSpec, keys: set[str]) -> dict[str, Source]:
    """Runtime parameter name -> its Source, for the whole model (module doc)."""
    out = {"tok_embeddings.weight": Source(("model.embed_tokens.weight",)), "norm.weight": Source(("model.norm.weight",))}
    if not spec.tie_embeddings:
        out["output.weight"] = Source(("lm_head.weight",))
    for i in range(spec.num_layers):
        out.update(_llama_layer(i, spec, keys, fused=model_type == "phi3"))
    return out


def _rope_numerics(config: dict[str, Any]) -> dict[str, Any]:
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = config.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    out: dict[str, Any] = {}
    if theta is not None:
        out["rope_theta"] = float(theta)
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise CheckpointError(
                f"config.json: rope scaling {kind!r} is not computed by the runtime's model (it computes {', '.join(ROPE_TYPES)})"
            )
        if kind != "default":
            out["rope_scaling"] = {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind}
    return out


def architecture_differences(config: dict[str, Any], spec: ModelSpec) -> list[str]:
    """The `ARCHITECTURE_FIELDS` in which a config.json (`model_specs.hf.from_hf_config`) and the
    run's ModelSpec differ, each as "field (checkpoint X, run Y)"; empty when they agree."""
    ckpt = from_hf_config(config)
    return [
        f"{f} (checkpoint {getattr(ckpt, f)!r}, run {getattr(spec, f)!r})"
        for f in ARCHITECTURE_FIELDS
        if getattr(ckpt, f) != getattr(spec, f)
    ]


class HFCheckpoint:
    """A checked HuggingFace checkpoint directory (module doc). Build with `HFCheckpoint.open`."""

    def __init__(self, directory: Path, config: dict[str, Any], files: dict[str, Path],
                 shapes: dict[str, tuple[int, ...]], sources: dict[str, Source]) -> None:
        self.directory = directory
        self.config = config
        self.files = files  # tensor name -> the safetensors file holding it
        self.shapes = shapes
        self.sources = sources
        self.numerics: dict[str, Any] = _rope_numerics(config)
        eps = config.get("rms_norm_eps")
        if isinstance(eps, int | float) and not isinstance(eps, bool):
            self.numerics["norm_eps"] = float(eps)

    @classmethod
    def open(cls, directory: str | Path, spec: ModelSpec) -> HFCheckpoint:
        """Read and check `directory` against the run's `spec` (module doc); CheckpointError names
        every mismatch found."""
        from safetensors import safe_open

        root = Path(directory)
        cfg_path = root / "config.json"
        try:
            config = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{cfg_path}: cannot read the checkpoint's config ({exc})") from exc
        model_type = config.get("model_type")
        if model_type not in FAMILIES:
            raise CheckpointError(
                f"{cfg_path}: model_type {model_type!r}: the runtime maps the tensor names of {', '.join(FAMILIES)} only"
            )
        differ = architecture_differences(config, spec)
        if differ:
            raise CheckpointError(f"{cfg_path} describes another model than the run's: {'; '.join(differ)}")
        files = cls._weight_files(root)
        shapes: dict[str, tuple[int, ...]] = {}
        for path in sorted(set(files.values())):
            if not path.exists():
                raise CheckpointError(f"{root}: the index names {path.name}, which is not there")
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if files.get(key) == path:
                        shapes[key] = tuple(f.get_slice(key).get_shape())
        lacking = sorted(k for k in files if k not in shapes)
        if lacking:
            raise CheckpointError(f"{root}: the index names tensors its files lack: {', '.join(lacking[:8])}")
        sources = _sources(model_type, spec, set(shapes))
        ckpt = cls(root, config, files, shapes, sources)
        ckpt._check(spec)
        return ckpt

    @staticmethod
    def _weight_files(root: Path) -> dict[str, Path]:
        index = root / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
            return {k: root / v for k, v in weight_map.items()}
        single = root / "model.safetensors"
        if not single.exists():
            raise CheckpointError(f"{root}: no model.safetensors nor model.safetensors.index.json (safetensors only)")
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {k: single for k in f.keys()}  # noqa: SIM118

    def _check(self, spec: ModelSpec) -> None:
        """Every runtime parameter has its tensor, of its shape; every tensor is used."""
        from runtime.model import build_model

        meta = build_model(spec, device="meta", dtype=torch.float32)
        problems: list[str] = []
        used: set[str] = set()
        for name, p in meta.named_parameters():
            src = self.sources.get(name)
            if src is None:
                problems.append(f"{name}: no checkpoint tensor is mapped to it")
                continue
            for key in src.keys:
                used.add(key)
                if key not in self.shapes:
                    problems.append(f"{name}: the checkpoint has no {key}")
                    continue
                want = tuple(p.shape[1:]) if src.stacked else tuple(p.shape)
                have = self.shapes[key]
                if src.fused:
                    fits = len(have) == len(want) and have[src.dim] >= src.start + want[src.dim] and all(
                        h == w for d, (h, w) in enumerate(zip(have, want, strict=True)) if d != src.dim
                    )
                else:
                    fits = have == want
                if not fits:
                    problems.append(f"{name}: {key} has shape {list(have)}, the model needs {list(want)}"
                                    + (f" from offset {src.start} of dim {src.dim}" if src.fused else ""))
        unused = sorted(
            k for k in self.shapes
            if k not in used and not IGNORED.match(k) and not (k == "lm_head.weight" and spec.tie_embeddings)
        )
        if unused:
            problems.append(f"tensors the model has no parameter for: {', '.join(unused[:8])}"
                            + (f" and {len(unused) - 8} more" if len(unused) > 8 else ""))
        if problems:
            raise CheckpointError(f"{self.directory}: " + "; ".join(problems[:12]))

    # ---- loading -----------------------------------------------------------------------------------
    def _read(self, key: str, slices: tuple[slice, ...]) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.files[key]), framework="pt") as f:
            return f.get_slice(key)[slices]

    def read_box(self, name: str, offset: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The box [offset, offset + shape) of runtime parameter `name`, as stored (its dtype)."""
        src = self.sources[name]
        box = [slice(o, o + n) for o, n in zip(offset, shape, strict=True)]
        if src.stacked:
            return torch.stack([self._read(src.keys[e], tuple(box[1:])) for e in range(offset[0], offset[0] + shape[0])])
        if src.fused:
            box[src.dim] = slice(src.start + offset[src.dim], src.start + offset[src.dim] + shape[src.dim])
        return self._read(src.keys[0], tuple(box))

    @torch.no_grad()
    def load(self, chunks: list[nn.Module]) -> int:
        """Fill the local shards of every checkpoint parameter of `chunks` (module doc). Returns the
        bytes of the largest box read (what one read stages in host memory)."""
        names = global_names(chunks)
        staged = 0
        for chunk in chunks:
            for p in chunk.parameters():
                name = names[id(p)]
                if name.endswith((".lora_A", ".lora_B")):
                    continue  # adapters: seeded (runtime.lora.init_adapters)
                local, _, offset = local_box(p)
                if is_symbolic(local) or local.numel() == 0:
                    continue
                if name not in self.sources:
                    raise CheckpointError(f"{self.directory}: no checkpoint tensor for {name}")
                data = self.read_box(name, offset, tuple(local.shape))
                staged = max(staged, data.numel() * data.element_size())
                if is_quantized(local):
                    store_(local, data.to(local.device))  # QLoRA: quantized on the device, one weight at a time
                else:
                    local.copy_(data)
        return staged
