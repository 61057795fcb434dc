"""Rollout engines behind one small interface (:class:`scale.generator.engines.base.RolloutEngine`).

Part of the generator role: may import the core and ``scale.dist`` only.
"""

from .base import EngineError, Generation, RolloutEngine


def make_engine(kind: str, **kwargs) -> RolloutEngine:
    if kind == "hf":
        from .hf import HFEngine

        return HFEngine(**kwargs)
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    raise ValueError(f"unknown engine {kind!r} (vllm or hf)")


__all__ = ["EngineError", "Generation", "RolloutEngine", "make_engine"]
