"""Peers' metric names -> :data:`dapo.schema.SCHEMA`. One vocabulary for every reader: a name
means the same in every log that uses it, so the framework need not be known. W&B and
TensorBoard prefix TRL's and OpenRLHF's names with ``train/``; the prefix is stripped when the
rest is a known name."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ...schema import SCHEMA

VERL = {
    "actor/entropy": "actor/entropy",
    "actor/entropy_loss": "actor/entropy",  # before verl 0.4 the entropy was logged under this name
    "actor/pg_clipfrac": "actor/clipfrac_upper",  # both clip sides; read as the upper one
    "actor/pg_clipfrac_lower": "actor/clipfrac_lower",
    "actor/ppo_kl": "actor/approx_kl",
    "actor/kl_loss": "actor/ref_kl",
    "actor/grad_norm": "actor/grad_norm",
    "actor/pg_loss": "actor/loss",
    "response_length/mean": "rollout/length_mean",
    "response_length/max": "rollout/length_max",
    "response_length/clip_ratio": "rollout/truncation_rate",
    "critic/score/mean": "rollout/reward_mean",
    "critic/score/max": "rollout/reward_max",
    "critic/score/min": "rollout/reward_min",
    "train/num_gen_batches": "sampling/rounds",
    "training/rollout_probs_diff_mean": "mismatch/logp_gap",
    # rollout correction (verl >= 0.6, rollout_corr_helper): the engine-trainer mismatch
    "rollout_corr/k3_kl": "mismatch/k3_kl",
    "rollout_corr/kl": "mismatch/kl",
    "rollout_corr/chi2_token": "mismatch/chi2_token",
    "rollout_corr/chi2_seq": "mismatch/chi2_seq",
    "rollout_corr/ppl_ratio": "mismatch/ppl_ratio",
    "rollout_corr/log_ppl_abs_diff": "mismatch/log_ppl_abs_diff",
}
"""verl (``metric_utils.compute_data_metrics`` and the actor) -> this schema."""

TRL = {
    "entropy": "actor/entropy",
    "clip_ratio/high_mean": "actor/clipfrac_upper",
    "clip_ratio/low_mean": "actor/clipfrac_lower",
    "clip_ratio": "actor/clipfrac_upper",  # TRL < 0.17: one clip fraction
    "completions/mean_length": "rollout/length_mean",
    "completion_length": "rollout/length_mean",  # TRL < 0.16
    "completions/max_length": "rollout/length_max",
    "completions/clipped_ratio": "rollout/truncation_rate",
    "frac_reward_zero_std": "rollout/groups_uniform",  # groups whose rewards are all equal
    "reward": "rollout/reward_mean",
    "reward_std": "rollout/reward_std",
    "grad_norm": "actor/grad_norm",
    "kl": "actor/ref_kl",
    "loss": "actor/loss",
}
"""TRL GRPOTrainer -> this schema. ``kl`` is the KL to the reference model."""

OPENRLHF = {
    "policy_loss": "actor/loss",
    "response_length": "rollout/length_mean",
}
"""OpenRLHF's PPO trainer status (``train/<name>`` in W&B and TensorBoard, with
``train/global_step``); its ``reward`` and ``kl`` (to the reference) read as TRL's."""

CUSTOM = {
    "kl_divergence": "actor/ref_kl",  # custom GRPO trainers: the KL to the reference
    "kl_ref": "actor/ref_kl",  # MiniMind
    "kl_div": "actor/ref_kl",
    "mean_kl": "actor/ref_kl",
    "pg_loss": "actor/loss",
    "act_loss": "actor/loss",  # DeepSpeed-Chat step 3
    "actor_loss": "actor/loss",
    "average_reward_score": "rollout/reward_mean",  # DeepSpeed-Chat: "average reward score: 0.21"
    "mean_reward": "rollout/reward_mean",
    "avg_reward": "rollout/reward_mean",
    "average_reward": "rollout/reward_mean",
    "reward_avg": "rollout/reward_mean",  # reasoning-from-scratch's CSV tables (held-out-7)
    "entropy_avg": "actor/entropy",
    "avg_entropy": "actor/entropy",
    "mean_entropy": "actor/entropy",
    "kl_loss": "actor/ref_kl",  # verl's actor/kl_loss without its prefix: the KL to the reference
    "clip_fraction": "actor/clipfrac_upper",  # one clip fraction for both sides (TRL < 0.17's reading)
    "reward_mean": "rollout/reward_mean",
    "score": "rollout/reward_mean",  # a table's 'score' column: verl's name for the reward
    "accuracy": "rollout/accuracy",
    "acc": "rollout/accuracy",
    "mean_accuracy": "rollout/accuracy",
    "avg_response_length": "rollout/length_mean",
    "mean_response_length": "rollout/length_mean",
    "avg_length": "rollout/length_mean",
    "avg_len": "rollout/length_mean",
    "avg_response_len": "rollout/length_mean",
    "mean_length": "rollout/length_mean",
    "mean_completion_length": "rollout/length_mean",
    "completion_length_mean": "rollout/length_mean",
    "gnorm": "actor/grad_norm",  # fairseq-style abbreviations of the gradient norm
    "gradn": "actor/grad_norm",
    "total_rewards_mean": "rollout/reward_mean",  # MLX-LM's GRPO trainer
    "grouped_rewards_std": "rollout/reward_std",  # MLX-LM: the within-group spread
    "grad": "actor/grad_norm",  # 'loss=... grad=... lr=...' loops
    "frac_zero_std": "rollout/groups_uniform",  # TRL's frac_reward_zero_std, shortened
    "adv_std": "rollout/advantage_std",  # MiniMind and other hand-written GRPO loops
    "advantage_std": "rollout/advantage_std",
    "truncation_rate": "rollout/truncation_rate",
    "clipped_ratio": "rollout/truncation_rate",
}
"""Names custom trainers print (``step:N | policy_loss=... | kl_divergence=... | mean_reward=...``)."""

EVAL = re.compile(
    r"^(?:val-core/.+/(?:acc|reward|score)/mean@\d+|val/test_score/.+|eval_(?:reward|accuracy|acc)|"
    r"eval_rewards/.*(?:accuracy|correct)\w*(?:/mean)?|eval/avg@\d+)$"
)
"""Validation scores (higher is better) -> ``eval/score``: verl's ``val-core/<data>/<acc|reward|score>/mean@N``
and older ``val/test_score/<data>``, TRL's ``eval_reward`` / ``eval_accuracy`` (``eval_acc`` in hand-written
loops), this project's
``eval/avg@k``. Where a row has several (one per data set), their mean."""

PREFIXES = ("ppo_", "grpo_", "rl_", "train_")
"""Prefixes people put before a known name when they log it themselves."""

FALLBACK = {
    "critic/rewards/mean": "rollout/reward_mean",  # verl: reward after the KL penalty
    "rewards/mean": "rollout/reward_mean",
    "reward/mean": "rollout/reward_mean",
}
"""Used only where the row has no better source for the same metric."""

NAMES = {**CUSTOM, **OPENRLHF, **TRL, **VERL}
ACCURACY = re.compile(r"^(?:train/)?rewards?/(?:accuracy|correctness|correct|acc)\w*?(?:/mean)?$")
"""TRL's per-function reward columns that are an accuracy (0/1 per response)."""


BOOKKEEPING = re.compile(
    r"(?i)^(?:epoch|epochs|lr|learning_rate|learning rate|time|timestamp|elapsed|eta|step_time|"
    r"global_step|total_flos|train_runtime|train_samples_per_second|train_steps_per_second|"
    r"(?:actor|critic)/lr|(?:timing_s|timing_per_token_ms|perf|time|throughput)/.*|"
    r"(?:global_seqlen|prompt_length|critic/returns|critic/values)/.*|\d+)$"
)
"""Columns a log keeps for its own bookkeeping (schedule, clock, throughput, sizes): known not
to be health metrics, so never listed as unread."""

_USER: ContextVar[Mapping[str, str] | None] = ContextVar("dapo_health_user_names", default=None)
"""The user's own names for this read (``dapo diagnose --map``): folded log name -> schema name."""


def _fold(key: str) -> str:
    return re.sub(r"[\s_]+", "_", key.strip().strip("`").lower())


def parse_map(items: list[str] | Mapping[str, Any], where: str = "--map") -> dict[str, str]:
    """The user's mapping of a log's column names onto metrics: ``["Pre=reward,GradN=grad_norm"]``
    (pairs separated by commas), or a mapping read from a file. A target is a schema name
    (``rollout/reward_mean``) or any name this tool reads (``reward``, ``grad_norm``, ``kl``);
    anything else is a ``ValueError`` naming it."""
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items:
            for part in filter(None, (p.strip() for p in item.split(","))):
                name, sep, target = part.partition("=")
                if not sep or not name.strip() or not target.strip():
                    raise ValueError(f"{where}: {part!r} is not COLUMN=METRIC")
                pairs.append((name, target))
    out: dict[str, str] = {}
    for name, target in pairs:
        if not isinstance(name, str) or not isinstance(target, str):
            raise ValueError(f"{where}: {name!r}: {target!r} is not a column name and a metric name")
        schema = metric_name(target.strip())
        if schema is None:
            raise ValueError(
                f"{where}: {name.strip()}={target.strip()}: {target.strip()!r} is not a metric this tool reads "
                "(a schema name such as rollout/reward_mean, or a logged name such as reward, accuracy, "
                "grad_norm, kl, entropy, loss, completion_length)"
            )
        out[_fold(name)] = schema
    return out


@contextmanager
def user_names(mapping: Mapping[str, str]) -> Iterator[None]:
    """Read with the user's names (:func:`parse_map`'s result) as well as the known ones."""
    token = _USER.set(mapping)
    try:
        yield
    finally:
        _USER.reset(token)


def metric_name(key: str) -> str | None:
    """The schema name a log's key stands for, or None for a key this tool does not read. The
    user's own names (:func:`user_names`) come first."""
    user = _USER.get()
    if user and _fold(key) in user:
        return user[_fold(key)]
    return _known_name(key)


@functools.lru_cache(maxsize=8192)
def _known_name(key: str) -> str | None:
    """:func:`metric_name` without the user's names: a function of the key alone, so kept per
    key (a 1 MB log asks for the same few dozen keys ~170,000 times: 0.75 s of a 4 s profile)."""
    if key in SCHEMA and key != "step":
        return key
    if key in NAMES:
        return NAMES[key]
    if key.startswith("train/") and key[6:] in NAMES:
        return NAMES[key[6:]]
    for prefix in PREFIXES:  # a user's own logging: ppo_response_length, grpo_reward
        if key.startswith(prefix) and key[len(prefix) :] in NAMES:
            return NAMES[key[len(prefix) :]]
    if ACCURACY.match(key):
        return "rollout/accuracy"
    if EVAL.match(key):
        return "eval/score"
    return None


SPECIAL = ("critic/advantages/max", "critic/advantages/min", "batch/solve_none", "batch/solve_all")
"""Keys :func:`normalize` reads itself (into ``rollout/advantage_abs_max`` and the group shares)."""


def columns(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """What a log's rows hold: each numeric column this tool reads, with the metric it is read
    as, and each numeric column it does not read (bookkeeping such as the learning rate or the
    clock left out, :data:`BOOKKEEPING`), in the order they first occur."""
    read: dict[str, str] = {}
    unread: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key in ("step", "_line", "_run") or key in read or key in unread:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            name = metric_name(key) or FALLBACK.get(key)
            if name is not None:
                read[key] = name
            elif key in SPECIAL:
                read[key] = "rollout/advantage_abs_max" if key.startswith("critic/") else "rollout/groups_*"
            elif not BOOKKEEPING.match(key) and not key.startswith("batch/"):
                unread[key] = None
    return read, list(unread)


def _share(row: Mapping[str, Any], out: dict[str, float]) -> None:
    """verl DAPO's ``batch/solve_none`` / ``batch/solve_all``: counts of prompts whose answers
    were all wrong / all right (with ``batch/solve_partial``), or shares (prime-rl)."""
    none, full = row.get("batch/solve_none"), row.get("batch/solve_all")
    if not isinstance(none, (int, float)) or not isinstance(full, (int, float)):
        return
    partial = row.get("batch/solve_partial")
    total = none + full + partial if isinstance(partial, (int, float)) else row.get("batch/num_tasks")
    if isinstance(total, (int, float)) and total > 0:
        none, full = none / total, full / total
    elif max(none, full) > 1 or none + full > 1:
        return  # counts without a total: no share
    out.setdefault("rollout/groups_all_wrong", float(none))
    out.setdefault("rollout/groups_all_correct", float(full))


def normalize(row: Mapping[str, Any]) -> dict[str, float]:
    """A log row in this schema: known metrics only, numbers only (NaN/inf kept as evidence)."""
    out: dict[str, float] = {}
    scores = []
    for key, value in row.items():
        name = metric_name(key)
        if name is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if name == "eval/score" and key != name:
            scores.append(float(value))
        else:
            out[name] = float(value)
    if scores:
        out.setdefault("eval/score", sum(scores) / len(scores))
    for key, name in FALLBACK.items():
        if name not in out and isinstance(row.get(key), (int, float)):
            out[name] = float(row[key])
    amax, amin = row.get("critic/advantages/max"), row.get("critic/advantages/min")
    if isinstance(amax, (int, float)) and isinstance(amin, (int, float)):
        out["rollout/advantage_abs_max"] = max(abs(float(amax)), abs(float(amin)))
    _share(row, out)
    return out


def number(text: str) -> float | None:
    """A number as logs print it: ``0.5``, ``nan``, ``-inf``, ``np.float64(0.5)``,
    ``tensor(0.5)``, the mean of a ``mean|std`` or ``mean±std`` pair; None for anything else."""
    try:  # the common case first: a plain number
        value = float(text)
    except ValueError:
        pass
    else:
        return (
            value
            if math.isfinite(value) or text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity")
            else None
        )
    text = text.strip()
    for sep in ("|", "±", "+-", "+/-"):  # "52.5|37.7", "0.102±0.077": mean and std, as loggers print a pair
        mean, bar, spread = text.partition(sep)
        if bar and mean and number(spread) is not None:
            return number(mean)

    m = re.fullmatch(r"(?:np\.\w+|numpy\.\w+|tensor|float)\((.*?)(?:,.*)?\)", text)
    if m:
        text = m.group(1).strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) or text.lower().lstrip("+-") in ("nan", "inf", "infinity") else None
