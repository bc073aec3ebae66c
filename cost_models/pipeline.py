"""Pipeline schedules: in-flight micro-batches (memory) and bubble (time).

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush and interleaved 1F1B (Narayanan et al.
2021, Sec. 2.2): with p stages, m micro-batches and v virtual stages per rank, the bubble is
(p - 1) / v micro-batch slots of one stage's forward+backward, i.e. a fraction (p-1)/(m+p-1) of
the step for v = 1. Activation memory (Korthikanti et al. 2022, Sec. 4.2.3): under 1F1B the first
stage holds p micro-batches; under interleaving it holds p * (1 + (p-1)/(p*v)) micro-batches' worth
of its layers when a rank runs p micro-batches on one chunk before moving to the next. Both
frameworks that interleave let that group N differ from p (`interleaving_group`): rank r then
warms up with 2(p - r - 1) + (v - 1)N chunk forwards (Megatron-Core's `get_pp_rank_microbatches`,
torch's `_get_warmup_ops`), and Megatron's combined 1F1B (`--overlap-moe-expert-parallel-comm`)
runs one more so that every 1F1B step pairs independent micro-batches. The bubble stays
(p - 1)/v: with N >= p a chunk's next input is ready before the rank needs it.

Zero bubble (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR; the ZB1P / ZB-H1 schedule
that `torch.distributed.pipelining.ScheduleInterleavedZeroBubble` implements, interleaved when a
rank holds v chunks): the backward is split into the input gradient B and the weight gradient W,
and the W passes fill the idle slots, so a stage's bubble is (p - 1)(F + B - W) instead of 1F1B's
(p - 1)(F + B + W) (DeepSeek-V3's table writes the same as (PP - 1)(F + B_full - 2W)), divided by v
when interleaved. The paper's ZB-H1 holds 1F1B's p - r micro-batches; torch's implementation does
not: every rank warms up with p forwards, and the gradients of the weight GEMMs' outputs wait
between a micro-batch's two backward passes (`split_backward_peaks`, measured).

V-shape schedules hold exactly two chunks per rank, placed as a V: chunk c on rank c for c < p and
on rank 2p - 1 - c after (`chunk_rank`), so rank 0 holds the embedding *and* the LM head, and
chunks p - 1 and p meet on rank p - 1 without a send. Times below are of one chunk (half the rank's
layers): F forward, B the full backward, W its weight-gradient part.
- zbv (Qi et al. 2024, Sec. 6, "ZB-V"; torch's ScheduleZBVZeroBubble): zero bubble and 1F1B's
  activation memory when F = B_input = W, with every rank holding p micro-batches of its layers
  (the schedule balances the ranks; the Sea AI Lab comparison table: bubble 0, activations 1x,
  pipeline traffic 2x of 1F1B), plus the pending weight-output gradients of its split backward
  (`split_backward_peaks`). For unequal times we take (p - 1)(F + B - 3W), clipped at zero:
  0 at the paper's F = B_input = W, and interleaved 1F1B's (p - 1)(F + B) at v = 2 when W is 0 (a V
  of chunks without the weight-gradient trick is interleaving with two chunks).
- dualpipev (DeepSeek's DualPipe repository, "DualPipeV": the cut-in-half DualPipe of Sea AI Lab;
  torch's ScheduleDualPipeV): bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p chunks, i.e.
  (p - 1)(F&B + B - 3W), F&B the time of a forward and a backward chunk of two micro-batches
  overlapped (compute of both; their communication hides behind it, `step_time`); activations
  PP + 1 = 2p + 1 chunks, p + 1/2 micro-batches of the rank's layers, on every rank. torch needs at
  least 2p micro-batches.

Looped BFS (Lamy-Poirier 2022, "Breadth-First Pipeline Parallelism"; torch's ScheduleLoopedBFS):
chunks looped over the ranks as in interleaved 1F1B, but a rank runs every micro-batch's forward
of each of its chunks, then every backward: interleaving's (p - 1)/v bubble with GPipe's memory
(all m micro-batches of the rank's layers).
"""

from __future__ import annotations

import numpy as np

V_SCHEDULES = ("zbv", "dualpipev")
"""Schedules that place two chunks per rank as a V (module doc)."""
SPLIT_BACKWARD_SCHEDULES = ("zero_bubble", "zbv", "dualpipev")
"""Schedules that split the backward into input- and weight-gradient passes: the weight passes may
fill the bubble (bounded by zero), and ZeRO-3's per-layer reshard drops them (`ZERO_BUBBLE_ZERO3`)."""
TORCH_ONLY_SCHEDULES = (*SPLIT_BACKWARD_SCHEDULES, "looped_bfs")
"""Schedules only torch.distributed.pipelining runs (framework fsdp: torchtitan's)."""
FORWARDS_FIRST_SCHEDULES = ("gpipe", "looped_bfs")
"""Schedules that run every forward of a rank's chunks before any backward."""
FB_PAIRED_SCHEDULES = ("dualpipev",)
"""Schedules that run one micro-batch's forward chunk beside another's backward chunk (F&B), so
the MoE all-to-alls of both hide behind their compute (`cost_models.step_time`)."""
WEIGHT_PASS_SCHEDULES = tuple(x for x in SPLIT_BACKWARD_SCHEDULES if x not in FB_PAIRED_SCHEDULES)
"""Split-backward schedules that defer the weight pass in their steady state (DualPipeV pairs full
backwards with forwards there: its weight passes are in the cool-down only)."""


def is_v_shape(schedule: str, pp: int) -> bool:
    """Whether a pipeline of `pp` ranks under `schedule` places its chunks as a V."""
    return pp > 1 and schedule in V_SCHEDULES


def chunk_rank(chunk: int, pp: int, v_shape: bool = False) -> int:
    """Pipeline rank of chunk `chunk`: c % pp when looped (Megatron's interleaving), the V
    (c, then 2pp - 1 - c) for the V-shape schedules."""
    if v_shape:
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def interleaving_group(framework: str, pp: int, micro_batches: int) -> int | None:
    """Micro-batches a rank runs on one chunk before the next under interleaved 1F1B (module doc),
    or None when the framework refuses this count of micro-batches.
    - megatron: Megatron-Core's `microbatch_group_size_per_vp_stage`
      (`--microbatch-group-size-per-virtual-pipeline-stage`, default p). It must lie in [p, m], and
      the last group, m % N, must be empty or at least p (`forward_backward_pipelining_with_
      interleaving` raises otherwise). We take the smallest such N (the least warm-up memory): p
      when p divides m; 120 micro-batches over p = 16 take N = 20.
    - fsdp (torch's `ScheduleInterleaved1F1B`): m // p rounds of m / rounds micro-batches; m must
      be a multiple of the rounds. torch also runs m < p in one round, but then every chunk's
      round waits on the last stage: a bubble the (p - 1)/v formula does not hold, so not priced.
    - deepspeed: no interleaving."""
    p, m = pp, micro_batches
    if m < p:
        return None
    if framework == "megatron":
        return next((n for n in range(p, m + 1) if m % n == 0 or m % n >= p), None)
    if framework == "fsdp":
        return m // (m // p) if zero_bubble_rounds_ok(p, m) else None  # torch's rounds rule, shared
    return None


def in_flight_micro_batches(
    schedule: str, pp: int, vpp: int, micro_batches: int, rank: int, framework: str = "megatron", paired: bool = False
) -> float:
    """Micro-batches' worth of this rank's activations alive at its peak (may be fractional under
    interleaving, where a rank holds chunks of different micro-batches). Interleaved 1F1B warms up
    with the `framework`'s micro-batch group (`interleaving_group`; pp where none is valid), plus
    one forward when `paired` (Megatron's combined 1F1B)."""
    if pp == 1:
        return 1.0
    if schedule in FORWARDS_FIRST_SCHEDULES:
        return float(micro_batches)
    if schedule == "1f1b":
        return float(min(micro_batches, pp - rank))
    if schedule == "zero_bubble":  # torch's order, replayed (ZB1P: p forwards on every rank)
        return max(a for a, _ in _zero_bubble_states(pp, vpp, micro_batches, rank))
    if schedule == "zbv":  # chunks alive: min(2p, m + 1 + r, 2m), p micro-batches once m >= 2p - 1
        return min(2 * pp, micro_batches + 1 + rank, 2 * micro_batches) / 2
    if schedule == "dualpipev":  # 2p + 1 chunks of half the rank's layers
        return min(2 * pp + 1, 2 * micro_batches) / 2
    if schedule == "interleaved_1f1b":
        # warm-up for rank r: 2*(p - r - 1) + (v - 1)*N chunk forwards (+1 paired), plus the one in
        # steady state; each chunk is 1/v of the rank's layers.
        group = interleaving_group(framework, pp, micro_batches) or pp
        chunks = 2 * (pp - rank - 1) + (vpp - 1) * group + 1 + int(paired)
        return min(chunks, micro_batches * vpp) / vpp
    raise ValueError(f"unknown schedule {schedule!r}")


ZB_WEIGHT_SHARE = 0.5
"""W's share of a backward pass without recompute: the weight-gradient GEMMs are as large as the
input-gradient ones (T_B = T_W, the ZB paper's own analysis and its Table 1 profile, within 10%
for GPT layers); attention's backward, which has no weights, makes the true share a little lower."""


def bubble_slots(schedule: str, pp: int, vpp: int) -> float:
    """Idle time of a pipeline step in units of one micro-batch's forward+backward on one stage
    (zero bubble: with F = B = W, (F + B - W) / (F + B + W) = 1/3 of 1F1B's)."""
    if pp == 1:
        return 0.0
    if schedule == "zero_bubble":
        return (pp - 1) / vpp / 3
    if schedule == "zbv":  # (p - 1)(F + B - 3W) per chunk at F = B_input = W
        return 0.0
    if schedule == "dualpipev":  # (p - 1)(F&B + B - 3W) per chunk, F&B = F + B: 2 of a micro-batch's 6 chunk units
        return (pp - 1) / 3
    if schedule in ("interleaved_1f1b", "looped_bfs"):
        return (pp - 1) / vpp
    return float(pp - 1)


def rank_idle(schedule: str, per_mb: np.ndarray, backward: np.ndarray, weight: np.ndarray, vpp: int) -> np.ndarray:
    """Seconds a rank idles per step for each other rank in the pipeline, from its micro-batch time
    `per_mb` (forward + backward), backward `backward` and weight-gradient share `weight` (arrays
    of one shape; `step_time.compose` sums it over every rank but the slowest). The chunk formulas
    of the module doc, chunks of 1/v of the rank (1/2 in a V):
    - 1F1B, GPipe, interleaved, looped BFS: t_r / v (Narayanan et al. 2021);
    - zero_bubble: (t_r - 2 W_r) / v, never below zero (ZB1P: (p - 1)(F + B - W));
    - zbv: (t_r - 3 W_r) / 2 ((p - 1)(F + B - 3W) per chunk);
    - dualpipev: (t_r + B_r - 3 W_r) / 2 ((p - 1)(F&B + B - 3W) per chunk, F&B = F + B)."""
    if schedule == "zero_bubble":
        return np.maximum(0.0, per_mb - 2 * weight) / vpp
    if schedule == "zbv":
        return np.maximum(0.0, per_mb - 3 * weight) / 2
    if schedule == "dualpipev":
        return np.maximum(0.0, per_mb + backward - 3 * weight) / 2
    return per_mb / vpp


def bubble_fraction(schedule: str, pp: int, vpp: int, micro_batches: int) -> float:
    """Share of the step the pipeline idles: (p-1)/(m+p-1) for GPipe and 1F1B; the interleaved
    schedule divides the idle slots by v; zero bubble keeps a third of them (F = B = W)."""
    idle = bubble_slots(schedule, pp, vpp)
    return idle / (micro_batches + idle)


def split_backward_peaks(
    schedule: str, pp: int, vpp: int, micro_batches: int, rank: int, framework: str = "megatron", paired: bool = False
) -> list[tuple[float, float]]:
    """Candidate peaks of a rank as (a, g) pairs: a micro-batches of the rank's saved activations and
    g micro-batches of its *pending weight-output gradients* alive together; the rank's peak is the
    largest a x acts + g x pending (`stage_table.price_memory`; pending = `StageTable.pending_wgrad`,
    the gradients of the weight GEMMs' outputs (`compute.layer_gemms`), which a split backward keeps
    from a chunk's input-gradient pass until its weight-gradient pass).

    Measured with torch 2.13's schedules on fake-world traces and replays of their action lists
    (Llama-3-8B TP4 x PP4, 8 micro-batches; docs/verification-notes.md):
    - zero_bubble (ScheduleInterleavedZeroBubble, one chunk per rank or interleaved): replayed from
      torch's action order (`_zero_bubble_states`). One chunk per rank: every rank holds p
      micro-batches, and rank r >= 1 up to r + 1 of them between their two passes; rank 0's input
      pass is the whole backward (the model's first chunk has no input gradient).
    - zbv: the steady state holds min(2p, m + 1 + r, 2m) chunks and one chunk pending; in the
      cool-down (m >= 2p - 1) rank r runs r input passes on each chunk before any weight pass:
      (p + r) chunks and 2r + 1 chunks pending. Chunks are half a micro-batch of the rank's layers.
    - every other schedule: (`in_flight_micro_batches`, 0)."""
    m, r = micro_batches, rank
    if pp > 1 and schedule == "zero_bubble":
        return _zero_bubble_states(pp, vpp, m, r)
    base = in_flight_micro_batches(schedule, pp, vpp, m, r, framework, paired)
    if pp == 1 or schedule != "zbv":
        return [(base, 0.0)]
    out = [(base, 0.5)]
    if m >= 2 * pp - 1:
        out.append(((pp + r) / 2, (2 * r + 1) / 2))
    return out


def _zero_bubble_states(pp: int, vpp: int, micro_batches: int, rank: int) -> list[tuple[float, float]]:
    """The (activations, pending) states of rank `rank` under torch's ScheduleInterleavedZeroBubble,
    replayed from its action order (torch 2.13 `_get_1f1b_rank_ops` with `enable_zero_bubble`):
    m / rounds micro-batches per round (rounds = max(1, m // p)); (v - 1) x per-round + (p - 1 - r)
    warm-up forwards; then each step a forward (while any is left), an input-gradient pass, and,
    from step r on, the weight pass of the oldest pending chunk; the rest of the weight passes at
    the end. A chunk holds its activations from its forward to its weight pass, and its pending
    weight-output gradients from its input pass to its weight pass; the model's first chunk has no
    input gradient, so its input pass is the whole backward (no pending, no weight pass). Returns
    the states no other state exceeds in both, in micro-batches of the rank's layers (chunks / v)."""
    rounds = max(1, micro_batches // pp)
    per_round = micro_batches // rounds
    total = micro_batches * vpp
    warmup = min((vpp - 1) * per_round + (pp - 1 - rank), total)

    def stage_backward(step: int) -> int:  # local chunk of the step's backward (`backward_stage_index`)
        return vpp - 1 - ((step - warmup) // per_round) % vpp

    acts = pending = 0
    states: set[tuple[int, int]] = set()
    first = rank == 0  # local chunk 0 of rank 0 is the model's first chunk
    queue: list[int] = []  # local chunks with an input pass done and a weight pass due
    weights_done = 0

    def weight() -> None:
        nonlocal acts, pending, weights_done
        chunk = queue[weights_done]
        weights_done += 1
        if not (first and chunk == 0):
            acts -= 1
            pending -= 1

    for op in range(2 * total - warmup):
        if op < total:  # a forward (warm-up or steady state)
            acts += 1
            states.add((acts, pending))
        if op >= warmup:  # an input-gradient pass
            chunk = stage_backward(op)
            queue.append(chunk)
            if first and chunk == 0:
                acts -= 1  # the whole backward
            else:
                pending += 1
            states.add((acts, pending))
            if op - warmup >= rank:
                weight()
    frontier = [s for s in states if not any(o != s and o[0] >= s[0] and o[1] >= s[1] for o in states)]
    return [(a / vpp, g / vpp) for a, g in sorted(frontier)]


def dualpipev_min_micro_batches(pp: int) -> int:
    """torch's ScheduleDualPipeV needs at least 2 x pp micro-batches (one per stage of the V)."""
    return 2 * pp


def dualpipev_micro_batches_ok(pp: int, micro_batches: int) -> bool:
    """At least `dualpipev_min_micro_batches`."""
    return micro_batches >= dualpipev_min_micro_batches(pp)


def dualpipev_loss_meets_first_chunk(pp: int, micro_batches: int) -> bool:
    """Whether, on rank 0 of torch 2.13's ScheduleDualPipeV, a loss backward (chunk 2p - 1's, on the
    same rank as chunk 0) runs while 2p + 1 chunks are alive *after* chunk 0's first backward.
    Replaying `_calculate_single_rank_operations` (step 1: 2(p - 1) F0; step 2: F0 F1; step 3: p - 1
    x I1 W F1; step 4: m - 2p + 1 x (F0 + B1, F1 + B0); ...): 2p + 1 chunks meet a loss backward in
    each step-4 iteration's F0 + B1, and chunk 0's first backward ends iteration 0. So only with more
    than the minimum 2p micro-batches (checked against the replay for p = 2, 4, 8)."""
    return micro_batches > dualpipev_min_micro_batches(pp)


def zero_bubble_rounds_ok(pp: int, micro_batches: int) -> bool:
    """torch's interleaved schedules (ScheduleInterleavedZeroBubble, ScheduleInterleaved1F1B) run
    the micro-batches in max(1, m // pp) rounds and refuse a count that is not a multiple of the
    rounds."""
    rounds = max(1, micro_batches // pp)
    return micro_batches % rounds == 0


ZERO_BUBBLE_ZERO3 = (
    "zero_bubble, zbv or dualpipev with ZeRO-3: FSDP2 reshards a layer when its input-gradient pass ends, before the "
    "weight-gradient pass, whose gradients are then lost (measured on torch 2.13, "
    "tests/runtime/test_parallel_layouts.py; torchtitan keeps weights unsharded under pipelining): use zero_stage 2"
)
"""Why zero bubble is not run with ZeRO-3: `layout.framework_violations` and the search's knob grid say the same."""
