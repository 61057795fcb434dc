"""avg@k, pass@k (unbiased) and cons@k (majority vote), with bootstrap intervals over
problems. Answers are compared as canonical integers, never evaluated."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dapo.rewards import extract_answer, normalize_integer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k), computed as a stable product."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """Most frequent extracted answer (ties: the earliest to reach the top count); None
    answers do not vote."""
    votes = [a for a in answers if a is not None]
    if not votes:
        return None
    counts = Counter(votes)
    best = max(counts.values())
    return next(a for a in votes if counts[a] == best)


@dataclass
class ProblemResult:
    answer: str
    predictions: list[str | None]

    @property
    def correct(self) -> list[bool]:
        return [p == self.answer for p in self.predictions]


def canonical_prediction(text: str) -> str | None:
    raw = extract_answer(text)
    return normalize_integer(raw) if raw is not None else None


def _bootstrap(values: np.ndarray, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    if values.size < 2 or np.ptp(values) == 0:
        m = float(values.mean()) if values.size else math.nan
        return m, m
    rng = np.random.default_rng(seed)
    means = rng.choice(values, (n, values.size)).mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def eval_line(metrics: dict[str, float]) -> str:
    """The console line of an evaluation (:func:`summarize`'s metrics): each score with its
    95% interval, e.g. ``eval on 30 problems: avg@32 0.412 [0.301, 0.522], pass@1 ...``."""
    names = [
        k[len("eval/") :]
        for k in metrics
        if k.startswith("eval/") and "@" in k and not k.endswith(("_lo", "_hi"))
    ]
    parts = [
        f"{n} {metrics[f'eval/{n}']:.3f} [{metrics[f'eval/{n}_lo']:.3f}, {metrics[f'eval/{n}_hi']:.3f}]"
        for n in names
    ]
    return f"eval on {metrics.get('eval/problems', 0):.0f} problems: " + ", ".join(parts)


def summarize(results: Sequence[ProblemResult], ks: Sequence[int] | None = None) -> dict[str, float]:
    """``eval/avg@k``, ``eval/pass@j`` for j in ``ks`` (default 1, k), ``eval/cons@k``, each
    with ``_lo`` / ``_hi`` 95% bootstrap bounds over problems."""
    if not results:
        raise ValueError("no problems to summarize")
    k = len(results[0].predictions)
    if any(len(r.predictions) != k for r in results):
        raise ValueError("every problem needs the same number of samples")
    ks = sorted(set(ks or [1, k]))
    per = {f"avg@{k}": np.array([np.mean(r.correct) for r in results])}
    for j in ks:
        per[f"pass@{j}"] = np.array([pass_at_k(k, sum(r.correct), j) for r in results])
    per[f"cons@{k}"] = np.array([float(majority_answer(r.predictions) == r.answer) for r in results])
    out: dict[str, float] = {"eval/problems": float(len(results))}
    for name, v in per.items():
        lo, hi = _bootstrap(v)
        out[f"eval/{name}"] = float(v.mean())
        out[f"eval/{name}_lo"], out[f"eval/{name}_hi"] = lo, hi
    return out
