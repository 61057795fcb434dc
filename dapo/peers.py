"""verl's and TRL's policy losses, called through their own code, behind the loss interface.

Both are optional (the ``peers`` extra, then ``pip install --no-deps verl==0.9.1
trl==1.16.0``; docs/how-to/bring-your-own-loss.md). Tested with verl 0.9.1 and TRL 1.16.0.

verl: ``verl.trainer.ppo.core_algos.get_policy_loss_fn(name)`` is called with an
``ActorConfig`` built from the run's knobs: ``clip_ratio``/``clip_ratio_low`` =
``eps_low``, ``clip_ratio_high`` = ``eps_high``, ``loss_agg_mode`` = ``agg`` (of :class:`dapo.loss.ClipAgg`),
``loss_scale_factor`` = ``norm_const``, ``clip_ratio_c`` = the run's dual clip or, when
the run has none, :data:`NO_DUAL_CLIP` (verl always applies one, default 3), and the
loss's own parameters in ``policy_loss`` (``PolicyLossConfig``). ``clip.denominator``
becomes ``global_batch_info`` (the window's token or response count), as verl's trainer
passes it for each micro-batch; without it verl normalises by the mask it is given, which
for a micro-batch with no loss token is 0 / 0.

TRL: ``GRPOTrainer._compute_loss`` is called unbound on :class:`_TRLStandIn`, an object
with the attributes that method reads and a ``_get_per_token_logps_and_entropies`` that
returns the toy's log-probs: one generation batch, one process, no gradient accumulation,
no KL term, no vLLM importance weights, no entropy mask. ``epsilon`` = ``eps_low``,
``epsilon_high`` = ``eps_high`` (for ``cispo`` TRL reads it as the absolute cap of the
ratio, not ``1 + eps``), ``max_completion_length`` = ``norm_const``; ``loss_type`` fixes
the aggregation, so ``agg`` is not passed on. ``luspo`` runs with
``importance_sampling_level="sequence"`` as TRL requires.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from .loss import ClipAgg, LossAndStats, Weights
from .loss_spec import CLIP_AGG, DAPO_KNOBS, Loss, LossSpecError
from .losses import per_run, seeded_by_batch

NO_DUAL_CLIP = 1e9
"""verl's ``clip_ratio_c`` for a run without a dual clip (verl asserts it is > 1)."""

PEERS_HINT = "pip install -e '.[peers]' && pip install --no-deps verl==0.9.1 trl==1.16.0"

VERL: dict[str, tuple[dict[str, Any], tuple[str, ...], tuple[str, ...], str]] = {
    # name: (recipe knobs, knobs it acts on, claims, source of the claims)
    "vanilla": (
        {**DAPO_KNOBS, "eps_high": 0.2, "loss_agg": "token-mean"},
        ("eps_low", "eps_high", "clip_ratio_c", "loss_agg"),
        (),
        "verl PPO clip (dual clip always on), verl defaults 0.2/0.2 token-mean",
    ),
    "gspo": (
        {**DAPO_KNOBS, "eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
        CLIP_AGG,
        (),
        "verl GSPO-token, the GSPO paper's 3e-4/4e-4",
    ),
    "cispo": (
        {**DAPO_KNOBS, "eps_low": 0.99, "eps_high": 4.0},
        CLIP_AGG,
        ("entropy_collapse",),
        "verl CISPO; MiniMax-M1 claims it keeps the gradient of clipped rare tokens",
    ),
    "clip_cov": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        CLIP_AGG,
        ("entropy_collapse",),
        "verl Clip-Cov; Cui et al. 2025 claim it prevents entropy collapse",
    ),
    "kl_cov": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("loss_agg",),
        ("entropy_collapse",),
        "verl KL-Cov; Cui et al. 2025 claim it prevents entropy collapse",
    ),
    "sapo": (
        {**DAPO_KNOBS, "eps_high": 0.2, "loss_agg": "seq-mean-token-mean"},
        (),
        (),
        "verl SAPO (soft gate, tau 1/1.05); aggregates per sequence whatever it is asked",
    ),
    "geo_mean": (
        {**DAPO_KNOBS, "eps_low": 0.4, "eps_high": 0.4},
        ("eps_low", "eps_high"),
        (),
        "verl GMPO (geometric-mean ratio, clip on the log ratio 0.4); aggregation fixed per sequence",
    ),
    "gpg": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("loss_agg",),
        (),
        "verl GPG (-A log pi, no ratio)",
    ),
}

TRL: dict[str, tuple[dict[str, Any], tuple[str, ...], tuple[str, ...], str]] = {
    "grpo": ({**DAPO_KNOBS, "eps_high": 0.2}, ("eps_low", "eps_high"), (), "TRL grpo: per-sequence mean"),
    "dr_grpo": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("eps_low", "eps_high"),
        ("length_bias",),
        "TRL dr_grpo: token sum / (B x max_completion_length); TRL docs: 'eliminates length bias'",
    ),
    "dapo": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("eps_low", "eps_high"),
        ("length_bias",),
        "TRL dapo (its default loss_type) at TRL's defaults: epsilon_high defaults to epsilon (0.2); "
        "TRL docs: 'eliminates length bias'",
    ),
    "bnpo": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("eps_low", "eps_high"),
        ("length_bias",),
        "TRL bnpo: token sum / local tokens",
    ),
    "cispo": (
        {**DAPO_KNOBS, "eps_high": 5.0},
        ("eps_high",),
        ("entropy_collapse",),
        "TRL cispo, epsilon_high 5.0 (TRL docs, from ScaleRL)",
    ),
    "sapo": ({**DAPO_KNOBS, "eps_high": 0.2}, (), (), "TRL sapo (soft gate), per-sequence mean"),
    "luspo": (
        {**DAPO_KNOBS, "eps_high": 0.2},
        ("eps_low", "eps_high"),
        ("length_bias",),
        "TRL luspo (sequence ratio, per-sequence token sum); LUSPO: 'length-unbiased'",
    ),
}


def _require(module: str) -> Any:
    """Import a peer module quietly (TRL and verl warn about vLLM and Triton on import)."""
    import importlib
    import logging
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)
            try:
                return importlib.import_module(module)
            finally:
                logging.disable(previous)
    except ImportError as e:
        raise LossSpecError(f"{module} is not installed ({e}); install the peers: {PEERS_HINT}") from None


# ---- verl -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _verl_config(
    name: str,
    eps_low: float,
    eps_high: float,
    clip_c: float,
    agg: str,
    norm: Any,
    params: Any,
    batch_info: tuple[tuple[str, Any], ...] = (),
) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=eps_low,
        clip_ratio_low=eps_low,
        clip_ratio_high=eps_high,
        clip_ratio_c=clip_c,
        loss_agg_mode=agg,
        loss_scale_factor=norm,
        policy_loss=PolicyLossConfig(loss_mode=name, **dict(params)),
        global_batch_info=dict(batch_info),
    )


def _global_batch_info(denominator: float, agg: str, norm_const: float | None) -> tuple[tuple[str, Any], ...]:
    """The window's normaliser as verl's own trainer hands it to ``agg_loss`` for each
    micro-batch (``ActorConfig.global_batch_info``): the token count for token-mean, the
    response count otherwise (verl divides by ``loss_scale_factor`` itself)."""
    if agg == "token-mean":
        return (("dp_size", 1), ("batch_num_tokens", denominator))
    if agg == "seq-mean-token-sum-norm" and norm_const:
        denominator /= float(norm_const)
    return (("dp_size", 1), ("global_batch_size", denominator))


def verl_loss(name: str, params: dict[str, Any] | None = None) -> Any:
    """verl's policy loss ``name`` behind the loss interface, one [B, T] batch."""
    core = _require("verl.trainer.ppo.core_algos")
    fn = core.get_policy_loss_fn(name)
    frozen = tuple(sorted((params or {}).items()))

    def loss(
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip: ClipAgg,
        *,
        is_weights: Weights = None,
    ) -> LossAndStats:
        den = clip.denominator
        cfg = _verl_config(
            name,
            clip.eps_low,
            clip.eps_high,
            NO_DUAL_CLIP if clip.clip_ratio_c is None else clip.clip_ratio_c,
            clip.agg,
            clip.norm_const,
            frozen,
            ()
            if den is None or not float(den) > 0
            else _global_batch_info(float(den), clip.agg, clip.norm_const),
        )
        adv = advantages if advantages.shape == logp.shape else advantages.unsqueeze(-1).expand_as(logp)
        value, _ = fn(
            old_log_prob=old_logp.detach(),
            log_prob=logp,
            advantages=adv.to(logp.dtype),
            response_mask=mask.to(logp.dtype),
            loss_agg_mode=clip.agg,
            config=cfg,
            # off-policy weights (dapo.offpolicy), as verl's trainer passes them
            **({} if is_weights is None else {"rollout_is_weights": is_weights.to(logp.dtype)}),
        )
        return value, {}

    return loss


# ---- TRL ------------------------------------------------------------------------------------


class _Accelerator:
    num_processes = 1

    @staticmethod
    def gather(x: Tensor) -> Tensor:
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x: Tensor, reduction: str = "sum") -> Tensor:
        return x


class _TRLStandIn:
    """What ``GRPOTrainer._compute_loss`` reads from ``self``, for one process and one
    generation batch per optimizer step (TRL 1.16)."""

    def __init__(self, loss_type: str, eps_low: float, eps_high: float, max_len: int, params: dict[str, Any]):
        self.loss_type = loss_type
        self.epsilon_low = eps_low
        self.epsilon_high = eps_high
        self.max_completion_length = max_len
        self.importance_sampling_level = params.get(
            "importance_sampling_level", "sequence" if loss_type == "luspo" else "token"
        )
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.beta = 0.0
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.model = SimpleNamespace(training=True)
        self.args = SimpleNamespace(
            delta=params.get("delta"),
            sapo_temperature_pos=params.get("sapo_temperature_pos", 1.0),
            sapo_temperature_neg=params.get("sapo_temperature_neg", 1.05),
            steps_per_generation=1,
            use_bias_correction_kl=False,
        )
        self.accelerator = _Accelerator()
        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logp: Tensor | None = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, None]:
        assert self._logp is not None
        return self._logp, torch.zeros_like(self._logp.detach()), None


TRL_PARAMS = ("importance_sampling_level", "delta", "sapo_temperature_pos", "sapo_temperature_neg")


def trl_loss(loss_type: str, params: dict[str, Any] | None = None) -> Any:
    """TRL's ``GRPOTrainer._compute_loss`` for ``loss_type`` behind the loss interface."""
    grpo = _require("trl.trainer.grpo_trainer")
    compute = grpo.GRPOTrainer._compute_loss
    params = dict(params or {})

    def loss(
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        clip: ClipAgg,  # no dual clip in TRL; loss_type fixes the aggregation and its normaliser
    ) -> LossAndStats:
        B, T = logp.shape
        me = _TRLStandIn(loss_type, clip.eps_low, clip.eps_high, int(clip.norm_const or T), params)
        me._logp = logp
        m = mask.to(torch.long)
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": m,
            "advantages": advantages.to(logp.dtype),
            "old_per_token_logps": old_logp.detach(),
            "num_items_in_batch": m.sum().to(logp.dtype),
        }
        return compute(me, None, inputs), {}

    return loss


# ---- resolution -----------------------------------------------------------------------------


def resolve(prefix: str, name: str, params: dict[str, Any], spec: str) -> Loss:
    """``verl:NAME`` / ``trl:LOSS_TYPE`` as a :class:`~dapo.registry.Loss`."""
    if prefix == "verl":
        core = _require("verl.trainer.ppo.core_algos")
        if name not in core.POLICY_LOSS_REGISTRY:
            raise LossSpecError(
                f"loss {spec!r}: verl has no policy loss {name!r} ({', '.join(sorted(core.POLICY_LOSS_REGISTRY))})"
            )
        knobs, honours, claims, source = VERL.get(
            name, (dict(DAPO_KNOBS, eps_high=0.2), (), (), f"verl {name} (no recipe here: verl defaults)")
        )
        fn: Any = verl_loss(name, params)
        if name == "clip_cov":
            fn = seeded_by_batch(fn)
        return Loss(spec, per_run(fn), dict(knobs), honours, claims, source, params, core)
    grpo = _require("trl.trainer.grpo_trainer")
    if name not in TRL:
        raise LossSpecError(f"loss {spec!r}: TRL loss_type must be one of {', '.join(TRL)}")
    bad = [k for k in params if k not in TRL_PARAMS]
    if bad:
        raise LossSpecError(
            f"loss {spec!r}: unknown TRL parameter(s) {', '.join(bad)} ({', '.join(TRL_PARAMS)})"
        )
    knobs, honours, claims, source = TRL[name]
    return Loss(spec, per_run(trl_loss(name, params)), dict(knobs), honours, claims, source, params, grpo)


VERL_NAMES = tuple(VERL)
TRL_NAMES = tuple(TRL)
