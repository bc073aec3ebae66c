"""LoRA adapters in the reference runtime (`runtime.lora`): unit checks on the model and real
2-process gloo runs checked against one process.

The multi-process cases run in one `torchrun --nproc_per_node=2 -m runtime.verify` job; each is
compared with a single-process run of the same RunSpec (same seed, data, optimizer and global
batch), at the tolerances of tests/runtime/test_parallel_layouts.py (fp32; the parallel runs
reorder sums): losses relative 1e-5, parameters after SGD absolute 1e-5, after AdamW 2e-4. The
bf16 case (FSDP2 mixed precision against single-process autocast) checks losses to 1e-3 relative
and the dtypes, not the adapters' values. Every case checks that the frozen base is bit-identical
to its initial value after the steps and that every adapter changed.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from model_specs.params import layer_linears, trainable_counts  # noqa: E402
from model_specs.presets import get_model  # noqa: E402
from model_specs.spec import ModelSpec, TrainingSpec  # noqa: E402
from runtime.lora import LoRALinear, apply_lora  # noqa: E402
from runtime.model import NotSupportedError, build_model  # noqa: E402
from runtime.spec import load_run_spec  # noqa: E402
from runtime.train import train  # noqa: E402
from runtime.verify import launch, load_results  # noqa: E402

NPROC = 2
STEPS = 3
LOSS_RTOL = 1e-5
SGD_ATOL = 1e-5
ADAMW_ATOL = 2e-4
BF16_LOSS_RTOL = 1e-3


def _training(**kw: Any) -> TrainingSpec:
    return TrainingSpec(seq_len=32, global_batch=8, precision="fp32", **{"method": "lora", **kw})


def _variant(**changes: Any) -> ModelSpec:
    return ModelSpec.model_validate({**get_model("tiny").model_dump(), "name": "tiny-variant", **changes})


def _lora_model(spec: ModelSpec, training: TrainingSpec, seed: int = 0):  # type: ignore[no-untyped-def]
    """(base model, the same weights with adapters) for `spec`."""
    torch.manual_seed(seed)
    base = build_model(spec)
    model = build_model(spec)
    model.load_state_dict(base.state_dict())
    apply_lora(model, training)
    return base, model


# ---- unit: counts, names, numerics -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "targets"),
    [("tiny", None), ("tiny", ("k_proj", "down_proj")), ("tiny-mla", "attention"), ("tiny-moe", "attention")],
)
def test_trainable_parameters_match_the_cost_model(model: str, targets: Any) -> None:
    spec = get_model(model)
    tr = _training(lora_targets=targets, lora_rank=8 if targets else None)
    _, m = _lora_model(spec, tr)
    counts = trainable_counts(spec, "lora", tr.lora_modules, tr.lora_rank_)
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in m.parameters() if not p.requires_grad)
    assert trainable == counts.trainable == counts.adapters > 0
    assert frozen == counts.frozen
    # every trainable parameter is an adapter
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    assert all(n.endswith((".lora_A", ".lora_B")) for n in names), names[:4]


@pytest.mark.parametrize(
    "spec",
    [get_model("tiny"), get_model("tiny-mla"), _variant(mlp="gelu", mlp_bias=True, qkv_bias=True)],
    ids=["llama", "mla", "two-matrix-mlp"],
)
def test_adapted_modules_are_the_cost_models_linears(spec: ModelSpec) -> None:
    """The PEFT-name map (runtime.lora module doc) picks, per layer, the linears that
    model_specs.params.layer_linears lists under the same names, with the same in/out features."""
    moe = spec.is_moe
    tr = _training(lora_targets="attention" if moe else "all-linear", lora_rank=4)
    _, m = _lora_model(spec, tr)
    got = sorted(
        (int(name.split(".")[1]), mod.peft_name, mod.in_features, mod.out_features, tuple(mod.lora_A.shape),
         tuple(mod.lora_B.shape))
        for name, mod in m.named_modules()
        if isinstance(mod, LoRALinear)
    )
    want = sorted(
        (i, x.name, x.in_features, x.out_features, (4, x.in_features), (x.out_features, 4))
        for i in range(spec.num_layers)
        for x in layer_linears(spec, i)
        if x.name in tr.lora_modules
        for _ in range(x.count)
    )
    assert got == want


def test_output_at_init_equals_base_and_frozen_weights_get_no_grad() -> None:
    spec = get_model("tiny")
    base, m = _lora_model(spec, _training())
    tokens = torch.randint(0, spec.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    out = m(tokens)
    assert torch.equal(out, base(tokens))  # B = 0: the adapters add exact zeros
    a = m.layers["0"].attention.wq.lora_A
    assert a.abs().max() > 0  # A is initialised (Kaiming-uniform), B is zero
    bound = 1 / spec.hidden_size**0.5  # kaiming_uniform(a=sqrt(5)) on fan_in = in: U(-1/sqrt(in), 1/sqrt(in))
    assert a.abs().max() <= bound
    assert all(mod.lora_B.count_nonzero() == 0 for mod in m.modules() if isinstance(mod, LoRALinear))
    targets = torch.randint(0, spec.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2))
    torch.nn.functional.cross_entropy(out.flatten(0, 1), targets.flatten()).backward()
    for name, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, name
        else:
            assert p.grad is None, name
    # at B = 0 only B gets a non-zero gradient (dL/dA = B^T ... = 0)
    assert m.layers["0"].mlp.w2.lora_B.grad.abs().max() > 0
    assert m.layers["0"].mlp.w2.lora_A.grad.abs().max() == 0


def test_scaling_is_alpha_over_rank() -> None:
    spec = get_model("tiny")
    tr = _training(lora_rank=4, lora_alpha=12.0, lora_targets=("o_proj",))
    _, m = _lora_model(spec, tr)
    wo = m.layers["1"].attention.wo
    assert wo.scaling == 3.0
    with torch.no_grad():
        wo.lora_B.normal_()
    x = torch.randn(3, wo.in_features)
    want = x @ wo.weight.T + (x @ wo.lora_A.T @ wo.lora_B.T) * 3.0
    torch.testing.assert_close(wo(x), want)


def test_base_dtype_stores_the_frozen_base_and_keeps_ties() -> None:
    spec = _variant(tie_embeddings=True)
    torch.manual_seed(0)
    m = build_model(spec)
    apply_lora(m, _training(), base_dtype=torch.bfloat16)
    assert m.output is not None and m.tok_embeddings is not None
    assert m.output.weight is m.tok_embeddings.weight
    dtypes = {(p.requires_grad, p.dtype) for p in m.parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}


def test_full_training_is_untouched() -> None:
    m = build_model(get_model("tiny"))
    assert apply_lora(m, TrainingSpec(seq_len=32, global_batch=8)) == []
    assert all(p.requires_grad for p in m.parameters())


@pytest.mark.parametrize(
    ("model", "training", "match"),
    [
        ("tiny", {"method": "qlora", "quant_format": "int8"}, "nf4_double"),
        ("tiny", {"method": "qlora"}, r"layers\.0\.attention\.wk\.weight has 4096 elements, not a multiple of 64 x 256"),
        ("tiny-moe", {"method": "qlora", "lora_targets": "attention"}, "routed experts"),
        ("tiny-moe", {}, "routed experts"),
        ("tiny-moe", {"lora_targets": ("up_proj",)}, "routed experts"),
    ],
)
def test_unsupported_combinations_raise(model: str, training: dict[str, Any], match: str) -> None:
    m = build_model(get_model(model))
    tr = TrainingSpec(seq_len=32, global_batch=8, **{"method": "lora", **training})
    with pytest.raises(NotSupportedError, match=match):
        apply_lora(m, tr)


# ---- QLoRA: the base's linears in NF4 (runtime/quantize.py) ------------------------------------------

TINY_256 = _variant(hidden_size=256, num_heads=4, num_kv_heads=2, ffn_hidden_size=512)
"""Every linear a multiple of 64 x 256 elements (NF4 blocks and their double-quantization groups)."""


NF4_DOUBLE = TrainingSpec(seq_len=32, global_batch=4, method="qlora")  # the cost model's bytes per element


def _qlora_run(method: str = "qlora", **layout: Any):  # type: ignore[no-untyped-def]
    return load_run_spec({"model": TINY_256.model_dump(), "gpus": 1, "layout": {"framework": "fsdp", **layout},
                          "training": {"seq_len": 32, "global_batch": 4, "method": method, "lora_rank": 8,
                                       "optimizer": "adamw"}, "seed": 2})


def test_qlora_base_is_the_lora_base_in_nf4() -> None:
    """The runtime quantizes each seeded base weight into place: the same values as the lora run's
    base, through NF4, at the cost model's bytes per element; everything else is the lora run's."""
    pytest.importorskip("torchao")
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    from runtime.quantize import is_quantized
    from runtime.train import Trainer

    lora = dict(Trainer(_qlora_run("lora"), torch.device("cpu")).parts.chunks[0].named_parameters())
    qlora = dict(Trainer(_qlora_run(), torch.device("cpu")).parts.chunks[0].named_parameters())
    assert lora.keys() == qlora.keys()
    quantized = {n for n, p in qlora.items() if is_quantized(p)}
    assert quantized == {n for n in lora if n.startswith("layers.") and n.endswith(".weight") and lora[n].dim() == 2}
    for n, p in qlora.items():
        if n in quantized:
            assert torch.equal(p.get_original_weight(), to_nf4(lora[n].detach()).get_original_weight()), n
            stored = sum(getattr(p, k).numel() * getattr(p, k).element_size()
                         for k in ("quantized_data", "quantized_scalers", "quantization_factor"))
            assert stored / p.numel() == pytest.approx(NF4_DOUBLE.quantized_weight_bytes, rel=1e-3)
        else:
            assert torch.equal(p, lora[n]), n


def test_qlora_trains_and_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    from runtime.train import train

    run = _qlora_run()
    whole = train(run, steps=4)
    assert whole.losses[-1] < whole.losses[0]
    train(run, steps=2, checkpoint_dir=tmp_path)
    resumed = train(run, steps=4, checkpoint_dir=tmp_path)
    assert resumed.start_step == 2 and resumed.losses == whole.losses[2:]


def test_qlora_with_data_parallelism_is_refused() -> None:
    from runtime.parallelize import check_supported

    run = load_run_spec({**_qlora_run().model_dump(mode="json"), "gpus": 2, "layout": {"framework": "fsdp"}})
    with pytest.raises(NotSupportedError, match="qlora with data parallelism"):
        check_supported(run)


def test_targets_the_model_lacks_raise() -> None:
    m = build_model(get_model("tiny"))
    with pytest.raises(ValueError, match="match no linear"):
        apply_lora(m, _training(lora_targets=("q_a_proj", "kv_b_proj")))


def test_tensor_parallel_with_lora_is_refused() -> None:
    from runtime.parallelize import check_supported

    run = load_run_spec(_run({"tp": 2}, gpus=2))
    with pytest.raises(NotSupportedError, match="tensor parallel"):
        check_supported(run)
    check_supported(load_run_spec(_run({"zero_stage": 3}, gpus=2)))  # data parallel is fine


def test_optimizer_holds_only_the_adapters() -> None:
    from runtime.train import Trainer

    run = load_run_spec(_run({}, gpus=1, opt="adamw"))
    trainer = Trainer(run, torch.device("cpu"))
    held = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    trainable = {id(p) for p in trainer.parts.chunks[0].parameters() if p.requires_grad}
    assert held == trainable and len(held) == 2 * 7 * get_model("tiny").num_layers


# ---- multi-process gloo runs against one process -------------------------------------------------------


def _run(layout: dict[str, Any], *, gpus: int = NPROC, opt: str = "sgd", model: str = "tiny",
         **training: Any) -> dict[str, Any]:
    return {
        "model": model,
        "training": {"seq_len": 32, "global_batch": 8, "optimizer": opt, "method": "lora", **training},
        "gpus": gpus,
        "layout": layout,
        "lr": 0.5 if opt == "sgd" else 1e-2,
        "seed": 7,
    }


CASES: list[dict[str, Any]] = [
    {"name": "lora_ddp_zero0", "run": _run({"zero_stage": 0}), "steps": STEPS, "track_memory": True},
    {"name": "lora_fsdp_zero3", "run": _run({"zero_stage": 3}), "steps": STEPS},
    {"name": "lora_fsdp_zero1_mb2_adamw_selective",
     "run": _run({"zero_stage": 1, "micro_batch": 2, "recompute": "selective"}, opt="adamw"), "steps": STEPS,
     "track_memory": True},
    {"name": "lora_pp2_1f1b_full", "run": _run({"pp": 2, "recompute": "full"}), "steps": STEPS},
    {"name": "lora_mla_moe_attention_fsdp_zero2",
     "run": _run({"zero_stage": 2}, model="tiny-mla", lora_targets="attention", lora_rank=4), "steps": STEPS},
    # the GPU path on gloo: bf16 frozen base, fp32 adapters, FSDP2 mixed precision (bf16 compute)
    {"name": "lora_fsdp_zero3_bf16", "run": {**_run({"zero_stage": 3}, opt="adamw"), "dtype": "bf16"}, "steps": STEPS},
]
BY_NAME = {c["name"]: c for c in CASES}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lora") / "out"
    proc = launch(CASES, NPROC, out, timeout_s=300)
    if proc.returncode != 0:
        pytest.fail(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return out


@cache
def _reference(run_json: str, steps: int) -> tuple[list[float], dict[str, Any]]:
    """Single-process run of the same RunSpec on the same global batch (micro-batch kept)."""
    run = json.loads(run_json)
    spec = load_run_spec(run)
    ref = load_run_spec({**run, "gpus": 1, "layout": {"micro_batch": spec.layout.micro_batch}})
    params: dict[str, Any] = {}
    torch.set_num_threads(1)
    res = train(ref, steps=steps, trainer_hook=lambda t: params.update(t.full_parameters()))
    return res.losses, params


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BY_NAME))
def test_lora_layout_matches_single_process(job: Path, name: str) -> None:
    case = BY_NAME[name]
    run_json = json.dumps(case["run"], sort_keys=True)
    ref_losses, ref_params = _reference(run_json, case["steps"])
    _, init = _reference(run_json, 0)
    ranks = load_results(job, name, NPROC)
    atol = SGD_ATOL if case["run"]["training"]["optimizer"] == "sgd" else ADAMW_ATOL
    loss_rtol = LOSS_RTOL
    bf16 = case["run"].get("dtype") == "bf16"
    if bf16:  # FSDP2 casts the parameters to bf16, the reference autocasts each op: 1.5e-4 measured
        loss_rtol, atol = BF16_LOSS_RTOL, float("inf")
    seen: set[str] = set()
    max_loss = max_param = 0.0
    for r in ranks:
        assert len(r["losses"]) == case["steps"]
        for a, b in zip(r["losses"], ref_losses, strict=True):
            max_loss = max(max_loss, abs(a - b) / abs(b))
        for k, v in r["params"].items():
            seen.add(k)
            max_param = max(max_param, (v - ref_params[k]).abs().max().item())
            if ".lora_" in k:  # the adapters trained (B moves on step 1, A from step 2), fp32 masters
                assert not torch.equal(v, init[k]), f"{name}: adapter {k} did not change"
                assert v.dtype == torch.float32, k
            else:  # the base is frozen: bit-identical to its initial value
                assert torch.equal(v, init[k]), f"{name}: frozen {k} changed"
    assert seen == set(ref_params), sorted(set(ref_params) ^ seen)[:5]
    assert any(".lora_" in k for k in seen)
    print(f"{name}: losses {ref_losses}, max loss rel diff {max_loss:.2e}, max param abs diff {max_param:.2e}")
    assert max_loss <= loss_rtol, f"{name}: loss differs by {max_loss:.3g} (relative)"
    if bf16:  # the frozen base is stored in the compute dtype
        assert {v.dtype for k, v in ranks[0]["params"].items() if ".lora_" not in k} == {torch.bfloat16}
    assert max_param <= atol, f"{name}: parameters differ by {max_param:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lora_ddp_zero0", "lora_fsdp_zero1_mb2_adamw_selective"])
def test_fake_world_memory_matches_real_lora_run(job: Path, name: str) -> None:
    """runtime.fake_world (fake process group + FakeTensorMode, what bench/fake_world_memory.py
    traces) measures what the real 2-rank LoRA run allocated (live-storage tracker, bytes), at the
    tolerance of the full-training check in test_parallel_layouts.py: 1% or 128 KiB (measured: 520
    bytes, the real run's data tensors).

    Known gap, not tested: under ZeRO-3 the real gloo run sometimes peaks higher on one rank
    (measured once 319 KiB = 4.8% above the trace on rank 0 of this model, the next run within
    520 bytes: the timing of gloo's asynchronous collectives); full training under ZeRO-3 traces
    240 KiB (2.9%) below the real run every time, ZeRO-2 82 KiB (0.85%)."""
    from runtime.fake_world import measure_stages

    ranks = load_results(job, name, NPROC)
    run = load_run_spec(BY_NAME[name]["run"])
    (m,) = measure_stages(run, steps=2)
    real = ranks[m.rank]["peak_memory_bytes"]
    print(f"{name}: fake world {m.peak_bytes} B, real run {real} B")
    assert abs(m.peak_bytes - real) <= max(0.01 * real, 128 * 1024), (m, real)


def test_checkpoint_resume_is_exact(tmp_path: Path) -> None:
    """A LoRA run saved after 2 steps (frozen base in the model state, adapters' AdamW state) and
    resumed to 4 gives the uninterrupted run's losses bit for bit."""
    run = load_run_spec(_run({}, gpus=1, opt="adamw"))
    full = train(run, steps=4).losses
    train(run, steps=2, checkpoint_dir=tmp_path)
    resumed = train(run, steps=4, checkpoint_dir=tmp_path)
    assert resumed.start_step == 2
    assert resumed.losses == full[2:]


def test_profile_counts_lora_flops() -> None:
    """MFU of a LoRA run uses cost_models.flops' frozen-base convention (forward + input gradient
    of the base, 6 FLOPs per adapter element and token), not full training's 6NT."""
    from cost_models.finetune import FineTune, adapter_params_per_token
    from cost_models.flops import step_flops
    from runtime.train import TrainResult, make_profile

    run = load_run_spec(_run({}, gpus=1))
    res = TrainResult(step_times_s=[1.0, 1.0], losses=[6.0, 6.0])
    prof = make_profile(run, res, torch.device("cpu"), peak_flops_per_s=1e12)
    tr = run.training
    per_token = adapter_params_per_token(run.model, FineTune.of(tr))
    want = step_flops(run.model, tr.seq_len, tr.global_batch, frozen_base=True, adapter_params_per_token=per_token)
    full = step_flops(run.model, tr.seq_len, tr.global_batch)
    assert per_token > 0
    assert prof["model_flops_per_step"] == want.model_flops < full.model_flops
