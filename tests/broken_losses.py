"""A corpus of policy losses written from their papers, most with a deliberate bug.

`dapo toy check` must fail or refuse every broken one, naming the reason, and pass every
correct one (``CORRECT``). Each bug is one a person porting a loss could write; the
docstring says what is wrong and which check is expected to see it (``BROKEN`` maps each
name to a word of the reason). Written to break the check, not to suit it."""

from __future__ import annotations

import torch

from dapo.loss import ClipAgg, policy_loss


def _policy_loss(*args, is_weights=None, **knobs):
    """dapo.loss.policy_loss called from the keyword form (off-policy weights passed on)."""
    return policy_loss(*args, ClipAgg.from_keywords(**knobs), is_weights=is_weights)


def _masked_mean(x, mask):
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _surrogate(logp, old_logp, advantages, eps_low, eps_high):
    """Per-token max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), Eq. 10."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))


# ---- broken (each must fail or be refused) --------------------------------------------------


def symmetric_clip(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Clip-Higher lost: the upper bound is hard-coded to the lower one (knob probe)."""
    return _policy_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_low, **knobs)


def per_sequence(logp, old_logp, advantages, mask, *, agg="token-mean", agg_denominator=None, **knobs):
    """Token-level loss lost: every response is averaged on its own, whatever ``agg`` says."""
    return _policy_loss(logp, old_logp, advantages, mask, agg="seq-mean-token-mean", **knobs)


def raises(logp, old_logp, advantages, mask, **knobs):
    """A loss that breaks on the toy's tensors."""
    raise RuntimeError("shape [16, 8] is invalid for this loss")


def not_scalar(logp, old_logp, advantages, mask, **knobs):
    """A loss that forgets to reduce."""
    return -(advantages.unsqueeze(-1) * logp)


def sign_flip(logp, old_logp, advantages, mask, **knobs):
    """Gradient ascent: returns the objective J instead of the loss -J (learning gate,
    gradient-sign probe)."""
    loss, stats = _policy_loss(logp, old_logp, advantages, mask, **knobs)
    return -loss, stats


def inverted_ratio(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """r = pi_old / pi_theta instead of pi_theta / pi_old (gradient-sign probe)."""
    ratio = torch.exp(old_logp - logp)
    adv = advantages.unsqueeze(-1)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    return _masked_mean(pg, mask)


def always_nan(logp, old_logp, advantages, mask, **knobs):
    """A loss that is NaN on every call (e.g. log of a negative probability)."""
    loss, stats = _policy_loss(logp, old_logp, advantages, mask, **knobs)
    return loss * float("nan"), stats


def nan_on_empty_rows(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Per-response means divided by each response's length: 0/0 = NaN for a row with no
    loss token (padding rows, filtered responses) (empty-row probe: the experiments' arms
    filter no response, so their windows hold no such row)."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    m = mask.to(pg.dtype)
    per_row = (pg * m).sum(-1) / m.sum(-1)
    return per_row.mean()


def nan_on_uniform_windows(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Advantages rescaled by the window's largest |advantage| (a normalisation written
    without a guard): 0/0 = NaN in every window whose groups are all right or all wrong, on the
    experiments' batches only, since every probe batch has a non-zero advantage (skipped steps)."""
    scaled = advantages / advantages.abs().amax()
    return _masked_mean(_surrogate(logp, old_logp, scaled, eps_low, eps_high), mask)


def nan_when_fully_masked(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Token mean without a guard and without the window's denominator: 0/0 when a
    micro-batch has no loss token (fully masked probe; NVIDIA-NeMo/RL#158)."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    m = mask.to(pg.dtype)
    return (pg * m).sum() / m.sum()


def padding_counted(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The mask is forgotten: padding positions enter the mean (padding probe)."""
    return _surrogate(logp, old_logp, advantages, eps_low, eps_high).mean()


def mask_shifted(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The label-shift bug: the mask is moved one position right (as if aligned with the
    input ids), so each response loses its first token and gains one padding token
    (padding probe)."""
    shifted = torch.cat([torch.zeros_like(mask[..., :1]), mask[..., :-1]], dim=-1)
    return _masked_mean(_surrogate(logp, old_logp, advantages, eps_low, eps_high), shifted)


def optimistic_bound(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """min instead of max: the optimistic bound, which removes the clip where PPO clips
    and clips where PPO does not (the objective's min carried over to the loss; see
    openai/baselines#1156: "if you flip it the wrong way, the algorithm doesn't work")."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    pg = torch.minimum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    return _masked_mean(pg, mask)


def min_before_advantage(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """-min(r, clip(r)) * A: the min taken over ratios before multiplying by the advantage,
    so for A < 0 the clip binds on the wrong side (as in takuseno/ppo#3 and
    tensorlayer/TensorLayer#1072)."""
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.minimum(ratio, ratio.clamp(1 - eps_low, 1 + eps_high)) * advantages.unsqueeze(-1)
    return _masked_mean(-surrogate, mask)


def advantage_batch_mean(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The ratio multiplied by the *mean* advantage of the batch, not each response's own
    (as in Omegastick/pytorch-cpp-rl#14): group-normalised advantages average to ~0."""
    adv = advantages.mean().expand_as(advantages)
    return _masked_mean(_surrogate(logp, old_logp, adv, eps_low, eps_high), mask)


def dual_clip_everywhere(logp, old_logp, advantages, mask, *, eps_low, eps_high, clip_ratio_c=None, **knobs):
    """verl's dual clip, min(loss, -A x clip_ratio_c), without its ``where(A < 0, ...)``: for
    a positive advantage the bound is negative and binds on every token, whose gradient
    vanishes (contract: dual_clip)."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    if clip_ratio_c is not None:
        pg = torch.minimum(pg, -advantages.unsqueeze(-1) * clip_ratio_c)
    return _masked_mean(pg, mask)


def swapped_bounds(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """clip(r, 1 - eps_high, 1 + eps_low): the two epsilons exchanged, so Clip-Higher
    raises the lower bound's width instead of the upper's (entropy_collapse)."""
    return _masked_mean(_surrogate(logp, old_logp, advantages, eps_high, eps_low), mask)


def ratio_to_detached_self(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The ratio taken against ``logp.detach()`` instead of the old log-prob: always 1, so
    the clip never acts (knob probe: eps ignored)."""
    return _masked_mean(_surrogate(logp, logp.detach(), advantages, eps_low, eps_high), mask)


def detached_output(logp, old_logp, advantages, mask, **knobs):
    """Stop-gradient in the wrong place: the whole loss goes through ``.item()``."""
    loss, stats = _policy_loss(logp, old_logp, advantages, mask, **knobs)
    return torch.tensor(loss.item(), dtype=logp.dtype), stats


def fixed_buffer(logp, old_logp, advantages, mask, **knobs):
    """Written for micro-batches of at most 16 responses: a preallocated buffer that the
    probes' batches fit and the experiments' (128 responses) overflow."""
    buf = torch.zeros(16, dtype=advantages.dtype)
    buf[: advantages.shape[-1]] = advantages
    return _policy_loss(logp, old_logp, buf[: advantages.shape[-1]], mask, **knobs)


def sum_not_mean(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Token *sum* with no normaliser, whatever ``agg`` says (knob probe: loss_agg)."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    return (pg * mask.to(pg.dtype)).sum()


def double_normalised(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The token mean divided by the token count a second time: the gradient-accumulation bug
    TRL and transformers fixed in 2024 (the loss normalised by ``num_items_in_batch`` inside
    the model and again by the trainer). Finite, padding-invariant, the right sign: it learns
    about 1/|tokens| as fast, and a policy that barely moves keeps its entropy and its length
    gap (the equal-learning gate must see it)."""
    m = mask.to(logp.dtype)
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    return (pg * m).sum() / m.sum().clamp(min=1.0) / m.sum().clamp(min=1.0)


def first_token_only(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The sequence's log-prob taken from its first response token (a slicing bug when the
    prompt/response boundary moves): every later token is detached, so its value is the right
    loss and its gradient reaches only the first token of each response."""
    held = torch.cat([logp[..., :1], logp[..., 1:].detach()], dim=-1)
    return _masked_mean(_surrogate(held, old_logp, advantages, eps_low, eps_high), mask)


def wrong_sign_kl(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """A KL penalty added with the wrong sign: ``pg - beta * kl`` where verl and TRL add
    ``+ beta * kl`` (k1 estimator, ``logp - ref_logp``, verl's ``kl_penalty="kl"``, against the
    rollout policy, beta = 0.1). It rewards moving away from the sampler by raising the sampled
    tokens' log-probs: a sharpening term, the opposite of an entropy protection."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    return _masked_mean(pg - 0.1 * (logp - old_logp), mask)


def near_frozen(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Dr. GRPO's constant normaliser set for another regime: each response's token sum divided
    by a 16,384-token budget on the toy's ~10-token responses, so every step is ~1,000 times
    too small (a near-frozen policy that keeps its entropy by standing still)."""
    m = mask.to(logp.dtype)
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    rows = (pg * m).sum(-1) / 16384.0
    return rows.sum() / (m.sum(-1) > 0).sum().clamp(min=1)


def eos_dropped(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Each response's last token (EOS) left out of the loss: the mask shifted for the
    labels and the end trimmed, a bug reported in DeepSpeed-Chat and OpenRLHF. EOS is never
    reinforced, so the policy cannot learn where to stop; finite, padding-invariant and of
    the right sign elsewhere (the every-token probe must see it)."""
    lengths = mask.sum(-1, keepdim=True)
    positions = torch.arange(mask.shape[-1], device=mask.device)
    kept = mask & (positions < lengths - 1)
    return _masked_mean(_surrogate(logp, old_logp, advantages, eps_low, eps_high), kept)


def dual_clip_below_one(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """verl's dual clip with clip_ratio_c = 0.8 hard-coded (verl asserts c > 1): for a
    negative advantage the loss is capped at -A x 0.8, below its value at ratio 1, so every
    negative-advantage token is flat there and gets no gradient."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    adv = advantages.unsqueeze(-1).expand_as(pg)
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * 0.8), pg)
    return _masked_mean(pg, mask)


EPS = ("eps_low", "eps_high")
for _fn in (
    eos_dropped,
    dual_clip_below_one,
    inverted_ratio,
    nan_on_empty_rows,
    nan_on_uniform_windows,
    nan_when_fully_masked,
    padding_counted,
    mask_shifted,
    optimistic_bound,
    min_before_advantage,
    advantage_batch_mean,
    swapped_bounds,
    ratio_to_detached_self,
    double_normalised,
    first_token_only,
    wrong_sign_kl,
    near_frozen,
):
    _fn.dapo_knobs = EPS  # type: ignore[attr-defined]  # they take no agg and no dual clip
sum_not_mean.dapo_knobs = (*EPS, "loss_agg")  # type: ignore[attr-defined]
dual_clip_everywhere.dapo_knobs = (*EPS, "clip_ratio_c")  # type: ignore[attr-defined]


BROKEN: dict[str, str] = {
    # name: the start of the failure (or refusal) that must name it
    "symmetric_clip": "ignores eps_high",
    "per_sequence": "ignores loss_agg",
    "sign_flip": "contract (gradient_sign)",
    "inverted_ratio": "contract (gradient_sign)",
    "always_nan": "contract (finite)",
    "nan_on_empty_rows": "contract (empty_rows)",
    "nan_on_uniform_windows": "skips ",
    "nan_when_fully_masked": "contract (fully_masked)",
    "padding_counted": "contract (padding)",
    "mask_shifted": "contract (padding)",
    "optimistic_bound": "claims (DAPO's, by default) to protect against entropy_collapse but",
    "min_before_advantage": "ignores eps_low",
    "advantage_batch_mean": "cannot judge protection on entropy_collapse's task: learns too little",
    "dual_clip_everywhere": "contract (dual_clip)",
    "swapped_bounds": "claims (DAPO's, by default) to protect against entropy_collapse but",
    "ratio_to_detached_self": "ignores eps_low",
    "sum_not_mean": "ignores loss_agg",
    # issue 46: they passed by learning almost nothing (or, the KL, on lucky seeds)
    "first_token_only": "contract (every_token): d loss / d logp is 0 at the 2nd token of each response",
    "wrong_sign_kl": "claims (DAPO's, by default) to protect against entropy_collapse",
    # issue 69: rated "better than DAPO's fix" on length bias by doing less
    "eos_dropped": "contract (every_token): d loss / d logp is 0 at the last token of each response",
    "dual_clip_below_one": "contract (every_token): d loss / d logp is 0 at every token of the responses "
    "with a negative advantage",
}
"""Losses the check runs and fails (exit 1)."""

SCALE_ONLY = ("double_normalised", "near_frozen")
"""Broken only in their scale, which the trainer's AdamW (and the check's ScaleFreeSGD) cancels:
``near_frozen`` is Dr. GRPO's loss with another constant normaliser, and ``double_normalised``
divides each window by its token count once more (a per-window factor; in the toys a step is
one window, so little is left of it). Under the plain SGD of before they failed as learning
too little; a step size is not what the check judges (issue 69). They must learn now, and
``near_frozen``, a constant multiple of a correct loss, must pass."""

REFUSED: dict[str, str] = {
    "raises": "raised: RuntimeError: shape",
    "not_scalar": "must return a scalar tensor",
    "detached_output": "no gradient with respect to logp",
    "fixed_buffer": "raised: RuntimeError: The expanded size of the tensor (16)",
}
"""Losses the check refuses before or while running them (one line, exit 2)."""


# ---- correct (each must pass) ----------------------------------------------------------------


def paper_dapo(logp, old_logp, advantages, mask, *, eps_low, eps_high, clip_ratio_c=None, agg, **knobs):
    """DAPO Eq. 10 + 12 written from the paper, not from dapo.loss: token-level sum of the
    decoupled-clip surrogate over all responses / total tokens; dual clip for A < 0."""
    pg = _surrogate(logp, old_logp, advantages, eps_low, eps_high)
    if clip_ratio_c is not None:
        adv = advantages.unsqueeze(-1).expand_as(pg)
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_ratio_c), pg)
    m = mask.to(pg.dtype)
    den = knobs.get("agg_denominator")
    if agg == "token-mean":
        den = m.sum() if den is None else den
        return (pg * m).sum() / max(float(den), 1.0)
    rows = (pg * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    n = (m.sum(-1) > 0).sum() if den is None else den
    if agg == "seq-mean-token-sum-norm":
        rows = (pg * m).sum(-1) / knobs["norm_const"]
        n = (m.sum(-1) > 0).sum() if den is None else den / knobs["norm_const"]
    return rows.sum() / max(float(n), 1.0)


def decoupled_clip_no_dual(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """Decoupled clip with token-mean, no dual clip: correct once it declares the knobs it
    honours (``dapo_knobs``)."""
    return _masked_mean(_surrogate(logp, old_logp, advantages, eps_low, eps_high), mask)


def decoupled_clip_undeclared(logp, old_logp, advantages, mask, *, eps_low, eps_high, **knobs):
    """The same loss without the declaration: the probe must name the knobs it ignores."""
    return decoupled_clip_no_dual(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high)


decoupled_clip_no_dual.dapo_knobs = ("eps_low", "eps_high")  # type: ignore[attr-defined]


def symmetric_only(*args, **kwargs):
    """A user's wrapper around the built-in loss, taking everything through ``*args``."""
    return _policy_loss(*args, **kwargs)


CORRECT = ("paper_dapo", "decoupled_clip_no_dual", "symmetric_only")
