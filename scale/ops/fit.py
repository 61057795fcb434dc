"""Does a rollout engine fit its GPU? The arithmetic that refuses a layout before any model loads.

vLLM refuses to start when its weights and the KV cache of one sequence at ``max_model_len``
do not fit in ``gpu_memory_utilization`` of the device ("... is larger than the available KV
cache memory", or "Free memory on device ... is less than desired GPU memory utilization"),
and it says so only after the model files have been read, minutes into a run. Per engine GPU:

* weights: ``2 * params / tensor_parallel`` bytes (bf16, split over the engine's GPUs);
* the KV cache of one sequence at the engine's context: ``2 * layers * kv_heads * head_dim *
  2 B`` per token, split over the engine's GPUs (the least vLLM demands: one sequence must fit);
* the profiler's activation reserve (:data:`ACTIVATION_RESERVE_GIB`, an assumption);

against ``gpu_memory_utilization * device memory``. The context used is
``rollout.max_model_len`` when set, else ``algo.max_len`` alone (no prompt): a lower bound of
what the run asks, so a layout refused here cannot fit at any prompt length.

A disaggregated generator's processes (``tensor_parallel`` of them) each hold every version
they receive in host memory until their engine takes it: up to ``max_staleness + 2``
versions of bf16 weights per process, all on rank 0's node (:func:`host_bytes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GiB = 1024**3

ACTIVATION_RESERVE_GIB = 1.0
"""What vLLM's memory profiling keeps for activations and sampling beside weights and KV cache
(an assumption: it depends on ``max_num_batched_tokens`` and the model)."""


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gib: float
    """Device memory as the driver reports it (``torch.cuda.get_device_properties().total_memory``)."""
    host_gib: float
    """Host memory of the vendor's 8-GPU node (DGX), per node: an assumption, overridden by ``--host-mem``."""
    tflops: float = 312.0
    """Dense bf16 peak TFLOP/s (the vendor's data sheet, SXM parts): ``dapo plan``'s default for
    this type, overridden by ``--gpu-tflops``."""


GPUS: dict[str, GpuType] = {
    "a100-40gb": GpuType("A100 40GB", 39.4, 1024.0, 312.0),
    "a100-80gb": GpuType("A100 80GB", 79.2, 2048.0, 312.0),
    "h100-80gb": GpuType("H100 80GB", 79.2, 2048.0, 989.0),
    "h200": GpuType("H200 141GB", 139.8, 2048.0, 989.0),
}


def gpu_type(name: str) -> GpuType:
    key = name.lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU type {name!r}: one of {', '.join(GPUS)}")
    return GPUS[key]


@dataclass(frozen=True)
class Arch:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k, v (bias), o
        mlp = 3 * h * self.intermediate
        return attn + mlp + 2 * h

    def params(self) -> int:
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Trainable parameters of rank-``rank`` adapters on the named Qwen2 projections:
        ``rank * (in + out)`` per adapted linear layer, every decoder layer."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        shapes = {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        per_layer = sum(rank * (a + b) for name, (a, b) in shapes.items() if name in targets)
        return self.layers * per_layer

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


# Qwen2.5 base models and the Math models of the smaller presets (their config.json; the Math
# models' context is 4,096 positions)
KNOWN: dict[str, Arch] = {
    "Qwen/Qwen2.5-Math-1.5B": Arch(1536, 28, 12, 2, 8960, 151936, True),
    "Qwen/Qwen2.5-Math-7B": Arch(3584, 28, 28, 4, 18944, 152064, False),
    "Qwen/Qwen2.5-0.5B": Arch(896, 24, 14, 2, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B": Arch(1536, 28, 12, 2, 8960, 151936, True),
    "Qwen/Qwen2.5-3B": Arch(2048, 36, 16, 2, 11008, 151936, True),
    "Qwen/Qwen2.5-7B": Arch(3584, 28, 28, 4, 18944, 152064, False),
    "Qwen/Qwen2.5-14B": Arch(5120, 48, 40, 8, 13824, 152064, False),
    "Qwen/Qwen2.5-32B": Arch(5120, 64, 40, 8, 27648, 152064, False),
    "Qwen/Qwen2.5-72B": Arch(8192, 80, 64, 8, 29568, 152064, False),
}


def arch_for(path: str) -> Arch:
    if path in KNOWN:
        return KNOWN[path]
    cfg_file = Path(path) / "config.json"
    if cfg_file.is_file():
        c = json.loads(cfg_file.read_text())
        return Arch(
            c["hidden_size"],
            c["num_hidden_layers"],
            c["num_attention_heads"],
            c.get("num_key_value_heads", c["num_attention_heads"]),
            c["intermediate_size"],
            c["vocab_size"],
            bool(c.get("tie_word_embeddings", False)),
        )
    raise ValueError(f"unknown model {path!r}: use one of {sorted(KNOWN)} or a directory with config.json")


def engine_context(cfg) -> int:
    """The engine context the arithmetic assumes (see the module docstring)."""
    return int(cfg.rollout.max_model_len or cfg.algo.max_len)


def engine_gib(cfg, *, tensor_parallel: int | None = None) -> dict[str, float]:
    """Per engine GPU (GiB): its weights, one sequence's KV cache at the context, the reserve."""
    a = arch_for(cfg.model.path)
    tp = tensor_parallel or cfg.rollout.tensor_parallel
    return {
        "weights": 2 * a.params() / tp / GiB,
        "kv_one_sequence": a.kv_bytes_per_token() * engine_context(cfg) / tp / GiB,
        "activation_reserve": ACTIVATION_RESERVE_GIB,
    }


def engine_problem(cfg, memory_gib: float, what: str, tensor_parallel: int | None = None) -> str | None:
    """One line naming the term that does not fit in ``gpu_memory_utilization`` of a
    ``memory_gib`` device, or None. ``what`` names the engine (a generator, the colocated one)."""
    tp = tensor_parallel or cfg.rollout.tensor_parallel
    g = engine_gib(cfg, tensor_parallel=tp)
    util = cfg.rollout.gpu_memory_utilization
    budget = util * memory_gib
    where = (
        f"rollout.gpu_memory_utilization={util:g} x {memory_gib:g} GiB = {budget:.1f} GiB per GPU "
        f"at rollout.tensor_parallel={tp}"
    )
    if g["weights"] > budget:
        return f"{what}: the vLLM weights ({g['weights']:.1f} GiB per GPU) exceed {where}"
    need = sum(g.values())
    if need > budget:
        return (
            f"{what}: the vLLM weights ({g['weights']:.1f} GiB) plus one {engine_context(cfg)}-token "
            f"sequence's KV cache ({g['kv_one_sequence']:.1f} GiB) plus its activation reserve "
            f"({g['activation_reserve']:g} GiB) need {need:.1f} GiB per GPU, more than {where}"
        )
    return None


def smallest_tp(cfg, memory_gib: float, limit: int = 8) -> int | None:
    """The smallest power-of-two ``rollout.tensor_parallel`` (up to ``limit``) at which the
    engine fits, or None."""
    tp = 1
    while tp <= limit:
        if engine_problem(cfg, memory_gib, "", tp) is None:
            return tp
        tp *= 2
    return None


def problems(cfg, gpu: GpuType) -> list[str]:
    """Every engine term that cannot fit on ``gpu``, one line each (empty: it fits)."""
    what = (
        f"each of rollout.generators={cfg.rollout.generators} generator(s)"
        if cfg.disaggregated
        else "the colocated engine"
    )
    p = engine_problem(cfg, gpu.memory_gib, f"{what} on {gpu.name}")
    if p is None:
        return []
    tp = smallest_tp(cfg, gpu.memory_gib)
    if tp is None:
        return [p + "; no tensor_parallel up to 8 fits"]
    return [p + f"; rollout.tensor_parallel={tp} fits"]


def host_bytes(cfg, params: int, *, nodes: int, gpus_per_node: int) -> dict[str, float]:
    """Host memory of the learners' rank 0's node (bytes), by term: offloaded trainer state
    (fp32 parameters, gradients and AdamW moments, 16 B per parameter, over the learners'
    nodes) under ``train.fsdp_offload``; the colocated engines' sleep backups (their bf16
    weights, each engine GPU's share); a disaggregated run's versions held by the generators
    (on rank 0's node unless ``rollout.generator_nodes``: :func:`generator_node_bytes`) and,
    under ``rollout.delta_sync``, the version rank 0 sent last; rank 0's full fp32 copy while
    it loads and shards the model."""
    r = cfg.rollout
    remote = cfg.generator_nodes
    terms = {
        "offloaded trainer state": 16 * params / (nodes - remote) if cfg.train.fsdp_offload else 0.0,
        "rank 0 loading the fp32 model": 4 * params,
    }
    if cfg.disaggregated:
        if not remote:
            terms["versions held by the generators (rank 0's node)"] = generator_node_bytes(cfg, params)
        if r.delta_sync:  # scale.dist.delta: rank 0 keeps what it sent last, in the engine's dtype
            terms["the version sent last (rollout.delta_sync)"] = (
                2 * params if r.dtype != "float32" else 4 * params
            )
    elif r.engine == "vllm" and r.sleep_during_training:
        terms["vLLM sleep backups"] = gpus_per_node * 2 * params / r.tensor_parallel
    return terms


def generator_node_bytes(cfg, params: int) -> float:
    """Host memory of the versions one node's generator processes hold (each holds up to
    ``max_staleness + 2`` versions in bf16, :mod:`scale.placement.receive`): every generator on
    rank 0's node, or a generator node's share with ``rollout.generator_nodes``."""
    r = cfg.rollout
    here = r.generators // r.generator_nodes if r.generator_nodes else r.generators
    return here * r.tensor_parallel * (r.max_staleness + 2) * 2 * params


def checkpoint_bytes(params: int) -> float:
    """One checkpoint: fp32 parameters and both AdamW moments (12 B per parameter)."""
    return 12.0 * params


BATCH_BYTES_PER_POSITION = 21
"""A held batch's bytes per response position (:func:`scale.generator.rollout.batch_state`):
``old_logp`` and ``rollout_logp`` (fp32), ``response_ids`` (int64), ``version`` (int32), ``mask``
(bool)."""
BATCH_BYTES_PER_PROMPT_POSITION = 8
"""``prompt_ids`` (int64) per prompt position."""
BATCH_BYTES_PER_RESPONSE = 30
"""Per response: ``lengths``, ``prompt_len``, ``group_ids`` (int64), ``rewards`` (fp32),
``truncated`` and ``correct`` (bool)."""


def in_flight_bytes(cfg) -> float:  # type: ignore[no-untyped-def]
    """The batches a disaggregated checkpoint holds in flight (``rollout.max_staleness`` of
    them, :mod:`scale.placement.disaggregated`), each response padded to ``algo.max_len`` and
    its prompt to ``data.max_prompt_tokens`` as :func:`~scale.generator.rollout.batch_state`
    stores them: an upper bound (a generator pads to its own longest response); 0 colocated."""
    if not cfg.disaggregated or cfg.rollout.max_staleness < 1:
        return 0.0
    a = cfg.algo
    per_response = (
        BATCH_BYTES_PER_POSITION * a.max_len
        + BATCH_BYTES_PER_PROMPT_POSITION * cfg.data.max_prompt_tokens
        + BATCH_BYTES_PER_RESPONSE
    )
    return float(cfg.rollout.max_staleness * a.train_groups * a.group_size * per_response)
