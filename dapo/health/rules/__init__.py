"""The health rules, one module each: ``check(run, config, knobs) -> Judgement``. A new rule is
one module here plus its line in :data:`RULES`."""

from __future__ import annotations

from . import (
    entropy_collapse,
    entropy_explosion,
    gradients,
    kl_blowup,
    length_growth,
    loss_spikes,
    not_learning,
    off_policy_drift,
    reward_collapse,
    rollout_mismatch,
    truncation_noise,
    validation,
    vanishing_signal,
)
from .base import KNOBS, NOT_LOGGED, TOO_FEW_STEPS, Judgement, Knobs, Rule

RULES: tuple[Rule, ...] = (
    entropy_collapse.RULE,
    entropy_explosion.RULE,
    vanishing_signal.RULE,
    not_learning.RULE,
    reward_collapse.RULE,
    validation.RULE,
    length_growth.RULE,
    truncation_noise.RULE,
    rollout_mismatch.RULE,
    off_policy_drift.RULE,
    kl_blowup.RULE,
    gradients.RULE,
    loss_spikes.RULE,
)

__all__ = ["KNOBS", "NOT_LOGGED", "RULES", "TOO_FEW_STEPS", "Judgement", "Knobs", "Rule"]
