"""What the runtime refuses to run, raised by every module of it (the reference model, LoRA,
quantization, parallelization) and caught where a run is planned or launched."""

from __future__ import annotations


class NotSupportedError(NotImplementedError):
    """The reference model cannot represent this ModelSpec feature (or combination)."""
