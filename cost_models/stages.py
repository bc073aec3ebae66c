"""Pipeline stage partition: which layers each pipeline rank (and each virtual chunk) holds.

A partition is a tuple of layer counts, one per *chunk*, in model order. With `pp` ranks and `vpp`
virtual stages there are `pp * vpp` chunks; chunk `c` runs on rank `c % pp` (Megatron's
interleaved assignment). The embedding is on chunk 0 (rank 0), the final norm, LM head and loss on
the last chunk (rank pp - 1).
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class StagePartition:
    """Layers per chunk plus the pipeline geometry they were cut for."""

    chunk_layers: tuple[int, ...]
    pp: int
    vpp: int = 1

    def __post_init__(self) -> None:
        if len(self.chunk_layers) != self.pp * self.vpp:
            raise ValueError(f"{len(self.chunk_layers)} chunks given for pp={self.pp} x vpp={self.vpp}")
        if any(n < 0 for n in self.chunk_layers):
            raise ValueError("negative layer count in partition")

    @classmethod
    def even(cls, num_layers: int, pp: int, vpp: int = 1) -> StagePartition:
        return cls(even_partition(num_layers, pp * vpp), pp, vpp)

    @property
    def num_layers(self) -> int:
        return sum(self.chunk_layers)

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
        return [i for c in range(rank, self.pp * self.vpp, self.pp) for i in ranges[c]]

    def rank_layer_counts(self) -> list[int]:
        return [len(self.rank_layers(r)) for r in range(self.pp)]
