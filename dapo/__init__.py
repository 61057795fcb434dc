"""DAPO core: the objective, its data contract and its metrics, free of I/O and engines.

Importing ``dapo`` needs only torch (and numpy through torch). Both regimes, the toy
benchmarks (``toybench``) and the accelerate + vLLM trainer (``scale``), call these same
functions.
"""

from .advantages import config_advantages, group_advantages
from .batch import BatchError, RolloutBatch
from .config import GRPO, LADDER, PRESETS, SWITCHES, AlgoConfig, ConfigError, with_switches
from .loss import aggregate, policy_loss, tis_weights, window_denominator
from .metrics import SCHEMA, masked_mean, rollout_metrics, rollout_stats
from .rewards import config_reward, outcome_reward, score_integer_answer, soft_overlong_penalty
from .sampling import DynamicSampler, SamplingWarning, uniform_groups
from .update import DataParallel, LogProbs, update

__version__ = "0.1.0"

__all__ = [
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
    "RolloutBatch",
    "SamplingWarning",
    "__version__",
    "aggregate",
    "config_advantages",
    "config_reward",
    "group_advantages",
    "masked_mean",
    "outcome_reward",
    "policy_loss",
    "rollout_metrics",
    "rollout_stats",
    "score_integer_answer",
    "soft_overlong_penalty",
    "tis_weights",
    "uniform_groups",
    "update",
    "window_denominator",
    "with_switches",
]
