"""Memory of the FSDP2 units at a model's two ends, as torchtitan and this project's runtime wrap them.

torchtitan's `apply_fsdp` (torchtitan/models/llama3/infra/parallelize.py at v0.2.2, 73a0e69) makes
the token embedding one FSDP2 unit, resharded after forward like the blocks under its default policy,
and the final norm with the output head another, never resharded after forward (FSDP would prefetch
it straight back for the backward, which starts there); tied embeddings are one unit of the
embedding, the norm and the head, not resharded after forward (torchtitan/distributed/fsdp.py
`apply_fsdp_to_decoder` at b5bcd76). `runtime.parallelize.edge_units` does the same. Under ZeRO-3
without a pipeline, a rank therefore holds the unsharded vocabulary tables only while their own
unit works, never both for the whole step as a root group holding them did:

- loss: the head unit stays gathered from the end of the forward through the loss;
- head backward: the gathered head, its unsharded gradient (compute dtype) and the output
  gradient of the logits, the next layer prefetched; at its post-backward the head is resharded and
  FSDP2 copies the gradient into its float32 reduce-scatter input (`foreach_reduce`), beside it;
- first layer's backward: the embedding unit prefetched (FSDP2's implicit backward prefetch) in
  place of the next layer a layer's backward prefetches;
- end of the backward: the embedding's unsharded gradient beside the gathered table, then beside
  its float32 reduce-scatter input (the embedding takes integer tokens, so FSDP2 runs its
  post-backward in the root's final callback).

The runtime also keeps the micro-batch's logits (the training loop's variable, compute dtype) until
the backward returns. Measured on fake-world traces (`runtime.fake_world`): the 0.55 B one-layer
Llama-3-vocabulary model, ZeRO-3 over 4 ranks in float32 peaks at the embedding's reduce-scatter
copy (1002 MiB gradient + 1002 MiB copy beside 250.5 MiB of retained logits), and Llama-3-8B FSDP
64 in the loss with the 1002 MiB bf16 head gathered.

The fine-tuning stacks (`Layout.stack`) keep the root-group pricing of `stage_table.price_memory`
(accelerate's transformer-based wrap policy leaves both ends in the root group). torchtitan itself
kept both ends in a root group resharded after forward until pytorch/torchtitan#1094 (2025-07-28;
`fully_shard(model, reshard_after_forward=not pp_enabled)` at 6b03ffa, December 2024), which is
how its published peaks (data/calibration, source torchtitan_2412) were measured: priced with these
units they come out 0.98 GiB (the bf16 head gathered through the loss) higher than with the root.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from model_specs.params import count_params
from model_specs.spec import ModelSpec, TrainingSpec

__all__ = ["EdgeUnits", "Phase", "edge_units", "single_stage_phases"]

REDUCE_BYTES = 4
"""Bytes per element of FSDP2's reduce-scatter input: float32, the reduce dtype of the runtime's
`MixedPrecisionPolicy` (and torchtitan's default `mixed_precision_reduce`)."""


class EdgeUnits(NamedTuple):
    """Elements of the end units a rank holds unsharded while they work (vocabulary-parallel
    tables divided by tp)."""

    embedding: float  # token table (+ learned position table): 0 when tied (then in `head`)
    head: float  # final norm + LM head (+ the embedding when tied)
    embedding_trained: float  # elements of `embedding` with a gradient
    head_trained: float
    tied: bool


def edge_units(model: ModelSpec, training: TrainingSpec, tp: int) -> EdgeUnits:
    """The end units of `model` under tensor parallelism `tp` (module doc)."""
    pc = count_params(model)
    trained = not training.frozen_base or training.trainable_embeddings
    if model.tie_embeddings:
        head = (pc.embedding + pc.final_norm) / tp
        return EdgeUnits(0.0, head, 0.0, head if trained else 0.0, True)
    emb, head = pc.embedding / tp, (pc.final_norm + pc.lm_head) / tp
    return EdgeUnits(emb, head, emb if trained else 0.0, head if trained else 0.0, False)


class Phase(NamedTuple):
    """One transient peak: its total and the parts the breakdown shows (the rest is buffers)."""

    total: np.ndarray
    grads: np.ndarray
    acts: np.ndarray
    logits: np.ndarray


def single_stage_phases(
    units: EdgeUnits,
    *,
    zero3: np.ndarray,
    param_bytes: float,
    accumulating: bool,
    shard: np.ndarray,
    acts: np.ndarray,
    grads: np.ndarray,
    logits: np.ndarray,
    layer_phase: np.ndarray,
    first_layer_acts: np.ndarray,
    retained_logits: float,
    logit_gradient: float,
    layer_weight: np.ndarray,
) -> list[Phase]:
    """The transient peaks of a step without a pipeline under FSDP2 (module doc), bytes per setting
    and rank: the loss, the head's backward, the layers' backward at its start (every activation)
    and end (every gradient, the first layer's activations), the embedding's backward.

    `zero3`: (J, 1) whether the setting gathers parameters (the units matter only then; otherwise
    the parameters are priced whole). `accumulating`: gradients exist before the backward (several
    micro-batches reduced each: the reduce-scatter output is a transient beside the accumulated
    shard); without it `grads` is counted only once the layers' backward has made them.
    `shard`: (J, 1) sharding group; `acts`, `grads`, `logits`, `layer_phase`, `first_layer_acts`:
    (J, pp) as `price_memory` prices them; `retained_logits`: the logits the loop keeps through the
    backward; `logit_gradient`: their gradient into the head; `layer_weight`: (pp,) gathered bytes of
    the largest layer (prefetched during the head's backward)."""
    u, r = param_bytes, REDUCE_BYTES
    z = zero3.astype(float)
    held = grads if accumulating else 0.0 * grads  # gradients alive before the layers' backward

    def unit_end(elements: float, trained: float) -> np.ndarray:
        # the gathered weights and then (resharded) the float32 reduce-scatter copy, beside the
        # unsharded gradient
        out = max(u * elements, r * trained) + u * trained
        if accumulating:
            out += r * trained / shard  # the reduce-scatter output before it is added to the shard
        return z * out

    prefetched = z * layer_weight
    if units.tied:  # one unit, gathered from its forward to the end of the backward
        gathered = z * (u * units.head)
        grad_wait = z * (u * units.head_trained)  # the head's gradient waits for the unit's reduction
        loss = held + acts + logits + gathered
        head = held + acts + retained_logits + logit_gradient + gathered + grad_wait + prefetched
        early = held + acts + layer_phase + retained_logits + gathered + grad_wait
        late = grads + first_layer_acts + layer_phase + retained_logits + gathered + grad_wait
        end = grads + retained_logits + unit_end(units.head, units.head_trained)
    else:
        loss = held + acts + logits + z * (u * units.head)
        head_compute = z * (u * (units.head + units.head_trained)) + logit_gradient
        head_end = unit_end(units.head, units.head_trained)
        head = held + acts + retained_logits + prefetched + np.maximum(head_compute, head_end)
        early = held + acts + layer_phase + retained_logits
        # the first layer's backward prefetches the embedding where the layer phase counts a next layer
        embedding_prefetch = np.maximum(0.0, z * (u * units.embedding) - prefetched)
        late = grads + first_layer_acts + layer_phase + retained_logits + embedding_prefetch
        end = grads + retained_logits + unit_end(units.embedding, units.embedding_trained)
    zero = 0.0 * acts
    return [
        Phase(loss, held, acts, logits),
        Phase(head, held, acts, zero),
        Phase(early, held, acts, zero),
        Phase(late, grads, first_layer_acts, zero),
        Phase(end, grads, zero, zero),
    ]
