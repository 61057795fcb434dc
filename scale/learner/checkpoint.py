"""Checkpoints: everything a run needs to continue as if it had not stopped, written by every
rank in parallel, never gathered on one.

``<out>/checkpoints/step_<N>/`` holds

* ``state/``: model and optimizer, sharded, in ``torch.distributed.checkpoint`` (DCP)
  format: each rank writes its own shards (FSDP2) or one copy of replicated tensors (DDP);
* ``rank<r>.pt``: rank r's RNG states (Python, torch, CUDA) and its prompt-stream position
  (loaded with ``weights_only=True``);
* ``scheduler.pt``: the learning-rate schedule (``weights_only=True``);
* ``hf/``: the model's transformers config and the tokenizer, which :func:`export` needs;
* ``trainer_state.json``: step, counters, world size, the config it was made with. Written
  last: a directory without it is not a checkpoint.

With LoRA (``model.lora``, :mod:`scale.learner.lora`) ``state/`` holds the trainable
parameters (the adapters) and their optimizer state only, not the frozen base: a resumed run
reads the base from ``model.path`` again (as it started) and the adapters from ``state/``;
:func:`export` reads the base the same way and writes the merged model. (``hf/`` holds no
merged copy: that would be the whole model in every checkpoint.)

Every rank writes into ``step_<N>.tmp``; rank 0 renames it into place after a barrier, so a
crash while saving never leaves a half-written ``step_<N>`` (the output directory must be on
a file system every node sees). A checkpoint resumes on any number of processes: DCP
reshards the model and optimizer state onto the new ranks, the schedule is global, and the
prompt stream is the same on every rank (rank 0's position serves all); the per-rank RNG
streams carry over only to the same world size (sampling seeds come from the run's
coordinates, not from them). ``dapo export`` (:func:`export`) turns a checkpoint into one safetensors model
directory for evaluation and the hub.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..config import LoraConfig

STATE = "trainer_state.json"
SHARDS = "state"


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def latest(out: Path) -> Path | None:
    root = out / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and (p / STATE).is_file())
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _options(model: torch.nn.Module) -> Any:
    """The trainable parameters only (a LoRA policy's adapters; every parameter in full
    fine-tuning); loading leaves the frozen base as :func:`scale.learner.sharding.load_lm` read it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(ignore_frozen_params=True, strict=not frozen)


def _without_frozen(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` less every frozen parameter under any of its names: ``ignore_frozen_params``
    drops a tied parameter under its first name only, and a LoRA policy's frozen tied output
    layer would otherwise be written as ``lm_head.weight`` (the embedding: a large share of a
    small model)."""
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in state.items() if k not in frozen}


@contextlib.contextmanager
def _dcp_args() -> Iterator[dict[str, bool]]:
    """DCP's keywords for this process: in one without a process group (a one-process run
    resumes before its engine creates one; ``dapo export``) DCP is told it works alone
    (``no_dist``), and its warning that it "assumes the intent" to, which torch 2.13 gives
    even then, is dropped (that message only)."""
    import torch.distributed as dist

    alone = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        if alone:
            warnings.filterwarnings(
                "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
            )
        yield {"no_dist": alone}


def _states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=_options(model))
    return {"model": _without_frozen(model, model_state), "optim": optim_state}


def save(
    out: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler_state: dict[str, Any],
    rank_state: dict[str, Any],
    trainer_state: dict[str, Any],
    hf_save: Callable[[Path], None],
    rank: int,
    keep: int,
    barrier: Callable[[], None],
) -> Path:
    """Called on every rank. ``model`` is the unwrapped policy (FSDP2-sharded or not),
    ``rank_state`` this rank's RNG and data position, ``hf_save(dir)`` writes the config and
    tokenizer (run on rank 0 only)."""
    import torch.distributed.checkpoint as dcp

    final = checkpoint_dir(out, step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    with _dcp_args() as kw:
        dcp.save(_states(model, optimizer), checkpoint_id=str(tmp / SHARDS), **kw)
    torch.save(rank_state, tmp / f"rank{rank}.pt")
    barrier()
    if rank == 0:
        torch.save(scheduler_state, tmp / "scheduler.pt")
        hf_save(tmp / "hf")
        (tmp / STATE).write_text(json.dumps(trainer_state, indent=2, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in sorted(p for p in (out / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))[
            :-keep
        ]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


class ResumeError(ValueError):
    """A checkpoint this run cannot continue from (said before any model loads)."""


def load_trainer_state(path: Path) -> dict[str, Any]:
    f = path / STATE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE})")
    state: dict[str, Any] = json.loads(f.read_text())
    return state


def load_tensors(path: Path, name: str) -> Any:
    f = path / name
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {name})")
    return torch.load(f, map_location="cpu", weights_only=True)


def load(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer state of ``path`` into this rank's (sharded) model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    shards = path / SHARDS
    if not (shards / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {SHARDS}/.metadata)")
    states = _states(model, optimizer)
    with _dcp_args() as kw:
        dcp.load(states, checkpoint_id=str(shards), **kw)  # every key asked for must be in the checkpoint
    set_state_dict(
        model,
        optimizer,
        model_state_dict=states["model"],
        optim_state_dict=states["optim"],
        options=_options(model),
    )


def lora_of(state: dict[str, Any]) -> LoraConfig:
    """The ``model.lora`` a checkpoint was written with (``rank: 0`` for one without it)."""
    written = state.get("config", {}).get("model", {}).get("lora") or {}
    return LoraConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in written.items()})


def export(path: Path, out: Path, dtype: torch.dtype = torch.bfloat16, base: str | None = None) -> Path:
    """One transformers model directory (``model.safetensors``, config, tokenizer) from the
    sharded checkpoint ``path``, in one process (host memory: the whole model in fp32).

    A LoRA run's checkpoint holds the adapters only: the base is read from ``base`` (default:
    the run's ``model.path``), the adapters loaded onto it and merged (PEFT's
    ``merge_and_unload``), so the directory is a plain model (no PEFT needed to load it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from . import lora
    from .policy import Policy

    trainer_state = load_trainer_state(path)
    hf = path / "hf"
    if not (hf / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no hf/config.json)")
    if not (path / SHARDS / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {SHARDS}/.metadata)")
    adapters = lora_of(trainer_state)
    if adapters.enabled:
        base = base or trainer_state["config"]["model"]["path"]
        try:
            lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        except OSError as err:
            raise FileNotFoundError(
                f"{path} is a LoRA checkpoint (model.lora.rank={adapters.rank}) and its base model "
                f"{base!r} cannot be read ({str(err).splitlines()[0]}); pass the base with --base"
            ) from None
        lm = lora.wrap(lm, adapters)
    else:
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf), dtype=torch.float32)
    policy = Policy(lm)
    options = _options(policy)
    state = {"model": _without_frozen(policy, get_model_state_dict(policy, options=options))}
    with _dcp_args() as kw:
        dcp.load(state, checkpoint_id=str(path / SHARDS), **kw)
    set_model_state_dict(policy, state["model"], options=options)
    if adapters.enabled:
        lm = lm.merge_and_unload()  # type: ignore[operator]
    out.mkdir(parents=True, exist_ok=True)
    lm.to(dtype).save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(hf).save_pretrained(out)
    # what the model was trained with (dapo eval records it): the run's algo section, its loss;
    # and how the run evaluated it (dapo eval repeats that evaluation, or says what differs)
    config = trainer_state.get("config", {})
    trained = {
        "step": trainer_state.get("step"),
        "algo": config.get("algo"),
        "eval": config.get("eval"),
        "data": {k: config.get("data", {}).get(k) for k in ("template", "chat_template")},
        "engine": config.get("rollout", {}).get("engine"),
    }
    (out / TRAINED_WITH).write_text(json.dumps(trained, indent=2, default=str))
    return out


TRAINED_WITH = "dapo_training.json"
"""Beside an exported model: the training step, the run's ``algo`` section (its ``policy_loss``
among them), which ``dapo eval --out`` records, and its ``eval`` section, prompt template and
engine, with which ``dapo eval`` repeats the run's in-training evaluation of that step."""


def trained_with(model_dir: str | Path) -> dict[str, Any] | None:
    """What :func:`export` recorded beside a model (None for a model it did not write)."""
    try:
        found = json.loads((Path(model_dir) / TRAINED_WITH).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _adapter_shape(c: LoraConfig) -> tuple[Any, ...]:
    """What a checkpoint's adapters must share with the run that continues them (the dropout
    may change, as the learning rate may)."""
    return (c.rank, c.lora_alpha, sorted(c.target_modules)) if c.enabled else (0,)


def _said(c: LoraConfig) -> str:
    if not c.enabled:
        return "rank=0 (full fine-tuning)"
    return f"rank={c.rank}, alpha={c.lora_alpha:g}, target_modules={list(c.target_modules)}"


def resume_point(cfg: Any, out: Path, resume: str | None, log: Any) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint ``--resume`` names and its trainer state (None: nothing to resume, and
    then :class:`FileExistsError` where ``out`` holds a previous run without ``--resume``);
    :class:`ResumeError` if this run cannot continue it. Decided before the model loads."""
    path = (latest(out) if resume == "auto" else Path(resume)) if resume else None
    if path is None:
        if resume:
            log(f"no checkpoint under {out}; starting from scratch")
        elif latest(out) is not None or (out / "metrics.jsonl").is_file():
            raise FileExistsError(
                f"{out} holds a previous run (checkpoints or metrics.jsonl); continue it "
                "with --resume auto, start over with --fresh (deletes it), or choose another output.dir"
            )
        return None
    state = load_trainer_state(path)
    written = state.get("config", {}).get("train", {}).get("sharding", cfg.train.sharding)
    if written != cfg.train.sharding:
        raise ResumeError(
            f"--resume: {path} was written with train.sharding={written} and this run has "
            f"train.sharding={cfg.train.sharding}; resume it with train.sharding={written}"
        )
    theirs_lora, mine_lora = lora_of(state), cfg.model.lora
    if _adapter_shape(theirs_lora) != _adapter_shape(mine_lora):
        raise ResumeError(
            f"--resume: {path} was written with model.lora {_said(theirs_lora)} and this run has "
            f"model.lora {_said(mine_lora)}; resume it with the checkpoint's model.lora"
        )
    if mine_lora.enabled and state.get("config", {}).get("model", {}).get("path") != cfg.model.path:
        log(
            f"note: {path} trained adapters on model.path={state['config']['model']['path']!r}; "
            f"this run reads the base from {cfg.model.path!r}"
        )
    # a history belongs to its policy (checked here, before the model loads)
    mine = cfg.algo.prompt_selection.partition(":")[0]
    theirs = str(state.get("config", {}).get("algo", {}).get("prompt_selection", "none")).partition(":")[0]
    if mine != "none" and theirs not in ("none", mine):
        raise ResumeError(
            f"--resume: {path}: the checkpoint's prompt selection is {theirs!r}, this run's {mine!r}; "
            f"resume it with algo.prompt_selection={theirs}"
        )
    return path, state
