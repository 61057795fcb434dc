"""DAPO core: the objective, its data contract and its metrics, free of I/O and engines.

Both regimes, the toy benchmarks (``toybench``) and the accelerate + vLLM trainer
(``scale``), call these same functions. The core needs only torch (and numpy through
torch); it is imported on first use of a name (PEP 562), so ``import dapo`` alone, the
``dapo`` command's help, and reading a log (``dapo diagnose``) do not load torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "advantages": ("config_advantages", "group_advantages"),
    "batch": ("BatchError", "RolloutBatch"),
    "config": ("GRPO", "LADDER", "PRESETS", "SWITCHES", "AlgoConfig", "ConfigError", "with_switches"),
    "loss": ("aggregate", "policy_loss", "window_denominator"),
    "offpolicy": ("CORRECTIONS", "is_weights", "rejection_mask"),
    "prompt_selection": ("PromptSelection", "parse_spec"),
    "schema": ("SCHEMA",),
    "metrics": ("masked_mean", "rollout_metrics", "rollout_stats"),
    "rewards": ("config_reward", "outcome_reward", "score_integer_answer", "soft_overlong_penalty"),
    "sampling": ("DynamicSampler", "SamplingWarning", "uniform_groups"),
    "update": ("DataParallel", "LogProbs", "update"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "CORRECTIONS",
    "GRPO",
    "LADDER",
    "PRESETS",
    "SCHEMA",
    "SWITCHES",
    "AlgoConfig",
    "BatchError",
    "ConfigError",
    "DataParallel",
    "DynamicSampler",
    "LogProbs",
    "PromptSelection",
    "RolloutBatch",
    "SamplingWarning",
    "__version__",
    "aggregate",
    "config_advantages",
    "config_reward",
    "group_advantages",
    "is_weights",
    "masked_mean",
    "outcome_reward",
    "parse_spec",
    "policy_loss",
    "rejection_mask",
    "rollout_metrics",
    "rollout_stats",
    "score_integer_answer",
    "soft_overlong_penalty",
    "uniform_groups",
    "update",
    "window_denominator",
    "with_switches",
]


def __getattr__(name: str) -> Any:
    """``dapo.X`` for the core's public names: imports the defining module on first use."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'dapo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """Importing a submodule binds it on its package: ``import dapo.update`` would make
    ``dapo.update`` the module, hiding the function of that name (the eager imports used to
    rebind it). A public name keeps naming the object of :data:`__all__`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _MODULE_OF.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what type checkers and editors see: the eager imports
    from .advantages import config_advantages, group_advantages
    from .batch import BatchError, RolloutBatch
    from .config import GRPO, LADDER, PRESETS, SWITCHES, AlgoConfig, ConfigError, with_switches
    from .loss import aggregate, policy_loss, window_denominator
    from .metrics import masked_mean, rollout_metrics, rollout_stats
    from .offpolicy import CORRECTIONS, is_weights, rejection_mask
    from .prompt_selection import PromptSelection, parse_spec
    from .rewards import config_reward, outcome_reward, score_integer_answer, soft_overlong_penalty
    from .sampling import DynamicSampler, SamplingWarning, uniform_groups
    from .schema import SCHEMA
    from .update import DataParallel, LogProbs, update
