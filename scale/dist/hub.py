"""The hub, read once per node: which specs name the hub, what a model needs from its
repository, and the environment that keeps every rank but each node's local rank 0 offline
(that rank fetches for its node; ``dapo stage`` fetches once for the whole run,
:mod:`scale.ops.stage`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*", "vocab*"]
"""What a model needs from its repository (not the .bin / .pth duplicates some repos hold)."""
CONFIG_FILES = [p for p in MODEL_FILES if p != "*.safetensors"]
"""What a rank that does not read the weights needs (config, tokenizer)."""


def is_hub_id(spec: str | None) -> bool:
    """A hub id (``org/name``), not a local path: one ``/``, no data-file suffix, no path that
    exists here."""
    s = str(spec or "")
    return (
        s.count("/") == 1
        and not s.startswith((".", "/", "~"))
        and Path(s).suffix not in (".jsonl", ".json", ".parquet")
        and not Path(s).exists()
    )


def hub_environment(cfg: Any, local_rank: int) -> dict[str, str]:
    """The environment a rank sets before any hub library loads: offline, unless it is the
    node's local rank 0 and the config names something by hub id (that rank fetches for the
    node). Empty when nothing comes from the hub."""
    specs = [cfg.model.path, cfg.data.train, cfg.data.eval]
    if local_rank == 0 or not any(is_hub_id(s) for s in specs):
        return {}
    return dict(OFFLINE_ENV)
