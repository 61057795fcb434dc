"""Prompt selection before generation: spend rollouts on prompts likely to be informative.

Dynamic sampling (Section 3.2, Eq. 11) generates a group and then drops it when
``|{o_i : correct}|`` is 0 or G: the tokens are already paid for. The policies here decide
*before* generating, from each prompt's outcome history, whether to draw its group now;
dynamic sampling still runs after them and still guarantees a batch of informative groups.

* :class:`Greso`: GRESO (Zheng et al. 2025, arXiv 2506.02177; the official code's
  ``presampling_selector``): a prompt whose last ``z`` groups were all correct (easy) or all
  wrong (hard) is kept with probability ``max(p ** z, floor)``, ``p`` one exploration
  probability for easy and one for hard prompts, each moved by ``step_size`` after every step
  toward a target share of zero-variance groups (``target_zero_variance``, split 1:2 between
  easy and hard: "more exploration on hard examples, because they are more likely to change").
* :class:`RetireSolved`: open-instruct's ``no_resampling_pass_rate``: a prompt whose last group
  reached ``pass_rate`` is retired, and drawn again only with probability ``revisit``.
* :class:`DifficultyPools`: prime-rl's ``DifficultyPoolSampler``: each prompt falls in a pool by
  its last pass rate (hard <= 0.25 < normal <= 0.75 < easy, unseen prompts neutral) and is drawn
  in proportion to its pool's weight, as rejection sampling from the prompt stream (kept with
  probability ``weight / max weight``, which draws each prompt in proportion to its weight).
* :class:`NoSelection`: every prompt is drawn (the baseline).

Every decision is a pure function of ``(seed, step, prompt key, draw)`` hashed to a uniform
number (:func:`uniform`) and of the history, which every rank updates from the same global
outcomes in the same order: the ranks agree without exchanging a decision, and a resumed run
decides exactly as the uninterrupted one from :meth:`PromptSelection.state_dict`. No policy
keeps a prompt with probability below its floor (``floor``, ``revisit``, the smallest pool
weight), so no prompt starves. Pure Python, no I/O.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol


def uniform(seed: int, step: int, key: int, draw: int) -> float:
    """A number in [0, 1) fixed by its arguments (blake2b of their bytes): the same on every
    rank, in every process, whatever ``PYTHONHASHSEED`` is."""
    raw = hashlib.blake2b(struct.pack("<4q", seed, step, key, draw), digest_size=8).digest()
    return int.from_bytes(raw, "little") / 2.0**64


@dataclass
class PromptRecord:
    """What the history holds for one prompt (all from groups actually generated)."""

    groups: int = 0
    """Groups generated for it so far."""
    last_step: int = -1
    """The step of its last group."""
    last_correct: int = 0
    """Correct responses in its last group."""
    last_size: int = 0
    """Responses in its last group (G)."""
    streak: int = 0
    """Consecutive zero-variance groups up to the last: ``+z`` all correct, ``-z`` all wrong,
    0 when the last group was informative."""

    @property
    def pass_rate(self) -> float:
        return self.last_correct / self.last_size if self.last_size else math.nan

    def informative_probability(self) -> float:
        """P(0 < #correct < G) for its next group if each response is right with its last pass
        rate, smoothed ((c + 1/2) / (G + 1)) so that a group of one outcome is not certain."""
        g = self.last_size
        p = (self.last_correct + 0.5) / (g + 1)
        return 1.0 - p**g - (1.0 - p) ** g


class SelectionPolicy(Protocol):
    """A rule for the probability of drawing a prompt's group now."""

    name: str

    def keep_probability(self, record: PromptRecord | None) -> tuple[float, str]:
        """``(probability, class)``: class names why (``unseen``, ``informative``, ``easy``,
        ``hard``, ``retired``, or a pool)."""
        ...

    def adapt(self, easy_share: float, hard_share: float) -> None:
        """After a step: the shares of all-correct and all-wrong groups among its groups."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _Fixed:
    """A policy that does not adapt: nothing to learn after a step, nothing to checkpoint."""

    def adapt(self, easy_share: float, hard_share: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class NoSelection(_Fixed):
    """Every prompt is drawn."""

    name: str = "none"

    def keep_probability(self, record: PromptRecord | None) -> tuple[float, str]:
        return 1.0, "unseen" if record is None else "seen"


def _zero_variance_class(record: PromptRecord | None) -> str:
    if record is None or record.groups == 0:
        return "unseen"
    return "easy" if record.streak > 0 else "hard" if record.streak < 0 else "informative"


@dataclass
class Greso:
    """GRESO's probabilistic pre-rollout skipping (see the module docstring; its code's
    defaults)."""

    target_zero_variance: float = 0.25
    """The share of zero-variance groups the exploration probabilities steer toward."""
    easy_fraction: float = 1.0 / 3.0
    """The part of that share meant for all-correct groups (the rest: all-wrong)."""
    step_size: float = 0.01
    """How far each exploration probability moves after a step."""
    p_init: float = 0.5
    p_min: float = 0.05
    p_max: float = 0.95
    floor: float = 0.01
    """The least probability of keeping any prompt, however long its streak."""
    p_easy: float = field(default=math.nan)
    p_hard: float = field(default=math.nan)
    name: str = "greso"

    def __post_init__(self) -> None:
        if not 0 < self.floor <= 1 or not 0 < self.p_min <= self.p_init <= self.p_max <= 1:
            raise ValueError("greso: need 0 < floor <= 1 and 0 < p_min <= p_init <= p_max <= 1")
        if not 0 <= self.target_zero_variance <= 1 or not 0 <= self.easy_fraction <= 1:
            raise ValueError("greso: target_zero_variance and easy_fraction lie in [0, 1]")
        if math.isnan(self.p_easy):
            self.p_easy = self.p_init
        if math.isnan(self.p_hard):
            self.p_hard = self.p_init

    def keep_probability(self, record: PromptRecord | None) -> tuple[float, str]:
        cls = _zero_variance_class(record)
        if cls in ("unseen", "informative"):
            return 1.0, cls
        assert record is not None
        p = self.p_easy if cls == "easy" else self.p_hard
        return max(p ** abs(record.streak), self.floor), cls

    def adapt(self, easy_share: float, hard_share: float) -> None:
        """Above its target, a class is explored less; below, more (GRESO's rule)."""
        t_easy = self.target_zero_variance * self.easy_fraction
        t_hard = self.target_zero_variance - t_easy
        if not math.isnan(easy_share):
            d = -self.step_size if easy_share >= t_easy else self.step_size
            self.p_easy = min(max(self.p_easy + d, self.p_min), self.p_max)
        if not math.isnan(hard_share):
            d = -self.step_size if hard_share >= t_hard else self.step_size
            self.p_hard = min(max(self.p_hard + d, self.p_min), self.p_max)

    def state_dict(self) -> dict[str, Any]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])


@dataclass
class RetireSolved(_Fixed):
    """Retire a prompt once a group of it reaches ``pass_rate``; draw it again with
    probability ``revisit`` (a revisited prompt that falls below the rate comes back)."""

    pass_rate: float = 1.0
    revisit: float = 0.05
    name: str = "retire"

    def __post_init__(self) -> None:
        if not 0 < self.pass_rate <= 1 or not 0 < self.revisit <= 1:
            raise ValueError("retire: need 0 < pass_rate <= 1 and 0 < revisit <= 1")

    def keep_probability(self, record: PromptRecord | None) -> tuple[float, str]:
        if record is not None and record.groups and record.pass_rate >= self.pass_rate:
            return self.revisit, "retired"
        return 1.0, _zero_variance_class(record)


@dataclass
class DifficultyPools(_Fixed):
    """Draw prompts in proportion to the weight of their pool (by last pass rate): hard up to
    ``hard_max``, normal up to ``normal_max``, easy above; unseen prompts weigh ``unseen``."""

    hard_max: float = 0.25
    normal_max: float = 0.75
    hard: float = 0.2
    normal: float = 1.0
    easy: float = 0.2
    unseen: float = 1.0
    name: str = "pools"

    def __post_init__(self) -> None:
        weights = (self.hard, self.normal, self.easy, self.unseen)
        if min(weights) <= 0 or not 0 <= self.hard_max < self.normal_max <= 1:
            raise ValueError("pools: weights must be > 0 and 0 <= hard_max < normal_max <= 1")

    def keep_probability(self, record: PromptRecord | None) -> tuple[float, str]:
        top = max(self.hard, self.normal, self.easy, self.unseen)
        if record is None or record.groups == 0:
            return self.unseen / top, "unseen"
        rate = record.pass_rate
        pool = "hard" if rate <= self.hard_max else "normal" if rate <= self.normal_max else "easy"
        return float(getattr(self, pool)) / top, pool


POLICIES: dict[str, type] = {
    "none": NoSelection,
    "greso": Greso,
    "retire": RetireSolved,
    "pools": DifficultyPools,
}
"""Selection policies by name (``algo.prompt_selection``)."""


def make_policy(name: str, **options: Any) -> SelectionPolicy:
    """The policy ``name`` with its options (dataclass fields); a clear error otherwise."""
    if name not in POLICIES:
        raise ValueError(f"unknown prompt selection {name!r}; known: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    known = {f.name for f in fields(cls)} - {"name", "p_easy", "p_hard"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"prompt selection {name!r} has no option {unknown[0]!r}; known: {sorted(known)}")
    policy: SelectionPolicy = cls(**options)
    return policy


def parse_spec(spec: str) -> SelectionPolicy:
    """The policy a spec names: ``greso``, or ``greso:target_zero_variance=0.3,floor=0.02``
    (numbers only; ``AlgoConfig.prompt_selection``)."""
    name, _, rest = spec.partition(":")
    options: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            options[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{spec!r}: options are name=number, got {item!r}") from None
    return make_policy(name.strip(), **options)


@dataclass
class Decision:
    keep: bool
    probability: float
    cls: str


class PromptSelection:
    """A policy, the history it reads, and the step's accounting.

    Per step: :meth:`decide` for each prompt the stream offers (a prompt offered twice in a
    step gets two independent draws), :meth:`observe` with
    every generated group's outcome (global, in one order on every rank), then
    :meth:`end_step` for the metrics and the policy's adaptation."""

    def __init__(self, policy: SelectionPolicy, seed: int = 0):
        self.policy = policy
        self.seed = seed
        self.history: dict[int, PromptRecord] = {}
        self._reset_step()

    def _reset_step(self) -> None:
        self.offered = 0
        self.forced = 0
        self.skipped = 0
        self.skipped_by: dict[str, int] = {}
        self.predicted: list[float] = []
        self.generated = 0
        self.informative = 0
        self.easy = 0
        self.hard = 0
        self.draws: dict[int, int] = {}

    def decide(self, key: int, step: int) -> Decision:
        """Whether to generate ``key``'s group now (counted as offered, and as skipped if not)."""
        record = self.history.get(key)
        p, cls = self.policy.keep_probability(record)
        draw = self.draws.get(key, 0)
        self.draws[key] = draw + 1
        keep = p >= 1.0 or uniform(self.seed, step, key, draw) < p
        self.offered += 1
        if not keep:
            self.skipped += 1
            self.skipped_by[cls] = self.skipped_by.get(cls, 0) + 1
        return Decision(keep, p, cls)

    def observe(self, keys: Sequence[int], n_correct: Sequence[int], group_size: int, step: int) -> None:
        """Record generated groups: prompt ``keys[i]`` had ``n_correct[i]`` of ``group_size``
        right. The prediction for each (from the history before it) is kept for the metrics."""
        if len(keys) != len(n_correct):
            raise ValueError(f"{len(keys)} keys for {len(n_correct)} outcomes")
        for key, c in zip(keys, n_correct):
            c = int(c)
            if not 0 <= c <= group_size:
                raise ValueError(f"prompt {key}: {c} correct of a group of {group_size}")
            rec = self.history.get(key)
            if rec is None:
                rec = self.history[key] = PromptRecord()
                self.predicted.append(math.nan)
            else:
                self.predicted.append(rec.informative_probability())
            uniform_group = c in (0, group_size)
            sign = 1 if c == group_size else -1
            if uniform_group and rec.streak * sign > 0:
                rec.streak += sign
            else:
                rec.streak = sign if uniform_group else 0
            rec.groups += 1
            rec.last_step = step
            rec.last_correct, rec.last_size = c, group_size
            self.generated += 1
            self.informative += not uniform_group
            self.easy += c == group_size
            self.hard += c == 0

    def end_step(self) -> dict[str, float]:
        """The step's ``sampling/*`` selection metrics; adapts the policy; starts the next step."""
        n = self.generated
        predicted = [p for p in self.predicted if not math.isnan(p)]
        out = {
            "sampling/offered_prompts": float(self.offered),
            "sampling/skipped_prompts": float(self.skipped),
            "sampling/forced_prompts": float(self.forced),
            "sampling/retired_prompts": float(
                sum(self.policy.keep_probability(r)[1] == "retired" for r in self.history.values())
            ),
            "sampling/informative_groups": float(self.informative),
            "sampling/predicted_informative_rate": sum(predicted) / len(predicted) if predicted else math.nan,
            "sampling/realised_informative_rate": self.informative / n if n else math.nan,
        }
        for cls in ("easy", "hard", "retired"):
            out[f"sampling/skipped_{cls}"] = float(self.skipped_by.get(cls, 0))
        self.policy.adapt(self.easy / n if n else math.nan, self.hard / n if n else math.nan)
        for name, value in self.policy.state_dict().items():
            out[f"sampling/selection_{name}"] = float(value)
        self._reset_step()
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: the history, the policy's adapted state, the seed."""
        return {
            "policy": self.policy.name,
            "seed": self.seed,
            "policy_state": self.policy.state_dict(),
            "history": {str(k): asdict(r) for k, r in sorted(self.history.items())},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != self.policy.name:
            raise ValueError(
                f"the checkpoint's prompt selection is {state.get('policy')!r}, this run's {self.policy.name!r}"
            )
        self.seed = int(state["seed"])
        self.policy.load_state_dict(state["policy_state"])
        self.history = {int(k): PromptRecord(**r) for k, r in state["history"].items()}
        self._reset_step()


def select(
    selection: PromptSelection,
    offers: Iterable[int],
    want: int,
    step: int,
    max_offers: int,
    fill: bool = False,
) -> tuple[list[int], int]:
    """Take prompts from ``offers`` (the prompt stream's order) until ``want`` are kept or
    ``max_offers`` were offered: ``(kept keys, offers consumed)``. Skipped prompts are
    consumed (GRESO: a skipped prompt waits for its next turn in the stream). ``fill``: a
    round short after ``max_offers`` takes the stream's next prompts undecided (counted as
    ``sampling/forced_prompts``), so every round has ``want`` prompts."""
    kept: list[int] = []
    used = 0
    if want <= 0 or max_offers <= 0:
        return kept, used
    for key in offers:  # never takes an offer it does not decide on (offers may be the stream)
        used += 1
        if selection.decide(key, step).keep:
            kept.append(key)
        if len(kept) >= want or used >= max_offers:
            break
    if fill and len(kept) < want:
        for key in offers:
            used += 1
            kept.append(key)
            selection.forced += 1
            if len(kept) >= want:
                break
    return kept, used


__all__ = [
    "POLICIES",
    "Decision",
    "DifficultyPools",
    "Greso",
    "NoSelection",
    "PromptRecord",
    "PromptSelection",
    "RetireSolved",
    "SelectionPolicy",
    "make_policy",
    "parse_spec",
    "select",
    "uniform",
]
