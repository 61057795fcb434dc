"""Algorithm configuration and the paper's Table-1 ladder.

Every knob of the DAPO objective lives in :class:`AlgoConfig`; nothing else in
the core takes a hyperparameter that is not a field here. ``PRESETS`` is the
cumulative ladder of Table 1 of the DAPO paper (Yu et al., 2025), each rung
adding exactly one technique to the rung before it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import loss_spec

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
FILTERED_GROUP_STATS = ("shaped", "unpenalized", "excluded")


class ConfigError(ValueError):
    """A configuration value is out of range. ``field`` names the offending field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class AlgoConfig:
    """The knobs of the DAPO objective (Eq. 8-13 of the paper).

    Defaults are the paper's final DAPO recipe for Qwen2.5-32B (Section 4.1),
    so ``AlgoConfig()`` is DAPO and ``PRESETS["grpo"]`` is the naive baseline.
    """

    policy_loss: str = "dapo"
    """The policy loss, a spec of :func:`dapo.registry.resolve`: a built-in name (``dapo``,
    the decoupled-clip surrogate of Eq. 10 with the aggregation below; ``grpo``, ``gspo``,
    ``cispo``, ...), ``verl:NAME`` or ``trl:LOSS_TYPE`` (the ``peers`` extra), or a user's
    ``module:function``, with its own parameters in brackets (``clip_cov[clip_cov_ratio=0.02]``).
    It receives the knobs below (``eps_low``, ``eps_high``, ``clip_ratio_c``, ``loss_agg``) as
    :class:`dapo.loss.ClipAgg`. ``dapo toy check --config FILE`` checks this loss at these
    knobs, and ``dapo train --require-gate`` starts only once that check passed for the loss's
    current source."""

    # --- Clip-Higher (Section 3.1, Eq. 10) -------------------------------------------
    eps_low: float = 0.2
    """Lower clip: the ratio is clipped at ``1 - eps_low``. Must lie in (0, 1)."""
    eps_high: float = 0.28
    """Upper clip: the ratio is clipped at ``1 + eps_high``. The paper decouples it from
    ``eps_low`` and raises it to 0.28 so low-probability tokens can grow (Clip-Higher).
    Must be > 0."""
    clip_ratio_c: float | None = None
    """Dual clip (Ye et al. 2020): for negative advantages the per-token loss is capped at
    ``-A * clip_ratio_c``, bounding the push on tokens whose ratio exploded. ``None``
    disables it; verl's 32B DAPO script uses 10. Must be > 1 when set."""

    # --- Token-level policy gradient loss (Section 3.3, Eq. 12) -----------------------
    loss_agg: str = "token-mean"
    """How per-token losses are reduced: ``token-mean`` (DAPO, Eq. 12: sum over every valid
    token of the optimizer-step window / their count), ``seq-mean-token-mean`` (GRPO,
    Eq. 5: mean over tokens within a response, then over responses) or
    ``seq-mean-token-sum-norm`` (Dr. GRPO: per-response token sum divided by a constant,
    then mean over responses)."""
    loss_norm_const: int | None = None
    """The constant of ``seq-mean-token-sum-norm``; ``None`` uses ``max_len``."""

    # --- Group-relative advantage (Eq. 9) ---------------------------------------------
    group_size: int = 16
    """G: responses sampled per prompt. The paper uses 16."""
    adv_std_norm: bool = True
    """Divide the centred reward by the group's standard deviation (GRPO/DAPO). ``False``
    gives the Dr. GRPO advantage ``R - mean(R)``."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing. Must be > 0."""

    # --- Overlong reward shaping (Section 3.4, Eq. 13) --------------------------------
    overlong_filter: bool = True
    """Overlong filtering: truncated responses (hit ``max_len`` without EOS) get zero loss
    weight. They still count in the metrics and in dynamic sampling."""
    soft_overlong: bool = True
    """Soft overlong punishment: add the Eq. 13 length penalty to the reward."""
    expected_len: int = 16384
    """Length up to which no penalty applies (the paper's L_max - L_cache = 16,384)."""
    cache_len: int = 4096
    """Width of the linear ramp from 0 to -1 (the paper's L_cache = 4,096). The generation
    ceiling is ``max_len = expected_len + cache_len`` (20,480 in the paper)."""
    overlong_penalty_factor: float = 1.0
    """Scale of the soft penalty; 1.0 gives the paper's ramp to -1. Must be >= 0."""
    filtered_group_stats: str = "shaped"
    """How responses that overlong filtering removes from the loss (the truncated ones)
    enter their group's reward mean and std (Eq. 9) and dynamic sampling's correctness
    count (Eq. 11). Only acts when ``overlong_filter`` is on.

    * ``shaped`` (default): with their shaped reward, -1 plus the full Eq. 13 penalty
      (-2 with ``soft_overlong``). A literal reading of the paper, and what the peers do:
      verl 0.9.1 (``compute_grpo_outcome_advantage``; no loss mask for truncated responses
      at all), TRL 1.16 (``mask_truncated_completions`` zeroes only the loss mask; the
      group mean and std use every completion) and OpenRLHF all put truncated responses,
      penalty included, into the group statistics and the zero-std / correctness filter.
    * ``unpenalized``: with the Eq. 7 reward alone (-1), sparing them the length penalty.
    * ``excluded``: left out of the group mean, std and correctness count; a group is
      informative when its *terminated* responses are neither all right nor all wrong.

    With ``shaped`` and ``soft_overlong`` a truncated response, which carries no loss,
    pulls its group's mean down and so raises the advantage of every terminated response
    in the group, short wrong answers included (see the truncation experiment)."""

    # --- Dynamic sampling (Section 3.2, the constraint of Eq. 11) -------------------------
    dynamic_sampling: bool = True
    """Keep only groups with ``0 < #correct < G`` (judged on correctness, never on the
    shaped reward) and generate more until the batch holds ``train_groups`` of them."""
    max_gen_rounds: int = 10
    """Generation rounds per step after which dynamic sampling hands back what it has, with
    a warning, instead of raising (verl raises; runs die when data is too easy or hard)."""

    prompt_selection: str = "none"
    """Beyond the paper: which prompts of the stream to generate at all, decided before
    generating from each prompt's outcome history (:mod:`dapo.prompt_selection`): ``none``,
    ``greso`` (GRESO's probabilistic skipping), ``retire`` (retire-when-solved, open-instruct),
    ``pools`` (difficulty pools, prime-rl), each with its published defaults, which
    ``name:option=value,...`` overrides (e.g. ``greso:target_zero_variance=0.3``). Dynamic
    sampling still fills the batch after it. See ``dapo toy run prompt_selection`` for where
    each helps and where it costs accuracy."""

    # --- Batch geometry ---------------------------------------------------------------
    train_groups: int = 512
    """Prompts (groups) per training batch. The paper uses 512 prompts x 16 responses."""
    mini_batch_groups: int = 32
    """The optimizer-step window, in groups: every ``mini_batch_groups`` groups of the batch
    make one optimizer step. 512 / 32 = 16 optimizer steps per rollout, as in the paper."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step (the paper and verl use 1)."""
    max_grad_norm: float | None = 1.0
    """Global gradient-norm clip per optimizer step; ``None`` measures but never clips."""

    # --- Rollout/trainer mismatch correction ------------------------------------------------
    # Equations and peers' presets: dapo.offpolicy. They act only on batches that carry the
    # engine's log-probs (RolloutBatch.rollout_logp); without them nothing changes.
    tis_cap: float | None = None
    """Importance sampling against the engine's (behaviour) log-probs: each token's loss is
    weighted by ``rho = exp(old_logp - rollout_logp)`` (detached), truncated at
    ``tis_cap`` (TIS) or, with ``is_lower``, zeroed outside ``[is_lower, tis_cap]``.
    ``None`` disables weighting; verl and TRL use 2.0. Must be >= 1 when set."""
    is_level: str = "token"
    """``token`` (one weight per token) or ``sequence`` (the product of the response's
    token ratios, for every token of it: unbiased, high variance)."""
    is_lower: float | None = None
    """``None`` truncates weights at ``tis_cap``; a number in ``[0, 1]`` masks instead: a
    weight outside ``[is_lower, tis_cap]`` becomes 0 (IcePop 0.5 with cap 5, MIS with
    ``is_level=sequence``; 0 is AReaL's ``behav_imp_weight_cap``). Needs ``tis_cap``."""
    rejection: str | None = None
    """Rejection of tokens or responses whose divergence from the engine leaves a bound:
    comma-separated verl ``rollout_rs`` options (``token_k1``, ``seq_mean_k1`` the
    geometric-mean test, ``seq_mean_k3``, ... see :data:`REJECTION_OPTIONS`). Rejected
    tokens leave the loss mask and its normaliser. ``None``: no rejection."""
    rejection_threshold: str | float | None = None
    """verl's ``rollout_rs_threshold``: one entry per option, comma separated (one entry is
    shared): ``lower_upper`` ratio bounds for ``*_k1`` (a single number ``u`` means
    ``1/u`` to ``u``), an upper bound for k2/k3. Required with ``rejection``."""
    behaviour_clip: bool = False
    """verl's bypass mode: the PPO ratio is taken against the engine's log-probs
    (``old_logp := rollout_logp``), so the clip is the only correction. Excludes
    ``tis_cap`` and ``rejection``."""

    @property
    def max_len(self) -> int:
        """The generation ceiling ``expected_len + cache_len`` (the paper's 20,480)."""
        return self.expected_len + self.cache_len

    @property
    def norm_const(self) -> int:
        """The constant of ``seq-mean-token-sum-norm`` actually used."""
        return self.loss_norm_const if self.loss_norm_const is not None else self.max_len

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ConfigError(name, f"{what} (got {getattr(self, name)!r})")

        def real(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(name, f"must be a finite number (got {value!r})")
            return float(value)

        def integer(name: str) -> int:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(name, f"must be an integer (got {value!r})")
            return value

        def flag(name: str) -> None:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false (got {getattr(self, name)!r})")

        need(isinstance(self.policy_loss, str), "policy_loss", "must be a loss spec (a string)")
        try:
            loss_spec.parse_spec(self.policy_loss)
        except loss_spec.LossSpecError as e:
            raise ConfigError("policy_loss", str(e)) from None
        need(0.0 < real("eps_low") < 1.0, "eps_low", "must lie in (0, 1)")
        need(real("eps_high") > 0.0, "eps_high", "must be > 0")
        if self.clip_ratio_c is not None:
            need(real("clip_ratio_c") > 1.0, "clip_ratio_c", "must be > 1 or None")
        need(self.loss_agg in AGG_MODES, "loss_agg", f"must be one of {AGG_MODES}")
        if self.loss_norm_const is not None:
            need(integer("loss_norm_const") > 0, "loss_norm_const", "must be > 0 or None")
        need(integer("group_size") >= 2, "group_size", "must be >= 2 (a group needs contrast)")
        flag("adv_std_norm")
        need(real("adv_eps") > 0.0, "adv_eps", "must be > 0")
        flag("overlong_filter")
        flag("soft_overlong")
        need(integer("expected_len") > 0, "expected_len", "must be > 0")
        need(integer("cache_len") > 0, "cache_len", "must be > 0")
        need(real("overlong_penalty_factor") >= 0.0, "overlong_penalty_factor", "must be >= 0")
        need(
            self.filtered_group_stats in FILTERED_GROUP_STATS,
            "filtered_group_stats",
            f"must be one of {FILTERED_GROUP_STATS}",
        )
        flag("dynamic_sampling")
        need(integer("max_gen_rounds") >= 1, "max_gen_rounds", "must be >= 1")
        need(isinstance(self.prompt_selection, str), "prompt_selection", "must be a string")
        try:
            from .prompt_selection import parse_spec

            parse_spec(self.prompt_selection)
        except ValueError as e:
            raise ConfigError("prompt_selection", str(e)) from None
        need(integer("train_groups") >= 1, "train_groups", "must be >= 1")
        need(integer("mini_batch_groups") >= 1, "mini_batch_groups", "must be >= 1")
        need(
            self.mini_batch_groups <= self.train_groups,
            "mini_batch_groups",
            f"must be <= train_groups ({self.train_groups})",
        )
        need(integer("ppo_epochs") >= 1, "ppo_epochs", "must be >= 1")
        if self.max_grad_norm is not None:
            need(real("max_grad_norm") > 0.0, "max_grad_norm", "must be > 0 or None")
        if self.tis_cap is not None:
            need(real("tis_cap") >= 1.0, "tis_cap", "must be >= 1 or None")
        need(self.is_level in ("token", "sequence"), "is_level", "must be 'token' or 'sequence'")
        if self.is_lower is not None:
            need(0.0 <= real("is_lower") <= 1.0, "is_lower", "must lie in [0, 1] or be None")
            need(self.tis_cap is not None, "is_lower", "needs tis_cap (the band's upper bound)")
        if self.rejection is not None:
            need(isinstance(self.rejection, str), "rejection", "must be a string of rollout_rs options")
            need(self.rejection_threshold is not None, "rejection_threshold", "is required with rejection")
            try:
                parse_rejection(self.rejection, self.rejection_threshold or "")
            except ValueError as e:
                raise ConfigError("rejection", str(e)) from None
        flag("behaviour_clip")
        if self.behaviour_clip:
            need(
                self.tis_cap is None and self.rejection is None,
                "behaviour_clip",
                "takes no tis_cap or rejection (the ratio against the engine is the correction)",
            )

    def replace(self, **changes: Any) -> AlgoConfig:
        """A copy with ``changes`` applied (and validated)."""
        return from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


REJECTION_OPTIONS = tuple(
    f"{level}_{k}"
    for level in ("token", "seq_sum", "seq_mean", "seq_max")
    for k in ("k1", "k2", "k3")
    if not (level == "seq_max" and k == "k1")
)
"""The rejection options of verl's ``rollout_rs`` (``dapo.offpolicy.rejection_mask``)."""


def parse_rejection(options: str, thresholds: str | float) -> list[tuple[str, float | None, float]]:
    """``(option, lower bound of k1 or None, upper bound)`` per option of ``options``; k1
    bounds are logs of the ratio band, as verl compares them. Raises ValueError naming
    the option."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    if not names:
        raise ValueError("no rejection option given")
    for name in names:
        if name not in REJECTION_OPTIONS:
            raise ValueError(f"unknown rejection option {name!r}; known: {', '.join(REJECTION_OPTIONS)}")
    specs = [t.strip() for t in str(thresholds).split(",") if t.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{len(specs)} thresholds for {len(names)} options (give one, or one per option)")
    specs = specs * len(names) if len(specs) == 1 else specs
    out: list[tuple[str, float | None, float]] = []
    for name, spec in zip(names, specs):
        try:
            if name.endswith("k1"):
                lo_s, _, hi_s = spec.partition("_")
                hi = float(hi_s) if hi_s else float(lo_s)
                lo = float(lo_s) if hi_s else 1.0 / hi
                if not (0 < lo <= hi and math.isfinite(hi)):
                    raise ValueError
                out.append((name, math.log(lo), math.log(hi)))
            else:
                if "_" in spec:
                    raise ValueError
                hi = float(spec)
                if not (hi > 0 and math.isfinite(hi)):
                    raise ValueError
                out.append((name, None, hi))
        except ValueError:
            want = (
                "a ratio band 'lower_upper' (0 < lower <= upper)"
                if name.endswith("k1")
                else "a positive upper bound"
            )
            raise ValueError(f"threshold {spec!r} of {name}: expected {want}") from None
    return out


def from_dict(values: Mapping[str, Any], *, source: str = "AlgoConfig") -> AlgoConfig:
    """Build a config from a mapping, rejecting unknown keys by name."""
    known = {f.name for f in dataclasses.fields(AlgoConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(unknown[0], f"unknown field in {source}; known fields: {sorted(known)}")
    return AlgoConfig(**values)


SWITCHES: dict[str, dict[str, Any]] = {
    "overlong_filter": {"overlong_filter": True},
    "clip_higher": {"eps_high": 0.28},
    "soft_overlong": {"soft_overlong": True},
    "token_level": {"loss_agg": "token-mean"},
    "dynamic_sampling": {"dynamic_sampling": True},
}
"""The five techniques, in the paper's order of addition, as changes to the ``grpo`` rung."""

GRPO = AlgoConfig(
    eps_low=0.2,
    eps_high=0.2,
    loss_agg="seq-mean-token-mean",
    overlong_filter=False,
    soft_overlong=False,
    dynamic_sampling=False,
)
"""Naive GRPO as the paper's baseline: symmetric clip, sample-level loss, no overlong
treatment, no dynamic sampling (the KL term is dropped throughout, Section 2.3)."""


def with_switches(names: list[str] | tuple[str, ...], base: AlgoConfig = GRPO) -> AlgoConfig:
    """``base`` with the named techniques of :data:`SWITCHES` turned on."""
    changes: dict[str, Any] = {}
    for name in names:
        if name not in SWITCHES:
            raise ConfigError("switches", f"unknown technique {name!r}; known: {list(SWITCHES)}")
        changes.update(SWITCHES[name])
    return base.replace(**changes)


LADDER: tuple[str, ...] = ("grpo", "overlong_filter", "clip_higher", "soft_overlong", "token_level", "dapo")
"""The rung names of Table 1 in the paper's order; rung i adds the i-th switch."""

PRESETS: dict[str, AlgoConfig] = {rung: with_switches(list(SWITCHES)[:i]) for i, rung in enumerate(LADDER)}
"""The cumulative Table-1 ladder: grpo (AIME avg@32 = 30), overlong_filter (36),
clip_higher (38), soft_overlong (41), token_level (42), dapo (50).
``PRESETS["dapo"] == AlgoConfig()``."""


__all__ = [
    "AGG_MODES",
    "FILTERED_GROUP_STATS",
    "GRPO",
    "LADDER",
    "PRESETS",
    "SWITCHES",
    "AlgoConfig",
    "ConfigError",
    "from_dict",
    "with_switches",
]
