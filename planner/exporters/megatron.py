"""Megatron-LM (Megatron-Core `pretrain_gpt.py`) arguments as a bash array.

Stage cuts: an even cut needs nothing (plus `--num-layers-per-virtual-pipeline-stage` with
interleaving); a cut whose only odd stages are the first and/or last uses
`--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`; any other cut is
written as `--pipeline-model-parallel-layout` (stages separated by `|`, `E` the embedding, `L` the
LM head and loss, `t*N` N decoder layers, `m*N` the multi-token-prediction modules, in the last
stage; virtual stage s runs on pipeline rank s % pp).

A Layout's own Megatron-Core split options (`account_for_*_in_pipeline_split`,
`decoder_first/last_pipeline_num_layers`) are written as those flags when they produce the plan's cut.

ZeRO: stage 1 is the distributed optimizer; stages 2 and 3 are Megatron-FSDP
(`--data-parallel-sharding-strategy optim_grads` / `optim_grads_params`); hybrid sharding keeps
`dp / dp_shard` distributed-optimizer instances.

`CUDA_DEVICE_MAX_CONNECTIONS`: Megatron's `validate_args` requires it to be 1 with tensor or
context parallelism (on Hopper and earlier; overlapping TP communication needs one hardware queue)
and forbids 1 with Megatron-FSDP; the file exports or unsets it accordingly.

Flags and their spelling are checked against Megatron-LM core_v0.16.1's `parse_args` +
`validate_args` in tests/planner/test_exporters.py. Every value is written through `shlex.quote`;
user text (model, cluster, GPU names) appears only in comments, escaped by `one_line`.
"""

from __future__ import annotations

import itertools
import shlex

from cost_models.pipeline import FORWARDS_FIRST_SCHEDULES, interleaving_group, is_v_shape
from cost_models.stages import megatron_split
from cost_models.step_time import overlap_needs_one_queue
from model_specs.spec import ModelSpec
from planner.exporters.common import (
    SCHEDULE_NAMES,
    ExportResult,
    Job,
    comment_block,
    deepspeed_only_notes,
    fp8_note,
    framework_note,
    method_note,
    notes_lines,
    summary_lines,
    triton_attention_note,
)

Arg = tuple[str, ...]  # a flag and its value(s)


def _model_args(m: ModelSpec, seq_len: int, lost: list[str], dispatcher: str = "alltoall", mtp: int = 0) -> list[Arg]:
    args: list[Arg] = [
        ("--num-layers", str(m.num_layers)),
        ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(m.ffn_hidden_size)),
        ("--num-attention-heads", str(m.num_heads)),
    ]
    if m.attention == "mla":
        args.append(("--multi-latent-attention",))
        if m.q_lora_rank:
            args.append(("--q-lora-rank", str(m.q_lora_rank)))
        args += [
            ("--kv-lora-rank", str(m.kv_lora_rank)),
            ("--qk-head-dim", str(m.qk_nope_head_dim)),
            ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)),
            ("--v-head-dim", str(m.v_head_dim)),
        ]
    else:
        if m.qk_head_dim != m.hidden_size // m.num_heads:
            args.append(("--kv-channels", str(m.qk_head_dim)))
        if m.kv_heads != m.num_heads:
            args += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
    args += [
        ("--seq-length", str(seq_len)),
        ("--max-position-embeddings", str(max(seq_len, m.max_position_embeddings))),
    ]
    if m.position_embedding == "rope":
        args.append(("--position-embedding-type", "rope"))
        args += _rope_args(m, lost)
    elif m.position_embedding == "learned":
        args.append(("--position-embedding-type", "learned_absolute"))
    else:
        lost.append(f"{m.position_embedding} position embeddings: Megatron-Core GPT has rope or learned ones only")
    if m.mlp == "swiglu":
        args.append(("--swiglu",))
    elif m.mlp == "relu2":
        args.append(("--squared-relu",))
    elif m.mlp != "gelu":
        lost.append(f"{m.mlp} MLP activation: Megatron offers gelu (default), swiglu and squared relu")
    args.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.qk_norm:
        args.append(("--qk-layernorm",))
    if not m.tie_embeddings:
        args.append(("--untie-embeddings-and-output-weights",))
    if not (m.attn_out_bias or m.mlp_bias):
        args.append(("--disable-bias-linear",))
        if m.qkv_bias:
            args.append(("--add-qkv-bias",))
    elif not m.qkv_bias:
        lost.append("biases on some projections but not on q/k/v: Megatron toggles them together")
    if m.is_moe:
        args += [
            ("--num-experts", str(m.num_experts)),
            ("--moe-router-topk", str(m.moe_top_k)),
            ("--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)),
        ]
        if m.num_shared_experts:
            args.append(("--moe-shared-expert-intermediate-size", str(m.shared_experts_width)))
        if m.moe_layer_count != m.num_layers:
            args.append(("--moe-layer-freq", _layer_pattern([int(m.is_moe_layer(i)) for i in range(m.num_layers)])))
        args += [("--moe-grouped-gemm",), ("--moe-token-dispatcher-type", dispatcher)]
        if dispatcher == "flex":
            lost.append(
                "flex token dispatcher: priced with DeepEP's deduplicated dispatch; enable DeepEP as your "
                "Megatron-Core version spells it (--moe-enable-deepep, or --moe-flex-dispatcher-backend deepep)"
            )
        if m.moe_router_groups:  # group-limited routing (DeepSeek-V3: 8 groups, a token reaches 4)
            args += [
                ("--moe-router-num-groups", str(m.moe_router_groups)),
                ("--moe-router-group-topk", str(m.moe_router_group_topk)),
            ]
    if mtp:
        args.append(("--mtp-num-layers", str(mtp)))
    for flag, what in (
        (m.sliding_window is not None, "sliding-window attention" if m.window_kind == "sliding" else "chunked attention"),
        (m.norm_placement != "pre", f"{m.norm_placement}-norm blocks"),
        (m.qk_norm and m.qk_norm_scope == "projection", "q/k norms over the whole projection"),
        (m.attention_sinks, "attention sinks"),
        (m.parallel_residual, "parallel attention/MLP residual"),
        (m.embedding_norm, "the norm after the token embedding"),
    ):
        if flag:
            lost.append(f"{what} ({m.name}): no Megatron-Core GPT argument; the model spec needs a custom layer")
    return args


# Megatron-Core's fixed Llama-3.1 scaling constants (RotaryEmbedding._apply_scaling) and YaRN
# defaults (MLATransformerConfig: beta_fast, beta_slow, original_max_position_embeddings).
_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096}


def _rope_args(m: ModelSpec, lost: list[str]) -> list[Arg]:
    """RoPE base (`--rotary-base`, an integer in Megatron) and scaling: Llama-3.1's
    (`--use-rope-scaling --rope-scaling-factor`) and, with MLA, YaRN (`--rope-type yarn`)."""
    args: list[Arg] = []
    if m.rope_theta is not None:
        if m.rope_theta.is_integer():
            args.append(("--rotary-base", str(int(m.rope_theta))))
        else:
            lost.append(f"RoPE base {m.rope_theta}: Megatron's --rotary-base takes an integer")
    sc = m.rope_scaling
    if sc is None:
        return args
    if sc.rope_type == "llama3" and sc.factor is not None:
        args += [("--use-rope-scaling",), ("--rope-scaling-factor", repr(float(sc.factor)))]
        for key, fixed in _LLAMA3_SCALING.items():
            value = getattr(sc, key)
            if value is not None and float(value) != fixed:
                lost.append(f"RoPE scaling {key} {value}: Megatron-Core's Llama-3 scaling fixes it at {fixed}")
    elif sc.rope_type == "yarn" and m.attention == "mla" and sc.factor is not None:
        args += [("--rope-type", "yarn"), ("--rotary-scaling-factor", repr(float(sc.factor)))]
        if sc.mscale is not None:
            args.append(("--mscale", repr(float(sc.mscale))))
        if sc.mscale_all_dim is not None:
            args.append(("--mscale-all-dim", repr(float(sc.mscale_all_dim))))
        for key, default in _YARN_DEFAULTS.items():
            value = getattr(sc, key)
            if value is not None and float(value) != default:
                lost.append(
                    f"YaRN {key} {value}: no Megatron argument (MLATransformerConfig.{key} defaults to {default:g}); "
                    "set it in the transformer config"
                )
    else:
        lost.append(
            f"RoPE scaling '{sc.rope_type}' (factor {sc.factor}): Megatron-Core GPT arguments have Llama-3 "
            "scaling, and YaRN for multi-latent attention only"
        )
    return args


def _layer_pattern(bits: list[int]) -> str:
    """Megatron's Python-list form of a per-layer 0/1 pattern, run-length encoded: ([0]*3+[1]*58)."""
    runs = [f"[{b}]*{len(list(g))}" for b, g in itertools.groupby(bits)]
    return "(" + "+".join(runs) + ")"


def _split_option_args(job: Job) -> list[Arg] | None:
    """The Layout's own Megatron split options, when they cut the layers as the plan does."""
    lay = job.lay
    if not lay.uneven_split:
        return None
    try:
        cut = megatron_split(
            job.model.num_layers, lay.pp, lay.vpp,
            account_for_embedding=lay.account_for_embedding_in_pipeline_split,
            account_for_loss=lay.account_for_loss_in_pipeline_split,
            first_stage_layers=lay.decoder_first_pipeline_num_layers,
            last_stage_layers=lay.decoder_last_pipeline_num_layers,
        )
    except ValueError:
        return None
    if cut != job.chunk_layers:
        return None
    args: list[Arg] = []
    if lay.account_for_embedding_in_pipeline_split:
        args.append(("--account-for-embedding-in-pipeline-split",))
    if lay.account_for_loss_in_pipeline_split:
        args.append(("--account-for-loss-in-pipeline-split",))
    if lay.decoder_first_pipeline_num_layers is not None:
        args.append(("--decoder-first-pipeline-num-layers", str(lay.decoder_first_pipeline_num_layers)))
    if lay.decoder_last_pipeline_num_layers is not None:
        args.append(("--decoder-last-pipeline-num-layers", str(lay.decoder_last_pipeline_num_layers)))
    if lay.vpp > 1:
        args.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
    return args


def _pipeline_args(job: Job) -> list[Arg]:
    if job.pp == 1:
        return []
    args = [("--pipeline-model-parallel-size", str(job.pp)), *_stage_cut_args(job)]
    group = interleaving_group("megatron", job.pp, job.lay.grad_accum_) if job.vpp > 1 else None
    if group is not None and group != job.pp:  # Megatron's default group is pp (`pipeline.interleaving_group`)
        args.append(("--microbatch-group-size-per-virtual-pipeline-stage", str(group)))
    return args


def _stage_cut_args(job: Job) -> list[Arg]:
    pp, vpp, chunks = job.pp, job.vpp, job.chunk_layers
    args: list[Arg] = []
    split = _split_option_args(job)
    if split is not None:
        return args + split
    if job.even:
        if vpp > 1:
            args.append(("--num-layers-per-virtual-pipeline-stage", str(chunks[0])))
        return args
    middle = chunks[1:-1]
    if vpp == 1 and len(set(middle)) <= 1:
        if pp == 2 or chunks[0] != middle[0]:
            args.append(("--decoder-first-pipeline-num-layers", str(chunks[0])))
        if pp == 2 or chunks[-1] != middle[0]:
            args.append(("--decoder-last-pipeline-num-layers", str(chunks[-1])))
        return args
    return args + [("--pipeline-model-parallel-layout", _layout_string(chunks, job.mtp_layers))]


def _layout_string(chunks: tuple[int, ...], mtp: int = 0) -> str:
    """The cut as `--pipeline-model-parallel-layout`: the multi-token-prediction modules (`m`) go
    with the loss into the last stage, where the plan priced them."""
    stages = [f"t*{n}" for n in chunks]
    stages[0] = "E," + stages[0]
    stages[-1] = stages[-1] + (f",m*{mtp}" if mtp else "") + ",L"
    return "|".join(stages)


def _parallel_args(job: Job, lost: list[str]) -> list[Arg]:
    lay = job.lay
    args: list[Arg] = [("--tensor-model-parallel-size", str(lay.tp))]
    if lay.sp_:
        args.append(("--sequence-parallel",))
    args += _pipeline_args(job)
    if lay.tp_comm_overlap_:
        if lay.sp_:
            args.append(("--tp-comm-overlap",))  # Transformer Engine userbuffers
        else:
            lost.append("TP communication overlap without sequence parallelism: Megatron overlaps only with SP")
    if lay.zero_stage >= 2 and overlap_needs_one_queue(lay.tp, lay.cp, job.cluster.gpu):
        priced = ("the step time was priced with their traffic exposed" if lay.framework == "megatron"
                  else f"the step time, priced for {lay.framework}, hid part of it")
        lost.append(
            "tensor / context parallelism beside Megatron-FSDP: FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1, their "
            f"overlap needs 1 before Blackwell (validate_args); {priced}"
        )
    if lay.cp > 1:
        comm = "p2p" if lay.cp_attention == "ring" else "all_gather"
        args += [("--context-parallel-size", str(lay.cp)), ("--cp-comm-type", comm)]
    if lay.ep > 1 or job.model.is_moe:
        args += [("--expert-model-parallel-size", str(lay.ep)), ("--expert-tensor-parallel-size", str(lay.etp_))]
        if not lay.moe_parallel_folding and lay.ep > 1 and lay.cp > 1:
            lost.append(
                f"priced without MoE parallel folding (Megatron-Core 0.9: EP inside DP, groups strided over TP x CP = "
                f"{lay.tp * lay.cp} ranks); Megatron-Core 0.10+ folds EP over TP x CP x DP (stride {lay.etp_}), so its "
                "expert all-to-alls run on other links than priced: re-plan with folding for it"
            )
    if lay.zero_stage == 1:
        args.append(("--use-distributed-optimizer",))
    elif lay.zero_stage >= 2:
        strategy = "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"
        args += [
            ("--use-megatron-fsdp",),
            ("--use-distributed-optimizer",),
            ("--data-parallel-sharding-strategy", strategy),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
        if not lay.megatron_fsdp_gradient_fusion:  # priced with the fusion off, as NeMo 2.3 / 2.4 run it
            args.append(("--no-gradient-accumulation-fusion",))
    if lay.zero_stage >= 1 and job.dp_replicate > 1:
        args.append(("--num-distributed-optimizer-instances", str(job.dp_replicate)))
    if job.dp > 1:
        args.append(("--overlap-grad-reduce",))
        if lay.zero_stage >= 1:
            args.append(("--overlap-param-gather",))
    if lay.offload_params:
        lost.append(
            "parameter offload (ZeRO-3 weight shards in host memory): Megatron-Core offloads the optimizer "
            "(--optimizer-cpu-offload) and activations, not parameters; the weight shards stay on the GPU "
            "(more GPU memory than planned)"
        )
    if lay.offload_optimizer:
        # validate_args: the CPU-offloaded (hybrid device) optimizer runs on the precision-aware path
        args += [
            ("--optimizer-cpu-offload",),
            ("--overlap-cpu-optimizer-d2h-h2d",),
            ("--use-precision-aware-optimizer",),
        ]
    if lay.moe_a2a_overlap:  # combined 1F1B (validated: ep > 1, vpp > 1 when pipelined, no full recompute)
        args.append(("--overlap-moe-expert-parallel-comm",))
    if lay.pp > 1 and lay.schedule_ in FORWARDS_FIRST_SCHEDULES:
        lost.append(
            f"{SCHEDULE_NAMES[lay.schedule_]} schedule: Megatron always runs (interleaved) 1F1B (same bubble, "
            "fewer micro-batches in flight)"
        )
    if lay.pp > 1 and lay.schedule_ == "zero_bubble":
        lost.append("zero-bubble schedule (ZB1P): Megatron runs (interleaved) 1F1B, whose bubble is three times larger")
    if is_v_shape(lay.schedule_, lay.pp):
        lost.append(f"{lay.schedule_} (V-shape) schedule: Megatron runs interleaved 1F1B with chunks looped over the ranks")
    if lay.order not in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"):
        lost.append(f"rank order {lay.order}: Megatron-Core orders ranks tp-cp-ep-dp-pp")
    elif lay.order == "tp-cp-ep-pp-dp":
        args.append(("--use-tp-pp-dp-mapping",))
    return args


MEGATRON_RECOMPUTE_MODULE = {"core_attn": "core_attn", "layernorm": "layernorm", "mla_up_proj": "mla_up_proj"}
"""`Layout.recompute_modules` as Megatron-Core's --recompute-modules spells them ("act" below)."""


def _recompute_args(job: Job, lost: list[str]) -> list[Arg]:
    lay = job.lay
    offload: list[Arg] = (
        [("--cpu-offloading-num-layers", str(lay.activation_offload_layers))] if lay.activation_offload_layers else []
    )
    return offload + _recompute_only(job, lost)


def _recompute_modules(job: Job) -> list[str]:
    """The plan's selective recompute modules as Megatron-Core's --recompute-modules spells them
    (empty unless selective)."""
    lay = job.lay
    if lay.recompute != "selective":
        return []
    modules = lay.recompute_modules_
    names = {MEGATRON_RECOMPUTE_MODULE[m] for m in modules if m in MEGATRON_RECOMPUTE_MODULE}
    if "act" in modules and job.model.is_moe:
        names.add("moe_act")
    return sorted(names)


def _recompute_only(job: Job, lost: list[str]) -> list[Arg]:
    lay = job.lay
    if lay.recompute == "selective":
        model = job.model
        if "act" in lay.recompute_modules_ and (
            not model.is_moe or model.moe_layer_count < model.num_layers or model.num_shared_experts
        ):
            lost.append(
                "selective recompute of the dense MLP activation: Megatron-Core recomputes expert "
                "activations (moe_act) or whole MLPs (mlp), not a dense MLP's activation alone"
            )
        return [("--recompute-granularity", "selective"), ("--recompute-modules", *_recompute_modules(job))]
    if lay.recompute != "full":
        return []
    if lay.recompute_layers is None:
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")]
    if lay.vpp > 1:
        lost.append(
            f"recompute of {lay.recompute_layers} layers per pipeline rank: Megatron counts "
            "--recompute-num-layers per virtual stage, so each of the rank's chunks recomputes that many"
        )
    return [
        ("--recompute-granularity", "full"),
        ("--recompute-method", "block"),
        ("--recompute-num-layers", str(lay.recompute_layers)),
    ]


def _kernel_args(job: Job, lost: list[str]) -> list[Arg]:
    lay = job.lay
    args: list[Arg] = []
    ce = lay.cross_entropy_
    if ce == "fused":
        args.append(("--cross-entropy-loss-fusion",))
    elif ce != "vocab_parallel":
        lost.append(
            f"{ce} cross entropy: Megatron computes the loss vocabulary-parallel (fp32), or fused with "
            "--cross-entropy-loss-fusion; the file keeps Megatron's default"
        )
    if lay.norm_kernel != "fused":
        lost.append(f"{lay.norm_kernel} RMSNorm: Megatron's norms are fused kernels (Transformer Engine or Apex)")
    if lay.elementwise_kernels == "eager":
        lost.append("eager elementwise kernels: Megatron's norms, rotary and activations are fused kernels")
    if lay.framework == "megatron" and lay.attention_kernel_ == "flash2":  # (another framework's plan: noted as such)
        lost.append(
            "FlashAttention-2 attention: Megatron-Core runs Transformer Engine's fused attention; with the flash-attn 2 "
            "package installed, NVTE_FUSED_ATTN=0 makes Transformer Engine use it"
        )
    return args


def fp8_recipe(job: Job) -> str:
    """Megatron-Core's --fp8-recipe for the plan: its default, delayed (tensor-wise) scaling, unless the plan
    recomputes layernorm or moe_act, which Megatron-Core refuses under delayed scaling
    (TransformerConfig.__post_init__): then blockwise, DeepSeek-V3's fine-grained scaling."""
    return "blockwise" if {"layernorm", "moe_act"} & set(_recompute_modules(job)) else "delayed"


def _precision_args(job: Job) -> list[Arg]:
    tr = job.training
    args: list[Arg] = []
    if tr.precision in ("bf16", "fp8"):
        args.append(("--bf16",))
    elif tr.precision == "fp16":
        args.append(("--fp16",))
    if tr.precision == "fp8":
        args += [("--fp8-format", "hybrid"), ("--fp8-recipe", fp8_recipe(job))]
    if tr.precision != "fp32" and tr.grad_dtype == "bf16":
        args.append(("--grad-reduce-in-bf16",))  # bf16 gradient buffers, as the plan priced them
    return args


def _render(arg: Arg) -> str:
    return " ".join(shlex.quote(a) for a in arg)


def _environment(job: Job) -> list[str]:
    lay = job.lay
    if lay.zero_stage >= 2:
        return [
            "# Megatron-FSDP needs more than one CUDA hardware queue (validate_args)",
            "unset CUDA_DEVICE_MAX_CONNECTIONS",
        ]
    if lay.tp > 1 or lay.cp > 1:
        return [
            "# tensor/context parallelism: one CUDA hardware queue, so communication kernels are",
            "# scheduled before the GEMMs they overlap with (validate_args, Hopper and earlier)",
            "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        ]
    return []


def export_megatron(job: Job) -> ExportResult:
    lost: list[str] = method_note(
        job, "Megatron-LM's pretrain_gpt.py",
        "Megatron-Bridge / NeMo PEFT run LoRA on Megatron-Core (LoRA(dim=r, alpha=alpha) on linear_qkv, linear_proj, "
        "linear_fc1, linear_fc2) with these parallel arguments.",
    )
    lay = job.lay
    sections: list[tuple[str, list[Arg]]] = [
        ("model", _model_args(job.model, job.training.seq_len, lost, job.lay.moe_token_dispatcher, job.mtp_layers)),
        ("parallelism", _parallel_args(job, lost)),
        ("batch", [("--micro-batch-size", str(lay.micro_batch)), ("--global-batch-size", str(job.training.global_batch))]),
        ("recompute", _recompute_args(job, lost)),
        ("kernels", _kernel_args(job, lost)),
        ("precision", _precision_args(job)),
    ]
    lost += framework_note(job, "megatron", "Megatron-LM")
    lost += deepspeed_only_notes(job, "Megatron-LM")
    lost += triton_attention_note(job, "Megatron-LM", "Transformer Engine's fused attention")
    recipe = fp8_recipe(job)
    lost += fp8_note(job, "Megatron-LM", f"Megatron-Core's {recipe} scaling (--fp8-recipe {recipe})")
    lines = [
        "#!/usr/bin/env bash",
        comment_block(["Megatron-LM arguments written by autopar", *summary_lines(job)]),
        comment_block(
            [
                "Add data, tokenizer (vocabulary size "
                f"{job.model.vocab_size}), optimizer and checkpoint arguments, then on every node:",
                "  source megatron_args.sh",
                f"  torchrun --nnodes {job.nodes} --nproc-per-node {job.gpus_per_node} --rdzv-backend c10d "
                '--rdzv-endpoint "$MASTER_ADDR:29500" pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...',
                "Written for Megatron-LM core_v0.16.1 (megatron-core 0.16.1), whose parse_args and validate_args "
                "accept it at this world size.",
            ]
        ),
        comment_block(notes_lines("Megatron-LM", lost)),
        *_environment(job),
        "MEGATRON_ARGS=(",
    ]
    for name, args in sections:
        if not args:
            continue
        lines.append(f"    # {name}")
        lines += [f"    {_render(a)}" for a in args]
    lines.append(")")
    return ExportResult("\n".join(lines) + "\n", "megatron_args.sh", lost, "text/x-shellscript")
