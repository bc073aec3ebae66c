"""ZeRO model-state memory against the ZeRO paper's Figure 1 (7.5B parameters, 64-way DP,
mixed-precision Adam, K = 12): 120 / 31.4 / 16.6 / 1.9 GB (GB = 1e9 bytes)."""

import pytest

from cost_models.memory import model_state_bytes
from model_specs.spec import TrainingSpec

TRAINING = TrainingSpec(seq_len=1024, global_batch=64)
PSI = 7.5e9


@pytest.mark.parametrize(
    ("stage", "expected_gb"),
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_paper_figure_1(stage: int, expected_gb: float) -> None:
    states = model_state_bytes(PSI, stage, 64, TRAINING)
    total_gb = sum(states.values()) / 1e9
    # The paper prints one decimal: 31.40625, 16.640625, 1.875 round to 31.4, 16.6, 1.9.
    assert round(total_gb, 1) == expected_gb


def test_exact_values() -> None:
    # 2 + 2 + 12 bytes/param, sharded progressively: exact arithmetic, no rounding.
    assert sum(model_state_bytes(PSI, 0, 64, TRAINING).values()) == 16 * PSI
    assert sum(model_state_bytes(PSI, 1, 64, TRAINING).values()) == 4 * PSI + 12 * PSI / 64
    assert sum(model_state_bytes(PSI, 2, 64, TRAINING).values()) == 2 * PSI + 14 * PSI / 64
    assert sum(model_state_bytes(PSI, 3, 64, TRAINING).values()) == 16 * PSI / 64


def test_offload_moves_optimizer_off_gpu() -> None:
    states = model_state_bytes(PSI, 2, 64, TRAINING, offload=True)
    assert states["optimizer"] == 0


def test_fp32_gradients_add_two_bytes() -> None:
    t = TrainingSpec(seq_len=1024, global_batch=64, grad_dtype="fp32")
    assert sum(model_state_bytes(PSI, 0, 1, t).values()) == 18 * PSI
