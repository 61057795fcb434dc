"""LoRA policies (``model.lora``): PEFT adapters on the learner, merged weights to the engine.

**The learner.** :func:`wrap` turns the transformers causal LM into PEFT's
``PeftModelForCausalLM`` (``LoraConfig(r, lora_alpha, target_modules, lora_dropout,
bias="none", task_type="CAUSAL_LM")``) *before* the model is sharded, so DDP sees the frozen
base and the trainable adapters as one module and FSDP2's ``fully_shard`` shards both per
parameter (it keeps ``requires_grad`` per parameter; frozen ones get no gradient and no
reduce-scatter). The adapters' initial values are drawn from a generator seeded with
``train.seed`` (the global RNG untouched), so every rank builds the same adapters and the
run's other random streams are those of full fine-tuning. The optimizer, the grad-norm clip
and the checkpoints see only the trainable parameters (:func:`trainable`).
Gradient checkpointing is the non-reentrant kind (:mod:`scale.learner.sharding`), which
needs no input that requires grad for the adapters to get gradients; PEFT still registers
its input-embedding hook (``enable_input_require_grads``), harmless either way.

**The engine gets merged weights** (:func:`merged_plan`, used by
:func:`scale.learner.sync.stream_weights`): every tensor under the base model's own name
(no ``base_model.model.`` prefix, no ``.base_layer``, no ``lora_A``/``lora_B``), each adapted
weight as ``W + (alpha / r) * B @ A``, merged in fp32 and then cast to the engine's dtype,
gathered one bucket at a time as in full fine-tuning (under FSDP2 each of W, A and B is a
DTensor gathered on its own). That is TRL's approach (``merge_adapter`` then a full-weight
push to vLLM). The alternative, vLLM's adapter loading (``enable_lora``, one
``LoRARequest`` per policy version), would send only the adapters (megabytes instead of the
model), but:

* it is a second code path in every engine (colocated and disaggregated, vLLM and the HF
  engine, which copy full tensors), in the bridge's header and in the generators' version
  bookkeeping; merged weights keep one path with full fine-tuning;
* vLLM's LoRA kernels add their own limits (``max_lora_rank``, supported target modules,
  punica kernels on CPU) and cost at every decoding step, for the whole rollout, where the
  merged model decodes at base speed; the sync's cost is paid once per step;
* the engine's log-probs are then those of the very model the trainer computes
  (``W + s B A`` in fp32), so the mismatch metrics and the importance weights measure the
  same thing they measure in full fine-tuning, not an adapter kernel's numerics;
* the cost, a full-weight stream per step, is what full fine-tuning pays already and is
  bounded by ``rollout.sync_bucket_mb`` the same way.

**Checkpoints** (:mod:`scale.learner.checkpoint`) hold the trainable parameters and their
optimizer state only (``StateDictOptions(ignore_frozen_params=True)``); on resume the base is
read again from ``model.path`` and the adapters from the checkpoint. ``dapo export`` reads the
base the same way and writes the merged model (PEFT's ``merge_and_unload``), which
transformers loads without PEFT.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

PREFIX = "base_model.model."
"""Where PEFT's wrapper puts the transformers model in its state dict."""


def require_peft() -> Any:
    """The ``peft`` module, or one line naming the extra that installs it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            "model.lora needs PEFT: pip install 'dapo-repro[scale]' (or pip install peft), or set model.lora.rank: 0"
        ) from err
    return peft


def wrap(lm: nn.Module, lora: Any, seed: int = 0) -> nn.Module:
    """``lm`` with LoRA adapters (``lora``: a :class:`scale.config.LoraConfig` with
    ``rank > 0``), base frozen, adapters initialised from ``seed`` (the same on every rank,
    the global RNG left as it was). Works on a meta-device model too (the adapters are then
    on meta and arrive with the broadcast of rank 0's state)."""
    peft = require_peft()
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.lora_alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=lora.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(lm, config)
    if not any(p.requires_grad for p in wrapped.parameters()):
        raise ValueError(
            f"model.lora.target_modules={list(lora.target_modules)} matched no layer of {type(lm).__name__}"
        )
    unmergeable(wrapped, lora)
    return wrapped


def unmergeable(wrapped: nn.Module, lora: Any) -> None:
    """Refuse, in one line, an adapted layer the weight sync cannot merge (:func:`merged_plan`
    merges ``W + s B A`` on plain linear layers): an embedding (PEFT keeps its adapters in
    ``lora_embedding_A/B``, which the stream skipped: the engine got the base weight, silently),
    any other layer type, a ``fan_in_fan_out`` layer, or a layer whose weight is tied to another
    (the tied output layer: the engine would get one merged copy and one base copy)."""
    from peft.tuners.lora.layer import Linear

    tied = bool(getattr(getattr(wrapped, "config", None), "tie_word_embeddings", False))
    for name, module in wrapped.named_modules():
        if not hasattr(module, "lora_A"):
            continue
        short = name.removeprefix(PREFIX)
        if not isinstance(module, Linear) or getattr(module, "lora_embedding_A", None):
            why = f"a {type(module).__name__} layer (the sync merges adapters on linear layers only)"
        elif getattr(module, "fan_in_fan_out", False):
            why = "a fan_in_fan_out layer (the sync merges W + s B A, not its transpose)"
        elif tied and short.endswith("lm_head"):
            why = "tied to the input embeddings (tie_word_embeddings: the engine would hold two different copies)"
        else:
            continue
        raise ValueError(
            f"model.lora.target_modules={list(lora.target_modules)}: {short} is {why}; adapt linear "
            "projections only (the default: every attention and MLP projection)"
        )


def is_lora(lm: nn.Module) -> bool:
    """Whether ``lm`` is a PEFT-wrapped model (:func:`wrap`)."""
    return hasattr(lm, "peft_config") and hasattr(lm, "base_model")


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer updates: all of them in full fine-tuning, the adapters with LoRA."""
    return [p for p in module.parameters() if p.requires_grad]


def param_counts(module: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (global under FSDP2: a DTensor's numel is the
    full tensor's); a tied weight counts once."""
    seen: set[int] = set()
    train = total = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        train += p.numel() if p.requires_grad else 0
    return train, total


Part = tuple[str, Tensor, Tensor | None, Tensor | None, float]
"""One tensor of the engine's stream: ``(name, W, A, B, scale)``; A and B None: W as it is,
otherwise ``W + scale * B @ A``."""


def merged_plan(lm: nn.Module, state: dict[str, Tensor] | None = None) -> Iterator[Part]:
    """The engine's tensors of a PEFT-wrapped ``lm`` in state-dict order, under the base
    model's names, from ``state`` (``lm.state_dict()``: DTensors under FSDP2, nothing gathered
    here). A plain model: every tensor as it is."""
    state = lm.state_dict() if state is None else state
    if not is_lora(lm):
        for name, t in state.items():
            yield name, t, None, None, 1.0
        return
    for key, t in state.items():
        if ".lora_" in key:  # lora_A / lora_B / lora_embedding_*: merged into their base weight
            continue
        name = key.removeprefix(PREFIX)
        if ".base_layer." not in name:
            yield name, t, None, None, 1.0
            continue
        owner, _, leaf = key.rpartition(".base_layer.")
        name = name.replace(".base_layer.", ".")
        layer = lm.get_submodule(owner)
        adapters = [a for a in getattr(layer, "active_adapters", ()) if a in getattr(layer, "lora_A", {})]
        if leaf != "weight" or not adapters:
            yield name, t, None, None, 1.0
            continue
        if len(adapters) != 1 or getattr(layer, "fan_in_fan_out", False):
            raise ValueError(
                f"{owner}: the weight sync merges one plain LoRA adapter per layer (what model.lora "
                f"builds); found adapters {adapters}, fan_in_fan_out={getattr(layer, 'fan_in_fan_out', False)}"
            )
        (a,) = adapters
        yield (
            name,
            t,
            state[f"{owner}.lora_A.{a}.weight"],
            state[f"{owner}.lora_B.{a}.weight"],
            float(layer.scaling[a]),
        )


def merge(w: Tensor, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """``W + scale * B @ A`` in fp32, in PEFT's order of operations (``merge_and_unload``:
    ``delta = (B @ A) * scale``, ``W + delta``), so the engine gets PEFT's own merged bits."""
    return w.float() + (b.float() @ a.float()) * scale


__all__ = [
    "Part",
    "is_lora",
    "merge",
    "merged_plan",
    "param_counts",
    "require_peft",
    "trainable",
    "unmergeable",
    "wrap",
]
