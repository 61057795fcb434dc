"""``dapo plan``: will this run fit on this cluster, and how long will a step take?

A back-of-the-envelope planner with every assumption printed. Per GPU it estimates:

* trainer state under FSDP full sharding over all GPUs: fp32 master parameters (4 B),
  fp32 gradients (4 B) and AdamW moments (8 B) per parameter, divided by the GPU count;
  parameter and optimizer offload move them to host memory;
* the working set of the update: bf16 copies of the two decoder layers gathered at a time,
  activations with gradient checkpointing (one bf16 hidden state per layer per token, plus
  one layer's full activations, 34 * hidden bytes per token, Korthikanti et al. 2022, with
  flash attention) for the micro-batch's tokens, and the chunked log-prob buffers;
* the colocated vLLM engine: bf16 weights split over the tensor-parallel group and the KV
  cache (2 * layers * kv_heads * head_dim * 2 B per token) of the sequences it must hold
  at the generation ceiling, within ``gpu_memory_utilization`` of the GPU;
* the two phases: generation (engine awake, trainer state resident unless offloaded) and
  training (engine asleep when ``sleep_during_training``, else its reservation stays);
* step time from FLOPs (training: 8 * params per token for forward, backward and
  recomputation, plus 2 * params per token for the old log-probs, at an assumed MFU) and
  rollout as decode-bound throughput per GPU, bounded below by the longest response at a
  per-sequence decode speed, including the extra rounds dynamic sampling needs at a given
  acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace

from .fit import arch_for

GiB = 1024**3


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_mem_gib: float
    gpu_tflops: float = 312.0
    """Dense bf16 peak per GPU (A100: 312, H100 SXM: 989)."""
    mfu: float = 0.35
    decode_tokens_per_s_per_gpu: float = 1000.0
    """Aggregate decode throughput per GPU of a large batch (model-dependent; 32B on A100
    at TP 4: ~1k)."""
    decode_tokens_per_s_per_seq: float = 30.0
    """Decode speed of a single sequence (bounds the step by its longest response)."""
    overhead_gib: float = 3.0
    """CUDA context, NCCL buffers, allocator fragmentation per GPU."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Strategy:
    param_offload: bool = True
    optimizer_offload: bool = True
    micro_batch_tokens: int | None = None
    """Tokens per micro-batch per GPU; None: one response at the ceiling plus its prompt."""
    mean_response_frac: float = 0.25
    """Mean response length as a fraction of the ceiling (the paper's runs: ~1k-4k of 20k)."""
    acceptance: float = 0.5
    """Share of generated groups dynamic sampling keeps (0 < a <= 1)."""
    prompt_tokens: int = 512


@dataclass
class Plan:
    params: int
    per_gpu_gib: dict[str, float]
    train_phase_gib: float
    generation_phase_gib: float
    fits: bool
    engine_concurrency: int
    engine_sequences_needed: int
    step_seconds: dict[str, float]
    problems: list[str]
    advice: list[str]
    assumptions: dict


def plan(cfg, cluster: Cluster, strategy: Strategy = Strategy()) -> Plan:
    """Estimate memory and step time of ``cfg`` (a :class:`scale.config.RunConfig`)."""
    a = arch_for(cfg.model.path)
    n, mem = cluster.gpus, cluster.gpu_mem_gib * GiB
    tp = cfg.rollout.tensor_parallel
    if n % tp:
        raise ValueError(f"{n} GPUs are not divisible by tensor_parallel={tp}")
    p = a.params()
    algo = cfg.algo
    ceiling = strategy.prompt_tokens + algo.max_len
    mb_tokens = strategy.micro_batch_tokens or ceiling

    lora = cfg.model.lora
    # a LoRA policy trains its adapters only: gradients and AdamW moments for those
    trained = a.lora_params(lora.rank, tuple(lora.target_modules)) if lora.rank else p
    held = p + (trained if lora.rank else 0)  # the frozen base and the adapters
    states = {
        "fp32 parameters (sharded)": 0 if strategy.param_offload else 4 * held / n,
        "fp32 gradients (sharded)": 4 * trained / n,
        "AdamW moments (sharded)": 0 if strategy.optimizer_offload else 8 * trained / n,
    }
    work = {
        "gathered bf16 layers (2)": 2 * 2 * a.layer_params() + (2 * a.vocab * a.hidden if not a.tied else 0),
        "checkpointed activations": mb_tokens * a.hidden * 2 * a.layers,
        "one layer's activations": mb_tokens * 34 * a.hidden,
        "log-prob chunk buffers": 3 * cfg.model.logprob_chunk * a.vocab * 4,
    }
    engine_weights = 2 * p / tp
    reserve = cfg.rollout.gpu_memory_utilization * mem
    kv_budget = max(0.0, reserve - engine_weights)
    kv_per_seq = a.kv_bytes_per_token() * ceiling / tp
    engines = n // tp
    gen_seqs = cfg.gen_groups * algo.group_size
    per_engine = math.ceil(gen_seqs / engines)
    concurrency = int(kv_budget // kv_per_seq) if kv_per_seq else 0
    engine = {"vLLM weights (TP shard)": engine_weights, "vLLM KV cache (reserved)": kv_budget}

    resident = sum(states.values())
    overhead = cluster.overhead_gib * GiB
    sleeping = cfg.rollout.sleep_during_training
    train_phase = resident + sum(work.values()) + overhead + (0 if sleeping else reserve)
    gen_phase = resident + reserve + overhead
    problems, advice = [], []
    if train_phase > mem:
        problems.append(
            f"training phase needs {train_phase / GiB:.1f} GiB per GPU > {cluster.gpu_mem_gib:g} GiB"
        )
        if not (strategy.param_offload and strategy.optimizer_offload):
            advice.append("train.fsdp_offload=true: parameters and optimizer states in host memory")
        advice.append(f"more GPUs: sharded state is {resident / GiB:.1f} GiB at {n} GPUs")
        if work["checkpointed activations"] + work["one layer's activations"] > 0.3 * mem:
            advice.append("smaller micro-batch in tokens (or sequence parallelism for 20k-token responses)")
        if not sleeping:
            advice.append("rollout.sleep_during_training=true frees the engine's reservation while training")
    if gen_phase > mem:
        problems.append(
            f"generation phase needs {gen_phase / GiB:.1f} GiB per GPU > {cluster.gpu_mem_gib:g} GiB"
        )
        advice.append(
            "lower rollout.gpu_memory_utilization"
            + (
                ""
                if strategy.param_offload
                else ", or train.fsdp_offload=true (trainer state in host memory)"
            )
        )
    if engine_weights > reserve:
        problems.append(
            f"vLLM weights ({engine_weights / GiB:.1f} GiB per GPU) exceed its reservation "
            f"({reserve / GiB:.1f} GiB)"
        )
        advice.append(f"raise rollout.tensor_parallel (now {tp})")
    elif concurrency < 1:
        problems.append("the vLLM KV cache cannot hold one sequence at the generation ceiling")
        advice.append("raise rollout.tensor_parallel or rollout.gpu_memory_utilization")

    # time
    mean_resp = strategy.mean_response_frac * algo.max_len
    train_tokens = algo.train_groups * algo.group_size * (strategy.prompt_tokens + mean_resp)
    flops = 10 * p * train_tokens * algo.ppo_epochs
    train_s = flops / (n * cluster.gpu_tflops * 1e12 * cluster.mfu)
    acc = strategy.acceptance if algo.dynamic_sampling else 1.0
    groups_needed = algo.train_groups / acc
    rounds = math.ceil(groups_needed / cfg.gen_groups)
    gen_tokens = rounds * cfg.gen_groups * algo.group_size * mean_resp
    gen_throughput_s = gen_tokens / (n * cluster.decode_tokens_per_s_per_gpu)
    tail_s = rounds * algo.max_len / cluster.decode_tokens_per_s_per_seq
    gen_s = max(gen_throughput_s, tail_s)
    step = {
        "generation": gen_s,
        "generation_rounds": float(rounds),
        "training": train_s,
        "total": gen_s + train_s,
    }
    return Plan(
        params=p,
        per_gpu_gib={k: v / GiB for k, v in {**states, **work, **engine, "overhead": overhead}.items()},
        train_phase_gib=train_phase / GiB,
        generation_phase_gib=gen_phase / GiB,
        fits=not problems,
        engine_concurrency=concurrency,
        engine_sequences_needed=per_engine,
        step_seconds=step,
        problems=problems,
        advice=advice,
        assumptions={
            **asdict(cluster),
            **asdict(strategy),
            "micro_batch_tokens": mb_tokens,
            "ceiling_tokens": ceiling,
            "tensor_parallel": tp,
            "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization,
            "sleep_during_training": sleeping,
            "mean_response_tokens": mean_resp,
            "train_tokens_per_step": train_tokens,
            "generated_tokens_per_step": gen_tokens,
            "trained_parameters": trained,  # LoRA: the adapters' (training FLOPs still counted in full)
        },
    )


@dataclass(frozen=True)
class PlacementComparison:
    """Steps per hour of each placement, from :func:`dapo.pipeline.simulate` (the planner's
    comparison; not :mod:`scale.placement`, the placements themselves)."""

    rows: list[tuple[str, int, int, float]]
    """(placement, generation GPUs, training GPUs, steps per hour)."""
    assumptions: dict[str, float | int]


DELTA_SENT_SHARE = 0.127
"""The bytes a delta sync sends per version over the whole model's (``rollout.delta_sync``):
measured by ``python benchmarks/delta_sync.py`` (benchmarks/results/delta_sync.json) at the
presets' learning rate, 1e-6, on a 0.5B-wide model (2 layers, 59M parameters), the largest
share over its 4 steps (the first: 0.127; 0.061 by the fourth). At 1e-5: 0.39-0.75; at
1e-4 every tensor goes whole."""


def placement(
    pl: Plan,
    cfg,
    cluster: Cluster,
    *,
    gen_gpus: int | None = None,
    gen_cv: float = 0.3,
    sync_gbps: float = 25.0,
    network_gbps: float = 25.0,
    steps: int = 400,
    seed: int = 0,
) -> PlacementComparison:
    """Colocated synchronous against disaggregated at k = 0, 1, 2: the same GPUs, split into
    ``gen_gpus`` that only generate and the rest that only train (None: the split, in whole
    engines, that makes k = 1 fastest). Generation time per step scales with the GPUs that
    decode (its tail does not) and varies from step to step with coefficient of variation
    ``gen_cv`` (a seeded normal draw: long-tailed rounds); training scales with the GPUs that
    train; each version is broadcast to the generators at ``sync_gbps`` GB/s (bf16).

    With ``rollout.generator_nodes`` the split is the config's: its generators on nodes of
    their own, the other nodes' GPUs train, and each version crosses the network at
    ``network_gbps`` GB/s (default 25: one 200 Gb/s HDR InfiniBand port, what learner rank 0
    sends through; the broadcast is bounded by its one link)."""
    import random

    from dapo.pipeline import simulate

    n, tp = cluster.gpus, cfg.rollout.tensor_parallel
    a = pl.assumptions
    gen_tokens, tail = a["generated_tokens_per_step"], pl.step_seconds["generation_rounds"] * cfg.algo.max_len
    tail_s = tail / cluster.decode_tokens_per_s_per_seq
    train_gpu_s = pl.step_seconds["training"] * n  # training seconds on one GPU
    rng = random.Random(seed)
    noise = [max(0.1, 1.0 + gen_cv * rng.gauss(0.0, 1.0)) for _ in range(steps)]
    sync_s = 2 * pl.params / (sync_gbps * 1e9)
    if cfg.rollout.delta_sync:  # only the changed elements travel (scale.dist.delta)
        sync_s *= DELTA_SENT_SHARE

    def gen_s(g: int) -> float:
        return max(gen_tokens / (g * cluster.decode_tokens_per_s_per_gpu), tail_s)

    def per_hour(g: int, k: int, train_gpus: int | None = None) -> float:
        t = simulate([gen_s(g) * x for x in noise], train_gpu_s / (train_gpus or n - g), k, sync_s)
        return 3600.0 * steps / t.total

    colocated = 3600.0 * steps / simulate([gen_s(n) * x for x in noise], train_gpu_s / n, 0).total
    ks: tuple[int, ...] = (0, 1, 2)
    nodes = cfg.generator_nodes
    roles: dict[str, int] = {}
    link = ("weights_broadcast_gbps", sync_gbps)
    splits = list(range(tp, n, tp))
    if nodes:  # the config's split, in whole nodes: the weights cross the network
        if nodes >= cluster.nodes:
            raise ValueError(
                f"rollout.generator_nodes={nodes} leaves no node of --nodes {cluster.nodes} to train on"
            )
        gen_gpus = cfg.rollout.generators * tp
        if gen_gpus > nodes * cluster.gpus_per_node:
            raise ValueError(
                f"rollout.generators={cfg.rollout.generators} at tensor_parallel={tp} need {gen_gpus} "
                f"GPUs; {nodes} generator node(s) have {nodes * cluster.gpus_per_node}"
            )
        sync_s *= sync_gbps / network_gbps
        roles = {"generator_nodes": nodes, "learner_nodes": cluster.nodes - nodes}
        link = ("weights_network_gbps", network_gbps)
    elif not splits and gen_gpus is not None:
        raise ValueError(f"{n} GPUs cannot be split into generation and training (tensor_parallel={tp})")
    elif not splits:  # one GPU (or one engine's worth): colocated is the only placement
        gen_gpus, ks = n, ()
    elif gen_gpus is None:
        gen_gpus = max(splits, key=lambda g: per_hour(g, 1))
    elif gen_gpus not in splits:
        raise ValueError(f"--gen-gpus {gen_gpus}: must be a multiple of tensor_parallel={tp} below {n}")
    learn = (cluster.nodes - nodes) * cluster.gpus_per_node if nodes else n - gen_gpus
    rows = [("colocated, synchronous", n, n, colocated)]
    rows += [(f"disaggregated, k = {k}", gen_gpus, learn, per_hour(gen_gpus, k, learn)) for k in ks]
    return PlacementComparison(
        rows,
        {
            **roles,
            "generation_s_on_all_gpus": round(gen_s(n), 1),
            "training_s_on_all_gpus": round(train_gpu_s / n, 1),
            "generation_cv": gen_cv,
            link[0]: link[1],
            "weights_broadcast_s": round(sync_s, 1),
            **({"delta_sync_sent_share": DELTA_SENT_SHARE} if cfg.rollout.delta_sync else {}),
            "simulated_steps": steps,
        },
    )


def format_placement(p: PlacementComparison) -> str:
    base = p.rows[0][3]
    lines = ["placement (steps per hour, dapo.pipeline.simulate):"]
    if "generator_nodes" in p.assumptions:
        a = p.assumptions
        lines.append(
            f"  nodes: {a['learner_nodes']} learner node(s), {a['generator_nodes']} generator node(s) "
            f"(rollout.generator_nodes); weights over the network at {a['weights_network_gbps']:g} GB/s"
        )
    for name, g, t, rate in p.rows:
        where = f"{g} GPUs take turns" if name.startswith("colocated") else f"{g} generate, {t} train"
        lines.append(f"  {name:<24} {where:<28} {rate:8.2f}  ({rate / base:.2f}x)")
    if len(p.rows) == 1:
        lines.append("  (no disaggregated split: the GPUs hold one engine's tensor-parallel group)")
    lines.append("  assumptions: " + ", ".join(f"{k}={v}" for k, v in p.assumptions.items()))
    return "\n".join(lines)


def selection_saving(cfg, cluster: Cluster, strategy: Strategy, acceptance: float) -> dict[str, float]:
    """What prompt selection saves per step: the generation time at the acceptance rate
    measured with it (``acceptance``) against the rate without (``strategy.acceptance``),
    everything else equal (a skipped prompt costs no generation). The rates come from a run's
    ``sampling/accept_rate`` (or the toy's informative rate), with and without
    ``algo.prompt_selection``."""
    if not 0 < acceptance <= 1:
        raise ValueError(f"--selection-acceptance must lie in (0, 1], got {acceptance}")
    without = plan(cfg, cluster, strategy).step_seconds
    with_sel = plan(cfg, cluster, Strategy(**{**asdict(strategy), "acceptance": acceptance})).step_seconds
    saved = without["generation"] - with_sel["generation"]
    return {
        "acceptance_without": strategy.acceptance,
        "acceptance_with": acceptance,
        "rounds_without": without["generation_rounds"],
        "rounds_with": with_sel["generation_rounds"],
        "generation_s_without": without["generation"],
        "generation_s_with": with_sel["generation"],
        "generation_saved_s": saved,
        "step_saved_fraction": saved / without["total"] if without["total"] else 0.0,
    }


def format_selection(sel: dict[str, float]) -> str:
    return (
        f"prompt selection: acceptance {sel['acceptance_without']:.2f} -> {sel['acceptance_with']:.2f}: "
        f"{sel['rounds_without']:.0f} -> {sel['rounds_with']:.0f} generation round(s), "
        f"{sel['generation_s_without'] / 60:.1f} -> {sel['generation_s_with'] / 60:.1f} min of generation "
        f"per step (saves {sel['generation_saved_s'] / 60:.1f} min, {100 * sel['step_saved_fraction']:.0f}% "
        "of the step)"
    )


def run_time(pl: Plan, cfg, cluster: Cluster) -> dict[str, float]:
    """The whole run at the estimated step time: ``train.steps`` steps, hours of wall clock and
    GPU-hours (every GPU of the cluster held for the run)."""
    hours = cfg.train.steps * pl.step_seconds["total"] / 3600
    return {"steps": cfg.train.steps, "hours": hours, "gpu_hours": hours * cluster.gpus}


def format_plan(pl: Plan, cfg, cluster: Cluster) -> str:
    lines = [
        f"model {cfg.model.path}: {pl.params / 1e9:.2f} B parameters; {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPUs x {cluster.gpu_mem_gib:g} GiB; policy loss {cfg.algo.policy_loss}",
        "",
        "per GPU (GiB):",
    ]
    lines += [f"  {k:<32} {v:8.2f}" for k, v in pl.per_gpu_gib.items()]
    lines += [
        f"  {'training phase':<32} {pl.train_phase_gib:8.2f}",
        f"  {'generation phase':<32} {pl.generation_phase_gib:8.2f}",
        f"vLLM: {pl.engine_concurrency} sequences at the ceiling fit per engine; "
        f"{pl.engine_sequences_needed} per engine per round requested"
        + (" (they queue)" if pl.engine_concurrency < pl.engine_sequences_needed else ""),
        "",
        "step time (s): " + ", ".join(f"{k} {v:,.0f}" for k, v in pl.step_seconds.items()),
        "run (train.steps={steps}): {hours:,.0f} h of wall clock, {gpu_hours:,.0f} GPU-hours".format(
            **run_time(pl, cfg, cluster)
        ),
        "",
        "FITS" if pl.fits else "DOES NOT FIT",
    ]
    lines += [f"  - {p}" for p in pl.problems]
    if pl.advice:
        lines += ["what to change:"] + [f"  - {a}" for a in pl.advice]
    lines += ["", "assumptions: " + ", ".join(f"{k}={v}" for k, v in pl.assumptions.items())]
    return "\n".join(lines)


def format_storage(storage: dict, cfg) -> str:
    lines = [
        "host memory per node (GiB)"
        + (" of the learners" if "host_memory_per_generator_node_gib" in storage else "")
        + ":"
    ]
    lines += [f"  {k:<48} {v:8.0f}" for k, v in storage["host_memory_per_node_gib"].items()]
    have = storage["host_memory_available_gib"]
    lines.append(f"  {'available':<48} " + ("unknown (--host-mem)" if math.isnan(have) else f"{have:8.0f}"))
    if "host_memory_per_generator_node_gib" in storage:
        gen = storage["host_memory_per_generator_node_gib"]
        lines.append(f"host memory per generator node (GiB): {gen:,.0f} (the versions its generators hold)")
    flight = storage.get("in_flight_gb", 0.0)
    held = (
        f"; + {cfg.rollout.max_staleness} batch(es) in flight, {flight:,.1f} GB, padded to algo.max_len"
        if flight
        else ""
    )
    lines.append(
        f"checkpoints: {storage['checkpoint_gb']:,.0f} GB each (fp32 parameters and AdamW moments, 12 B per "
        f"parameter{held}); output.keep_checkpoints={cfg.output.keep_checkpoints}: "
        f"{storage['checkpoints_kept_gb']:,.0f} GB"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from dapo.cliargs import Float, Int, Parser

    from ..config import config_arguments
    from .fit import GPUS

    GPU_NAMES = list(GPUS)
    ap = Parser(prog="dapo plan", description="Memory and step-time estimate of a run.")
    config_arguments(ap)
    ap.add_argument("--gpus", type=Int(lo=1), required=True, help="GPUs per node")
    ap.add_argument("--gpu-mem", type=Float(lo=0.0, lo_open=True), default=None, help="GiB per GPU")
    ap.add_argument(
        "--gpu-type",
        type=str.lower,
        choices=GPU_NAMES,
        default=None,
        help=f"a named GPU ({', '.join(GPU_NAMES)}): its memory, and its DGX node's host memory",
    )
    ap.add_argument(
        "--host-mem",
        type=Float(lo=0.0, lo_open=True),
        default=None,
        help="host memory per node in GiB (default: the --gpu-type's DGX node; unchecked without either)",
    )
    ap.add_argument("--nodes", type=Int(lo=1), default=1, help="nodes (default 1)")
    ap.add_argument(
        "--gpu-tflops",
        type=Float(lo=0.0, lo_open=True),
        default=None,
        help="dense bf16 TFLOP/s per GPU (default: the --gpu-type's, else 312, an A100's)",
    )
    ap.add_argument(
        "--mfu",
        type=Float(lo=0.0, lo_open=True, hi=1.0),
        default=0.35,
        help="model FLOPs utilization of training, in (0, 1] (default 0.35)",
    )
    ap.add_argument(
        "--decode-tokens-per-s",
        type=Float(lo=0.0, lo_open=True),
        default=1000.0,
        help="decode throughput per GPU at large batch (default 1000)",
    )
    ap.add_argument(
        "--decode-tokens-per-s-per-seq",
        type=Float(lo=0.0, lo_open=True),
        default=30.0,
        help="decode speed of one sequence: the longest response bounds a round (default 30)",
    )
    ap.add_argument(
        "--no-offload",
        action="store_true",
        help="keep parameters and optimizer on the GPU even where the config's train.fsdp_offload is true "
        "(a config with train.fsdp_offload: false is planned without offload in any case)",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=Int(lo=1),
        default=None,
        help="tokens per micro-batch (default: the longest response)",
    )
    ap.add_argument(
        "--acceptance",
        type=Float(lo=0.0, lo_open=True, hi=1.0),
        default=0.5,
        help="dynamic-sampling acceptance rate, in (0, 1] (default 0.5)",
    )
    ap.add_argument(
        "--selection-acceptance",
        type=Float(lo=0.0, lo_open=True, hi=1.0),
        default=None,
        help="the acceptance rate measured with algo.prompt_selection: print the generation time it "
        "saves against --acceptance",
    )
    ap.add_argument(
        "--gen-gpus",
        type=Int(lo=1),
        default=None,
        help="disaggregated placement: GPUs that only generate (default: the fastest split at k = 1)",
    )
    ap.add_argument(
        "--network-gbps",
        type=Float(lo=0.0, lo_open=True),
        default=25.0,
        help="GB/s from the learners' rank 0 to generators on other nodes (rollout.generator_nodes; "
        "default 25: one 200 Gb/s InfiniBand port)",
    )
    ap.add_argument(
        "--gen-cv",
        type=Float(lo=0.0),
        default=0.3,
        help="step-to-step coefficient of variation of generation time (default 0.3)",
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dapo.cliargs import UsageError

    from ..config import load_for_cli
    from . import fit

    cfg = load_for_cli("dapo plan", args.config, args.overrides)
    if cfg is None:
        return 2
    if (args.gpu_mem is None) == (args.gpu_type is None):
        raise UsageError("give one of --gpu-mem (GiB per GPU) or --gpu-type")
    gpu = (
        fit.gpu_type(args.gpu_type)
        if args.gpu_type
        else fit.GpuType(f"{args.gpu_mem:g} GiB GPU", args.gpu_mem, math.nan)
    )
    if args.host_mem is not None:
        gpu = fit.GpuType(gpu.name, gpu.memory_gib, args.host_mem)
    cluster = Cluster(
        args.nodes,
        args.gpus,
        gpu.memory_gib,
        args.gpu_tflops or (gpu.tflops if args.gpu_type else 312.0),
        args.mfu,
        args.decode_tokens_per_s,
        args.decode_tokens_per_s_per_seq,
    )
    offload = cfg.train.fsdp_offload and not args.no_offload  # what the trainer will do
    strategy = Strategy(
        param_offload=offload,
        optimizer_offload=offload,
        micro_batch_tokens=args.micro_batch_tokens,
        acceptance=args.acceptance,
    )
    try:
        pl = plan(cfg, cluster, strategy)
    except ValueError as err:
        print(f"dapo plan: {err}", file=sys.stderr)
        return 2
    try:
        place = placement(
            pl, cfg, cluster, gen_gpus=args.gen_gpus, gen_cv=args.gen_cv, network_gbps=args.network_gbps
        )
        if cfg.generator_nodes:  # the learners' memory: sharded over their own nodes' GPUs only
            learners = plan(cfg, replace(cluster, nodes=args.nodes - cfg.generator_nodes), strategy)
            pl.per_gpu_gib, pl.problems = learners.per_gpu_gib, learners.problems
            pl.train_phase_gib = learners.train_phase_gib
    except ValueError as err:
        print(f"dapo plan: {err}", file=sys.stderr)
        return 2
    if cfg.disaggregated:  # plan() sizes a colocated engine; a generator has a GPU of its own
        pl.problems += fit.problems(cfg, gpu)
    host = fit.host_bytes(cfg, pl.params, nodes=args.nodes, gpus_per_node=args.gpus)
    host_total = sum(host.values())
    if host_total > gpu.host_gib * GiB:
        pl.problems.append(
            f"host memory: {host_total / GiB:.0f} GiB per node > {gpu.host_gib:g} GiB ("
            + ", ".join(f"{k} {v / GiB:.0f}" for k, v in host.items() if v)
            + ")"
        )
    gen_node = fit.generator_node_bytes(cfg, pl.params) if cfg.generator_nodes else 0.0
    if gen_node > gpu.host_gib * GiB:
        pl.problems.append(
            f"host memory: {gen_node / GiB:.0f} GiB per generator node > {gpu.host_gib:g} GiB (versions its "
            "generators hold)"
        )
    pl.fits = not pl.problems
    flight = fit.in_flight_bytes(cfg)
    ckpt = fit.checkpoint_bytes(pl.params) + flight
    storage = {
        "in_flight_gb": flight / 1e9,
        "host_memory_per_node_gib": {k: v / GiB for k, v in host.items()},
        "host_memory_available_gib": gpu.host_gib,
        **({"host_memory_per_generator_node_gib": gen_node / GiB} if gen_node else {}),
        "checkpoint_gb": ckpt / 1e9,
        "checkpoints_kept_gb": cfg.output.keep_checkpoints * ckpt / 1e9,
    }
    sel = (
        selection_saving(cfg, cluster, strategy, args.selection_acceptance)
        if args.selection_acceptance is not None
        else None
    )
    if args.json:
        print(
            json.dumps(
                {
                    **asdict(pl),
                    "run": run_time(pl, cfg, cluster),
                    **storage,
                    "placement": asdict(place),
                    "selection": sel,
                },
                indent=2,
            )
        )
    else:
        text = format_plan(pl, cfg, cluster) + "\n\n" + format_storage(storage, cfg)
        text += "\n\n" + format_placement(place)
        print(text + ("\n\n" + format_selection(sel) if sel else ""))
    return 0 if pl.fits else 1
