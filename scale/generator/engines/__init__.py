"""Rollout engines behind one small interface (:class:`scale.generator.engines.base.RolloutEngine`).

Part of the generator role: may import the core and ``scale.dist`` only.
"""

from typing import Any

from .base import EngineError, Generation, RolloutEngine


def make_engine(kind: str, **kwargs) -> RolloutEngine:
    if kind == "hf":
        from .hf import HFEngine

        return HFEngine(**kwargs)
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    raise ValueError(f"unknown engine {kind!r} (vllm or hf)")


def from_config(
    cfg,  # type: ignore[no-untyped-def]
    *,
    context_len: int,
    eos_id: int,
    pad_id: int,
    seed_offset: int = 0,
    distributed: bool = False,
    sleep: bool | None = None,
    model: Any = None,
    shm_ident: str | None = None,
) -> RolloutEngine:
    """The run's engine (``rollout.engine``), whichever placement holds it: vLLM from
    ``model.path`` with dummy weights (the learner's version arrives before the first round),
    seeded ``rollout.seed + seed_offset``, asleep during the update when ``sleep`` (default
    ``rollout.sleep_during_training``), one engine across the ranks of its group when
    ``distributed``; or the transformers engine, generating with ``model`` (the learner's own
    module) or, without one, its own copy of ``model.path``, loaded with each version."""
    r = cfg.rollout
    if r.engine == "hf":
        owns = model is None
        if owns:
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                cfg.model.path, dtype=getattr(torch, cfg.model.dtype)
            )
        return make_engine("hf", model=model, eos_id=eos_id, pad_id=pad_id, owns=owns)
    return make_engine(
        "vllm",
        model_path=cfg.model.path,
        dtype=r.dtype,
        max_model_len=context_len,
        gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_gib=r.kv_cache_gib,
        tensor_parallel=r.tensor_parallel,
        seed=r.seed + seed_offset,
        sleep_during_training=r.sleep_during_training if sleep is None else sleep,
        sync_timeout_s=r.sync_timeout_s,
        distributed=distributed,
        dummy_weights=True,
        shm_ident=shm_ident,
    )


__all__ = ["EngineError", "Generation", "RolloutEngine", "from_config", "make_engine"]
