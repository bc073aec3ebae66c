"""Single-process pieces of the runtime: RunSpec/Plan loading, mesh layout, CP chunking,
selective recompute, the CPU memory tracker, the data, and `runtime.launch` on one rank."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cost_models.layout import Layout  # noqa: E402
from cost_models.mesh import mesh_strides  # noqa: E402
from model_specs.presets import get_model  # noqa: E402
from model_specs.spec import TrainingSpec  # noqa: E402
from runtime.context_parallel import cp_positions  # noqa: E402
from runtime.memory import LiveStorageTracker  # noqa: E402
from runtime.mesh import world_dims  # noqa: E402
from runtime.model import build_model  # noqa: E402
from runtime.recompute import apply_recompute  # noqa: E402
from runtime.spec import RunSpec, load_run_spec  # noqa: E402
from runtime.train import global_batch  # noqa: E402

TRAIN = {"seq_len": 32, "global_batch": 8}


# ---- RunSpec ---------------------------------------------------------------------------------------


def test_run_spec_resolves_layout_and_even_partition() -> None:
    r = load_run_spec({"model": "tiny", "training": TRAIN, "layout": {"tp": 2, "pp": 2}, "gpus": 8})
    assert r.layout.dp == 2 and r.layout.grad_accum == 4 and r.layout.sp is True
    assert r.partition == (2, 2)
    assert r.world_size == 8
    assert r.model == get_model("tiny")


def test_run_spec_rejects_invalid_layout_and_partition() -> None:
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        load_run_spec({"model": "tiny", "training": TRAIN, "layout": {"tp": 3}, "gpus": 6})
    with pytest.raises(ValueError):
        load_run_spec({"model": "tiny", "training": TRAIN, "layout": {"pp": 2}, "gpus": 2, "partition": [1, 2]})


def test_megatron_micro_batch_groups_that_torch_cannot_run_are_refused() -> None:
    from runtime.model import NotSupportedError
    from runtime.parallelize import check_supported

    def run(global_batch: int) -> RunSpec:
        layout = {"pp": 2, "vpp": 2}  # framework megatron: 5 micro-batches run in groups of 3
        return load_run_spec({"model": "tiny", "training": {"seq_len": 32, "global_batch": global_batch}, "layout": layout, "gpus": 2})

    with pytest.raises(NotSupportedError, match="m // pp rounds"):
        check_supported(run(5))  # torch: 2 rounds do not divide 5
    check_supported(run(6))


def test_an_unfolded_expert_grid_with_context_parallelism_is_refused() -> None:
    """The runtime's EP groups are carved out of dp x cp (runtime.mesh), MoE parallel folding's grid
    at tp = 1; Megatron-Core 0.9's EP-inside-DP grid differs from it only when cp > 1."""
    from runtime.model import NotSupportedError
    from runtime.parallelize import check_supported

    def run(**layout: object) -> RunSpec:
        return load_run_spec({"model": "tiny-moe", "training": TRAIN, "layout": {"ep": 2, **layout}, "gpus": 4})

    with pytest.raises(NotSupportedError, match="without MoE parallel folding"):
        check_supported(run(cp=2, moe_parallel_folding=False))
    check_supported(run(cp=2))
    check_supported(run(moe_parallel_folding=False))  # cp = 1: the same groups


def test_load_plan_json(tmp_path: Path) -> None:
    model = get_model("tiny").model_dump(mode="json")
    plan = {
        "schema_version": 1,
        "inputs": {
            "model": model,
            "training": TRAIN,
            "gpus": 8,
            "cluster": {"gpu": {"name": "H100", "peak_flops_per_s": {"bf16": 9.89e14, "fp32": 4.9e14}}},
        },
        "best": {"layout": {"tp": 2, "pp": 2, "vpp": 2}, "partition": {"chunk_layers": [1, 1, 1, 1]}},
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    r = load_run_spec(path, steps=3, seed=None)
    assert r.layout.schedule == "interleaved_1f1b"
    assert r.partition == (1, 1, 1, 1)
    assert r.steps == 3 and r.seed == 0
    assert r.peak_flops_per_s == 9.89e14
    # the planner's Candidate stores the partition as a plain list
    plan["best"]["partition"] = [1, 1, 1, 1]
    assert load_run_spec(plan).partition == (1, 1, 1, 1)
    # a bare RunSpec round-trips through JSON
    assert RunSpec.model_validate_json(r.model_dump_json()) == r


# ---- mesh ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-dp-cp-ep-pp", "cp-tp-ep-dp-pp"])
def test_world_mesh_rank_strides_match_cost_model(order: str) -> None:
    """The world mesh built from `world_dims` numbers ranks as cost_models.mesh prices them."""
    tr = TrainingSpec(**TRAIN)
    lay = Layout(tp=2, cp=2, pp=2, order=order).resolved(16, tr)
    dims = world_dims(lay)
    names = [n for n, _ in dims]
    grid = torch.arange(16).reshape([s for _, s in dims])
    strides = mesh_strides(lay)

    def stride(name: str) -> int:
        idx = [0] * len(names)
        idx[names.index(name)] = 1
        return int(grid[tuple(idx)])

    assert stride("tp") == strides.tp
    assert stride("cp") == strides.cp
    assert stride("pp") == strides.pp
    assert stride("dp_shard") == strides.dp


def test_hsdp_shard_group_is_innermost_dp() -> None:
    lay = Layout(dp_shard=2, zero_stage=3).resolved(8, TrainingSpec(**TRAIN))
    assert world_dims(lay) == [("pp", 1), ("dp_replicate", 4), ("dp_shard", 2), ("cp", 1), ("tp", 1)]


# ---- context parallel chunking ---------------------------------------------------------------------


def test_cp_positions_are_load_balanced_and_cover_the_sequence() -> None:
    s, cp = 32, 4
    parts = [cp_positions(s, cp, r) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(s))
    assert parts[0].tolist() == [0, 1, 2, 3, 28, 29, 30, 31]
    # causal work (keys visible to each query) is the same on every rank
    work = [int((p + 1).sum()) for p in parts]
    assert len(set(work)) == 1
    with pytest.raises(ValueError):
        cp_positions(30, 4, 0)


# ---- recompute and memory --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "tiny-moe", "tiny-mla"])
def test_recompute_modes_give_identical_gradients(name: str) -> None:
    torch.manual_seed(0)
    spec = get_model(name)
    base = build_model(spec)
    tok = torch.randint(0, spec.vocab_size, (2, 17))
    grads = {}
    for mode in ("none", "selective", "full", "op_sac"):
        m = copy.deepcopy(base)
        apply_recompute(m, mode)
        m.loss(tok[:, :-1], tok[:, 1:]).backward()
        grads[mode] = {
            n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in m.named_parameters() if p.grad is not None
        }
    for mode in ("selective", "full", "op_sac"):
        assert grads[mode].keys() == grads["none"].keys()
        for n, g in grads["none"].items():
            torch.testing.assert_close(grads[mode][n], g, rtol=1e-5, atol=1e-7)


def _step_peak(mode: str, tracker_cls: str) -> int:
    torch.manual_seed(0)
    spec = get_model("tiny")
    tok = torch.randint(0, spec.vocab_size, (2, 129))
    if tracker_cls == "live":
        with LiveStorageTracker() as tr:
            m = build_model(spec)
            apply_recompute(m, mode)
            opt = torch.optim.AdamW(m.parameters())
            for _ in range(2):
                loss = m.loss(tok[:, :-1], tok[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad()
        return tr.peak_bytes
    from torch.distributed._tools.mem_tracker import MemTracker

    m = build_model(spec)
    apply_recompute(m, mode)
    opt = torch.optim.AdamW(m.parameters())
    mt = MemTracker()
    mt.track_external(m, opt)
    with mt:
        for _ in range(2):
            loss = m.loss(tok[:, :-1], tok[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            mt.reset_mod_stats()
    return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def test_live_storage_tracker_matches_torch_memtracker_and_recompute_saves_memory() -> None:
    peaks = {mode: _step_peak(mode, "live") for mode in ("none", "selective", "full", "op_sac")}
    for mode, peak in peaks.items():
        assert peak == _step_peak(mode, "memtracker"), mode
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    assert peaks["full"] < peaks["op_sac"] < peaks["none"]


# ---- FSDP2 units ---------------------------------------------------------------------------------


def _fsdp_units(model: dict | str, layout: dict) -> list[dict[str, object]]:
    """Per chunk of rank 0 at 4 ranks (a fake process group, parameters left on meta): which FSDP2
    unit (state) holds each end module, and whether that unit reshards after forward."""
    from torch.distributed.fsdp import fully_shard

    from runtime.fake_world import _fake_group
    from runtime.mesh import build_meshes
    from runtime.parallelize import build_parts

    run = load_run_spec({"model": model, "training": TRAIN, "gpus": 4, "layout": layout})
    with _fake_group(0, 4):
        parts = build_parts(run, build_meshes(run.layout, "cpu"), torch.device("cpu"), materialize=False)
        out = []
        for m in parts.chunks:
            units: dict[str, object] = {}
            for name in ("tok_embeddings", "pos_embeddings", "norm", "output"):
                mod = getattr(m, name)
                if mod is not None:
                    state = fully_shard.state(mod)
                    (group,) = state._fsdp_param_groups
                    units[name] = (id(state), group.post_forward_mesh_info is not None)
            root = fully_shard.state(m)
            units["root_params"] = sum(len(g.fsdp_params) for g in root._fsdp_param_groups)
            out.append(units)
    return out


def test_fsdp_wraps_the_embedding_and_the_head_as_units_of_their_own() -> None:
    """torchtitan's units (runtime.parallelize.edge_units): ZeRO-3 without a pipeline reshards the
    embedding after forward, never the norm + head; the root keeps no parameter."""
    (u,) = _fsdp_units("tiny", {"zero_stage": 3})
    assert u["norm"][0] == u["output"][0] != u["tok_embeddings"][0]
    assert u["tok_embeddings"][1] is True and u["output"][1] is False
    assert u["root_params"] == 0
    # tied (GPT-2-like, learned positions): one unit of both tables, the norm and the head, kept
    tied = {**get_model("tiny").model_dump(mode="json"), "name": "tiny-tied", "tie_embeddings": True,
            "position_embedding": "learned", "max_position_embeddings": 64}
    (t,) = _fsdp_units(tied, {"zero_stage": 3})
    assert len({t[k][0] for k in ("tok_embeddings", "pos_embeddings", "norm", "output")}) == 1
    assert t["output"][1] is False and t["root_params"] == 0
    # a pipeline stage holds only its own end, not resharded after forward either
    (first,) = _fsdp_units("tiny", {"zero_stage": 3, "pp": 2})
    assert set(first) == {"tok_embeddings", "root_params"} and first["tok_embeddings"][1] is False


# ---- data and one-rank launch ---------------------------------------------------------------------


def test_global_batch_is_seeded_and_layout_independent() -> None:
    a = load_run_spec({"model": "tiny", "training": TRAIN, "layout": {}, "gpus": 1})
    b = load_run_spec({"model": "tiny", "training": TRAIN, "layout": {"dp": 4}, "gpus": 4})
    assert torch.equal(global_batch(a, 3), global_batch(b, 3))
    assert not torch.equal(global_batch(a, 3), global_batch(a, 4))
    assert global_batch(a, 0).shape == (8, 33)


def test_launch_single_process_writes_profile(tmp_path: Path) -> None:
    from runtime.launch import main

    spec = tmp_path / "run.json"
    spec.write_text(json.dumps({"model": "tiny", "training": TRAIN, "layout": {"micro_batch": 4}, "gpus": 1, "lr": 3e-3}))
    out = tmp_path / "profile.json"
    ckpt = tmp_path / "ckpt"
    assert main([str(spec), "--steps", "3", "--out", str(out), "--peak-flops", "1e12", "--checkpoint-dir", str(ckpt)]) == 0
    prof = json.loads(out.read_text())
    assert len(prof["losses"]) == 3 and len(prof["step_times_s"]) == 3
    assert prof["tokens_per_s"] > 0 and 0 < prof["mfu"] < 1
    assert prof["peak_memory_bytes_per_rank"][0] > 0
    assert prof["environment"]["torch"] == torch.__version__
    # resume: two more steps continue from step 3 and match an uninterrupted 5-step run
    assert main([str(spec), "--steps", "5", "--out", str(out), "--checkpoint-dir", str(ckpt), "--no-track-memory"]) == 0
    resumed = json.loads(out.read_text())
    assert resumed["start_step"] == 3 and len(resumed["losses"]) == 2
    full = tmp_path / "full.json"
    assert main([str(spec), "--steps", "5", "--out", str(full), "--no-track-memory"]) == 0
    assert json.loads(full.read_text())["losses"][3:] == resumed["losses"]


def test_training_on_a_tokenized_file(tmp_path: Path) -> None:
    """`--data FILE`: batches are windows of the token file (same on every layout), and a model
    learns its repeating pattern (the loss falls well below ln(vocab))."""
    import math

    import numpy as np

    from runtime.launch import main
    from runtime.spec import load_run_spec
    from runtime.train import global_batch

    data = tmp_path / "tokens.bin"
    np.tile(np.arange(0, 64, dtype=np.uint16), 200).tofile(data)  # 12,800 tokens: 0, 1, ..., 63, 0, 1, ...
    run_json = {"model": "tiny", "training": TRAIN, "layout": {"micro_batch": 4}, "gpus": 1, "lr": 3e-3,
                "data_path": str(data)}
    run = load_run_spec(run_json)
    batch = global_batch(run, step=0)
    assert batch.shape == (run.training.global_batch, run.training.seq_len + 1)
    assert bool(((batch[:, 1:] - batch[:, :-1]) % 64 == 1).all()), "rows are contiguous windows of the file"
    assert torch.equal(batch, global_batch(run, step=0)) and not torch.equal(batch, global_batch(run, step=1))

    spec = tmp_path / "run.json"
    spec.write_text(json.dumps({k: v for k, v in run_json.items() if k != "data_path"}))
    out = tmp_path / "profile.json"
    assert main([str(spec), "--steps", "12", "--out", str(out), "--no-track-memory", "--data", str(data)]) == 0
    losses = json.loads(out.read_text())["losses"]
    assert losses[-1] < 0.6 * losses[0] and losses[0] > 0.5 * math.log(run.model.vocab_size)

    bad = tmp_path / "big.bin"
    np.full(1000, 60000, dtype=np.uint16).tofile(bad)
    with pytest.raises(ValueError, match="vocab size"):
        global_batch(load_run_spec({**run_json, "data_path": str(bad)}), step=0)


_FREED_SCENARIO = """
import resource, sys
from runtime.host import return_freed_memory
if sys.argv[1] == "on":
    assert return_freed_memory() is True
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
big = bytearray(16 << 20); del big  # glibc raises its mmap threshold past 16 MiB after this free
before = rss()
chunks, pins = [], []
for _ in range(128):  # 128 MiB in 1 MiB blocks, touched, each pinned in place by a small object after it
    chunks.append(bytearray(1 << 20)); pins.append(bytearray(4096))  # 4 KiB: glibc, not pymalloc
grown = rss() - before
del chunks
print(grown >> 20, (rss() - before) >> 20)
"""


def test_a_cpu_rank_returns_freed_memory_to_the_kernel():
    """runtime.host.return_freed_memory (glibc mallopt): 1 MiB buffers freed between live small
    objects go back to the kernel at once; without it, once glibc has raised its mmap threshold,
    they stay resident (the gather and reduce-scatter buffers of a CPU rank)."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        from runtime.host import return_freed_memory

        assert return_freed_memory() is False
        return
    kept = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, "-c", _FREED_SCENARIO, mode], capture_output=True, text=True, check=True)
        grown, left = map(int, out.stdout.split())
        assert grown >= 100
        kept[mode] = left
    assert kept["on"] < 16 and kept["off"] >= 100
