"""The trainer's model on its ranks: fp32 masters, compute precision, DDP or FSDP2.

``train.sharding: fsdp2`` applies ``torch.distributed.fsdp.fully_shard`` directly, one unit
per decoder layer and then the root (:class:`scale.learner.policy.Policy`), as verl's FSDP2 workers
and torchtitan do. accelerate stays the launcher, the process group (with
``train.dist_timeout_s``) and the trackers; it does not wrap the model, because accelerate
1.x turns an FSDP plugin on a CPU into no distribution at all (``DistributedType.NO``), and
the CPU rehearsal must run the very code a GPU cluster runs.

Loading (``train.cpu_ram_efficient_loading``): rank 0 reads the weights; the other ranks
build the model on the meta device, shard it, allocate only their shards and receive them
by broadcast from rank 0 (``set_model_state_dict(..., broadcast_from_rank0=True)``); the
buffers that are not in the state dict (rotary ``inv_freq``) are broadcast too. After
wrapping, no parameter may remain on meta (:func:`check_materialised`); the optimizer is
built by the caller after this, over the sharded parameters.

Offload (``train.fsdp_offload``, FSDP2's ``CPUOffloadPolicy``): sharded parameters, gradients
and optimizer state live in host memory; FSDP2 copies a unit's shards to the device for its
all-gather and the reduced gradients back. On GPUs the process group is NCCL, which serves
CUDA tensors only, so every collective *this* code issues runs on the compute device, as
verl does (``fsdp2_load_full_state_dict``, ``fsdp2_clip_grad_norm_``, the sharding manager):
the weights are loaded and broadcast on the device, FSDP2 keeping the shards in host memory
(:func:`_fsdp2`), the gradient norm's reduction runs on the device (:func:`clip_grad_norm`),
and the weight sync moves each shard to the device before its all-gather
(:mod:`scale.learner.sync`). A ``cpu:gloo,cuda:nccl`` group (torchtitan's choice) would also run, but
it would carry those collectives over TCP from host memory: a 32B model's weights broadcast
and gathered through gloo on every sync. :mod:`scale.dist.collective_devices` checks the rule
at run time.

LoRA (``model.lora.rank > 0``): the model is wrapped with PEFT's adapters right after it is
loaded (:func:`load_lm`), before DDP or ``fully_shard``; FSDP2 shards the frozen base and the
adapters alike, per parameter (:mod:`scale.learner.lora`).

Precision: master weights and optimizer state in ``model.dtype`` (fp32); with
``train.mixed_precision: bf16`` FSDP2 all-gathers bf16 copies for compute and reduces
gradients in fp32 (``MixedPrecisionPolicy``); under DDP accelerate runs the forward in bf16
autocast (``Accelerator(mixed_precision="bf16")``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from . import lora
from .policy import Policy

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def decoder_layer_classes(lm: nn.Module) -> tuple[type, ...]:
    """The transformer block classes of a transformers model (``_no_split_modules``), the
    FSDP units."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    found = {type(m) for m in lm.modules() if type(m).__name__ in names}
    if not found:
        raise ValueError(f"{type(lm).__name__} names no decoder-layer class (_no_split_modules)")
    return tuple(found)


def check_materialised(module: nn.Module) -> None:
    """Raise if a parameter or buffer is still on the meta device (a rank that never got its
    weights would train garbage or crash far from the cause)."""
    for kind, items in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in items:
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.is_meta:
                raise RuntimeError(f"{kind} {name} is still on the meta device after loading")


def load_lm(cfg: Any, master: torch.dtype, meta: bool) -> nn.Module:
    """The causal LM of ``model.path`` (on the meta device when ``meta``), wrapped with LoRA
    adapters when ``model.lora.rank > 0`` (:mod:`scale.learner.lora`): before any sharding."""
    lm = _load_lm(cfg.model.path, master, meta, cfg.model.gradient_checkpointing)
    if cfg.model.lora.enabled:
        lm = lora.wrap(lm, cfg.model.lora, seed=cfg.train.seed)
    return lm


def _load_lm(path: str, master: torch.dtype, meta: bool, gradient_checkpointing: bool) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    if meta:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(config, dtype=master)
    else:
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=master)
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.config.use_cache = False
    return lm


def build_policy(cfg: Any, acc: Any) -> tuple[nn.Module, Policy]:
    """The trainer's policy on this rank: ``(module to train, unwrapped Policy)``.

    ``cfg`` is a :class:`scale.config.RunConfig`, ``acc`` the run's ``Accelerator`` (its
    process group is up). Under ``sharding: none`` the module is accelerate's DDP wrapper (or
    the Policy itself on one process); under ``fsdp2`` it is the fully sharded Policy."""
    master = dtype(cfg.model.dtype)
    t = cfg.train
    import torch.distributed as dist

    if t.sharding == "none" or not (dist.is_available() and dist.is_initialized()):
        # one process without a process group: nothing to shard over
        lm = load_lm(cfg, master, False)
        policy = Policy(lm, chunk=cfg.model.logprob_chunk)
        return acc.prepare(policy), policy
    policy = _fsdp2(cfg, acc, master)
    return policy, policy


def _fsdp2(cfg: Any, acc: Any, master: torch.dtype) -> Policy:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    t = cfg.train
    rank, world = acc.process_index, acc.num_processes
    device = acc.device
    distributed = dist.is_available() and dist.is_initialized()
    efficient = t.cpu_ram_efficient_loading and distributed and world > 1
    lm = load_lm(cfg, master, efficient and rank != 0)
    policy = Policy(lm, chunk=cfg.model.logprob_chunk)
    full_state = policy.state_dict() if efficient and rank == 0 else {}
    buffers = {n: b.clone() for n, b in policy.named_buffers()} if efficient and rank == 0 else {}
    if not efficient:
        policy.to(device)

    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if t.mixed_precision == "bf16" else None,
        reduce_dtype=torch.float32 if t.mixed_precision == "bf16" else None,
    )
    kwargs: dict[str, Any] = {"mp_policy": mp, "reshard_after_forward": True}
    if t.fsdp_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh(device.type, (world,))
    for block in [m for m in lm.modules() if isinstance(m, decoder_layer_classes(lm))]:
        fully_shard(block, **kwargs)
    fully_shard(policy, **kwargs)

    if efficient:
        # everything on the compute device (NCCL broadcasts device tensors only); under offload
        # FSDP2 puts the sharded parameters straight back in host memory (FSDPModule._apply),
        # the buffers stay on the device, and set_model_state_dict broadcasts each full tensor
        # on the group's device before keeping the local shard where the parameter lives
        if rank == 0:
            policy.to(device)
        else:
            policy.to_empty(device=device)
        set_model_state_dict(
            policy, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
        for name, buf in policy.named_buffers():  # non-persistent buffers (rotary inv_freq)
            if rank == 0:
                buf.copy_(buffers[name].to(buf.device))
            dist.broadcast(buf, src=0)
        if getattr(lm.config, "tie_word_embeddings", False):
            lm.tie_weights()
        del full_state, buffers
    check_materialised(policy)
    return policy


def clip_grad_norm(module: nn.Module, acc: Any, sharded: bool):  # type: ignore[no-untyped-def]
    """``clip(max_norm) -> total norm`` over every rank's gradients: accelerate's for DDP, torch's
    DTensor-aware one for FSDP2 (the norm of the sharded gradients is reduced over ranks)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not sharded:
        return lambda max_norm: acc.clip_grad_norm_(params, max_norm)

    device = acc.device

    def clip(max_norm: float) -> torch.Tensor:
        return clip_sharded(params, max_norm, device)

    return clip


def clip_sharded(params: list[nn.Parameter], max_norm: float, device: torch.device) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over FSDP2's sharded gradients with the norm's
    cross-rank reduction on ``device``: under offload the gradients are host tensors, and
    reducing their partial norms there would be a CPU collective (refused by NCCL). As verl's
    ``fsdp2_clip_grad_norm_``: per-shard norms where the gradients are, the partial total
    moved to the device, reduced there (``full_tensor``), the gradients scaled in place.
    Returns the total norm (a plain tensor on ``device``)."""
    from torch.nn.utils.clip_grad import _get_total_norm

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    total = _get_total_norm(grads, 2.0, False, None).to(device)
    norm = total.full_tensor() if hasattr(total, "full_tensor") else total
    total_norm = float(norm)
    if math.isfinite(total_norm):  # a non-finite norm: dapo.update skips the step
        coef = min(1.0, max_norm / (total_norm + 1e-6))  # torch's clip coefficient
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm
