"""The trainer's model on its ranks: fp32 masters, compute precision, DDP or FSDP2.

``train.sharding: fsdp2`` applies ``torch.distributed.fsdp.fully_shard`` directly, one unit
per decoder layer and then the root (:class:`scale.policy.Policy`), as verl's FSDP2 workers
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

Precision: master weights and optimizer state in ``model.dtype`` (fp32); with
``train.mixed_precision: bf16`` FSDP2 all-gathers bf16 copies for compute and reduces
gradients in fp32 (``MixedPrecisionPolicy``); under DDP accelerate runs the forward in bf16
autocast (``Accelerator(mixed_precision="bf16")``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

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
        lm = _load_lm(cfg.model.path, master, False, cfg.model.gradient_checkpointing)
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
    lm = _load_lm(cfg.model.path, master, efficient and rank != 0, cfg.model.gradient_checkpointing)
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
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh(device.type, (world,))
    for block in [m for m in lm.modules() if isinstance(m, decoder_layer_classes(lm))]:
        fully_shard(block, **kwargs)
    fully_shard(policy, **kwargs)

    if efficient:
        if rank != 0:
            policy.to_empty(device="cpu" if t.fsdp_offload else device)
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

    def clip(max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    return clip
