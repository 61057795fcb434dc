"""Checkpoints: everything a run needs to continue as if it had not stopped.

``<out>/checkpoints/step_<N>/`` holds

* ``model.safetensors`` + config + tokenizer (a directory transformers and vLLM load as is),
* ``optimizer.pt``, ``scheduler.pt`` (loaded with ``weights_only=True``),
* ``rank<r>.pt``: RNG states and the rank's data position (``weights_only=True``),
* ``trainer_state.json``: step, counters, the config it was made with.

A checkpoint is written to a temporary directory and renamed into place, so a crash while
saving never leaves a half-written ``step_<N>``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE = "trainer_state.json"


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def latest(out: Path) -> Path | None:
    root = out / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / STATE).is_file())
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


def save(
    out: Path,
    step: int,
    *,
    lm,
    tokenizer,
    state_dict: dict[str, torch.Tensor] | None,
    optimizer_state: dict,
    scheduler_state: dict,
    rank_states: list[dict[str, Any]],
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """Called on the main process with everything gathered (rank states included)."""
    final = checkpoint_dir(out, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    lm.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(scheduler_state, tmp / "scheduler.pt")
    for r, s in enumerate(rank_states):
        torch.save(s, tmp / f"rank{r}.pt")
    (tmp / STATE).write_text(json.dumps(trainer_state, indent=2, default=str))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in sorted((out / "checkpoints").glob("step_*"))[:-keep]:
        if old.name.endswith(".tmp"):
            continue
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(path: Path) -> dict[str, Any]:
    f = path / STATE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE})")
    return json.loads(f.read_text())


def load_tensors(path: Path, name: str) -> Any:
    return torch.load(path / name, map_location="cpu", weights_only=True)


def load_model_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
