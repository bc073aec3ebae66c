"""The five helpers `megatron/training/arguments.py` imports from upstream's
`megatron/training/utils.py` (Megatron-LM core_v0.16.1), without the rest of that module, which
imports the trainer, apex and the legacy model.

`print_rank_0`, `warn_rank_0`, `is_rank0` and `update_use_dist_ckpt` are upstream's code.
`get_device_arch_version` is the one import stub: upstream reads the compute capability of
`cuda:0`, which a CPU-only machine lacks; here it returns `ARCH_MAJOR`, which the test sets to
the planned GPU's compute capability (9 for H100/H200/H800) before calling `validate_args`."""

import warnings

from megatron.core._rank_utils import safe_get_rank as _safe_get_rank

ARCH_MAJOR = 9
"""Compute-capability major of the GPU the plan targets (8 Ampere, 9 Hopper, 10 Blackwell)."""


def print_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, print only on rank 0."""
    if rank is not None:
        if rank == 0:
            print(message, flush=True)
    else:
        if _safe_get_rank() == 0:
            print(message, flush=True)


def warn_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, warn only on rank 0."""
    if rank is not None:
        if rank == 0:
            warnings.warn(message)
    else:
        if _safe_get_rank() == 0:
            warnings.warn(message)


def is_rank0():
    """Returns true if called in the rank0, false otherwise."""
    return _safe_get_rank() == 0


def get_device_arch_version():
    """GPU arch version of the planned GPU (8: Ampere, 9: Hopper, 10: Blackwell, ...)."""
    return ARCH_MAJOR


def update_use_dist_ckpt(args):
    args.use_dist_ckpt = args.ckpt_format != "torch"
