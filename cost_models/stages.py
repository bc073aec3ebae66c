"""Pipeline stage partition: which layers each pipeline rank (and each virtual chunk) holds.

A partition is a tuple of layer counts, one per *chunk*, in model order. With `pp` ranks and `vpp`
virtual stages there are `pp * vpp` chunks; chunk `c` runs on rank `c % pp` (Megatron's
interleaved assignment), or, under a V-shape schedule (zbv, dualpipev: two chunks per rank), on
rank c and then 2pp - 1 - c (`cost_models.pipeline.chunk_rank`). The embedding is on chunk 0
(rank 0), the final norm, LM head and loss on the last chunk (rank pp - 1; rank 0 in a V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cost_models.pipeline import chunk_rank, is_v_shape


class SplitLike(Protocol):
    """What `StagePartition.for_layout` reads of a layout."""

    @property
    def pp(self) -> int: ...
    @property
    def vpp(self) -> int: ...
    @property
    def account_for_embedding_in_pipeline_split(self) -> bool: ...
    @property
    def account_for_loss_in_pipeline_split(self) -> bool: ...
    @property
    def decoder_first_pipeline_num_layers(self) -> int | None: ...
    @property
    def decoder_last_pipeline_num_layers(self) -> int | None: ...
    @property
    def uneven_split(self) -> bool: ...
    @property
    def schedule_(self) -> str: ...


def even_partition(num_layers: int, chunks: int) -> tuple[int, ...]:
    """Layers per chunk as even as possible; the remainder goes to the middle chunks, away from the
    first (embedding) and last (LM head + loss) chunks, which already carry extra work."""
    if chunks <= 0 or chunks > num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {chunks} chunks")
    base, extra = divmod(num_layers, chunks)
    counts = [base] * chunks
    # Fill from the centre outwards.
    order = sorted(range(chunks), key=lambda c: (abs(c - (chunks - 1) / 2), c))
    for c in order[:extra]:
        counts[c] += 1
    return tuple(counts)


def megatron_split(
    num_layers: int,
    pp: int,
    vpp: int = 1,
    *,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
) -> tuple[int, ...]:
    """Layers per chunk as Megatron-Core cuts them (`transformer_block.get_num_layers_to_build`).

    - `first_stage_layers` / `last_stage_layers` (`--decoder-first-pipeline-num-layers`,
      `--decoder-last-pipeline-num-layers`): the first / last pipeline rank holds that many layers;
      the others split the rest evenly. Each rank's layers are split evenly over its vpp chunks.
    - `account_for_embedding` / `account_for_loss` (`--account-for-embedding-in-pipeline-split`,
      `--account-for-loss-in-pipeline-split`): the embedding and the loss each take one layer slot,
      so the pp x vpp chunks split num_layers + slots evenly and the first (last) chunk holds one
      layer fewer. Llama-3.1-405B: 126 + 2 = 128 = 8 x 8 x 2.
    - Neither: every chunk holds num_layers / (pp x vpp) layers.
    Raises `ValueError` saying which count does not divide."""
    chunks = pp * vpp
    uneven = first_stage_layers is not None or last_stage_layers is not None
    if uneven and (account_for_embedding or account_for_loss):
        raise ValueError("give either the first/last pipeline stage layer counts or the account_for_* flags, not both")
    if uneven:
        rest, stages = num_layers, pp
        for n in (first_stage_layers, last_stage_layers):
            if n is not None:
                rest -= n
                stages -= 1
        if stages < 0 or rest < 0 or (stages == 0 and rest) or (stages and rest % stages):
            raise ValueError(
                f"the {rest} layers left after the first/last stage do not split evenly over the other {max(stages, 0)} pipeline ranks"
            )
        per_rank = [rest // stages if stages else 0] * pp
        if first_stage_layers is not None:
            per_rank[0] = first_stage_layers
        if last_stage_layers is not None:
            per_rank[-1] = last_stage_layers
        for r, n in enumerate(per_rank):
            if n % vpp:
                raise ValueError(f"pipeline rank {r} holds {n} layers, not divisible by vpp={vpp}")
        return tuple(per_rank[c % pp] // vpp for c in range(chunks))
    slots = num_layers + int(account_for_embedding) + int(account_for_loss)
    if slots % chunks:
        what = "layers" if slots == num_layers else f"layers + {slots - num_layers} slots ({slots})"
        raise ValueError(f"pp x vpp = {chunks} chunks do not divide the {num_layers} {what}")
    per = slots // chunks
    counts = [per] * chunks
    if account_for_embedding:
        counts[0] -= 1
    if account_for_loss:
        counts[-1] -= 1
    if min(counts) < 0:
        raise ValueError(f"{chunks} chunks of {per} slots leave a chunk with fewer than 0 layers")
    return tuple(counts)


@dataclass(frozen=True)
class StagePartition:
    """Layers per chunk plus the pipeline geometry they were cut for."""

    chunk_layers: tuple[int, ...]
    pp: int
    vpp: int = 1
    v_shape: bool = False  # chunks placed as a V (zbv, dualpipev: vpp = 2)

    def __post_init__(self) -> None:
        if len(self.chunk_layers) != self.pp * self.vpp:
            raise ValueError(f"{len(self.chunk_layers)} chunks given for pp={self.pp} x vpp={self.vpp}")
        if any(n < 0 for n in self.chunk_layers):
            raise ValueError("negative layer count in partition")
        if self.v_shape and self.vpp != 2:
            raise ValueError(f"a V-shape pipeline holds two chunks per rank, not vpp={self.vpp}")
        # the hash the dataclass would compute on every call (the pricing memos key on partitions),
        # the head rank and the layer count, once: not fields, so equality, `fields` and `asdict`
        # are as before
        object.__setattr__(self, "_hash", hash((self.chunk_layers, self.pp, self.vpp, self.v_shape)))
        object.__setattr__(self, "_head_rank", chunk_rank(self.pp * self.vpp - 1, self.pp, self.v_shape))
        object.__setattr__(self, "_num_layers", sum(self.chunk_layers))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    @property
    def chunk_ranks(self) -> tuple[int, ...]:
        """Pipeline rank of every chunk, in model order."""
        return tuple(chunk_rank(c, self.pp, self.v_shape) for c in range(self.pp * self.vpp))

    @property
    def head_rank(self) -> int:
        """The rank of the last chunk (final norm, LM head, loss): pp - 1, or 0 in a V."""
        return self._head_rank  # type: ignore[attr-defined, no-any-return]


    @classmethod
    def even(cls, num_layers: int, pp: int, vpp: int = 1, v_shape: bool = False) -> StagePartition:
        return cls(even_partition(num_layers, pp * vpp), pp, vpp, v_shape)

    @classmethod
    def explicit(cls, chunk_layers: tuple[int, ...] | list[int], layout: SplitLike) -> StagePartition:
        """A partition given chunk by chunk (a job's `partition`), placed as the layout's schedule
        places chunks. Raises `ValueError` when the chunk count is not pp x vpp."""
        return cls(tuple(chunk_layers), layout.pp, layout.vpp, is_v_shape(layout.schedule_, layout.pp))

    @classmethod
    def for_layout(cls, num_layers: int, layout: SplitLike) -> StagePartition:
        """The partition a layout asks for: Megatron-Core's split (`megatron_split`) when it sets
        an uneven-split option, else `even` (which Megatron also cuts when the layers divide)."""
        v_shape = is_v_shape(layout.schedule_, layout.pp)
        if layout.uneven_split:
            return cls(
                megatron_split(
                    num_layers, layout.pp, layout.vpp,
                    account_for_embedding=layout.account_for_embedding_in_pipeline_split,
                    account_for_loss=layout.account_for_loss_in_pipeline_split,
                    first_stage_layers=layout.decoder_first_pipeline_num_layers,
                    last_stage_layers=layout.decoder_last_pipeline_num_layers,
                ),
                layout.pp,
                layout.vpp,
                v_shape,
            )
        return cls.even(num_layers, layout.pp, layout.vpp, v_shape)

    @property
    def num_layers(self) -> int:
        return self._num_layers  # type: ignore[attr-defined, no-any-return]

    def problems(self, num_layers: int) -> list[str]:
        """Why this partition cannot train a model of `num_layers` layers (empty: it can): it must
        cover the layers, and every chunk must hold a layer, except the first (which holds the
        embedding) and the last (the LM head and loss)."""
        out = []
        if self.num_layers != num_layers:
            out.append(f"the chunks hold {self.num_layers} layers, the model has {num_layers}")
        empty = [c for c, n in enumerate(self.chunk_layers) if n == 0 and 0 < c < len(self.chunk_layers) - 1]
        if empty:
            out.append(f"chunks {empty} hold no layer (only the first and last chunk may: they hold the embedding / the loss)")
        return out

    def chunk_ranges(self) -> list[range]:
        """Global layer indices of every chunk, in model order."""
        out, start = [], 0
        for n in self.chunk_layers:
            out.append(range(start, start + n))
            start += n
        return out

    def rank_layers(self, rank: int) -> list[int]:
        """Global layer indices held by pipeline rank `rank` (all its virtual chunks)."""
        ranges = self.chunk_ranges()
        return [i for c, r in enumerate(self.chunk_ranks) if r == rank for i in ranges[c]]

    def rank_layer_counts(self) -> list[int]:
        return [len(self.rank_layers(r)) for r in range(self.pp)]
