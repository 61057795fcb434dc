"""The run's own settings for the advice: from ``--knob NAME=VALUE`` and, for this project's
run directories, the ``config.json`` the trainer wrote next to ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .rules import KNOBS, Knobs

FROM_CONFIG = {
    "policy_loss": ("algo", "policy_loss"),
    "eps_low": ("algo", "eps_low"),
    "eps_high": ("algo", "eps_high"),
    "dynamic_sampling": ("algo", "dynamic_sampling"),
    "loss_agg": ("algo", "loss_agg"),
    "overlong_filter": ("algo", "overlong_filter"),
    "soft_overlong": ("algo", "soft_overlong"),
    "tis_cap": ("algo", "tis_cap"),
    "max_grad_norm": ("algo", "max_grad_norm"),
    "lr": ("train", "lr"),
}


def parse_knob(item: str) -> tuple[str, float | str | bool]:
    """``NAME=VALUE`` as a typed knob; ValueError names what is wrong."""
    key, sep, raw = item.partition("=")
    if not sep:
        raise ValueError(f"{item!r}: expected NAME=VALUE")
    kind = KNOBS.get(key)
    if kind is None:
        raise ValueError(f"unknown knob {key!r}; known: {', '.join(sorted(KNOBS))}")
    if kind is bool:
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{key}: expected true or false, got {raw!r}")
        return key, raw.lower() == "true"
    if kind is float:
        try:
            return key, float(raw)
        except ValueError:
            raise ValueError(f"{key}: expected a number, got {raw!r}") from None
    return key, raw


def from_run_dir(log: Path) -> dict[str, float | str | bool]:
    """Knobs from the ``config.json`` beside a log of this project's trainer (empty if none)."""
    path = (log if log.is_dir() else log.parent) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return from_config(cfg) if isinstance(cfg, dict) else {}


def from_config(cfg: dict[str, Any]) -> dict[str, float | str | bool]:
    """Knobs from a run configuration as a dict (``RunConfig.to_dict()``)."""
    out: dict[str, float | str | bool] = {}
    for knob, (section, field) in FROM_CONFIG.items():
        value = cfg.get(section, {}).get(field) if isinstance(cfg.get(section), dict) else None
        kind = KNOBS[knob]
        if (isinstance(value, bool) and kind is bool) or (isinstance(value, str) and kind is str):
            out[knob] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and kind is float:
            out[knob] = float(value)
    return out


def merge(log: Path, items: list[str]) -> Knobs:
    """Run-directory knobs overridden by ``--knob`` items."""
    out = from_run_dir(log)
    out.update(parse_knob(i) for i in items)
    return out
