"""The toy regime's prompt selection (issue 33): the runner's stream and selection, the drift,
and the experiment's headline at a reduced seed count (the full table: docs/results/prompt-selection.md, from
``dapo toy run prompt_selection --seeds 10``)."""

from dataclasses import replace

import pytest

from dapo import AlgoConfig
from toybench.experiment import run_experiments
from toybench.experiments import BEYOND, REGISTRY
from toybench.experiments.prompt_selection import DRIFT_AT, EXPERIMENT
from toybench.runner import RunSpec, train

pytestmark = pytest.mark.slow

CFG = AlgoConfig(
    group_size=8,
    train_groups=16,
    mini_batch_groups=4,
    eps_low=0.2,
    eps_high=0.28,
    overlong_filter=False,
    soft_overlong=False,
    dynamic_sampling=True,
    expected_len=4,
    cache_len=2,
    max_grad_norm=None,
)


def _run(**kw):
    return train(RunSpec(task="prompt_pool", cfg=CFG, steps=kw.pop("steps", 30), lr=20.0, seed=3, **kw))


def test_prompt_selection_is_beyond_the_paper_not_in_the_gate():
    assert "prompt_selection" in BEYOND and "prompt_selection" not in REGISTRY


def test_without_selection_every_offer_is_generated_and_every_round_is_full():
    log = _run(selection="none")
    for m in log:
        assert m["sampling/skipped_prompts"] == 0 and m["sampling/forced_prompts"] == 0
        assert m["sampling/offered_prompts"] == m["sampling/generated_groups"] == 16 * m["sampling/rounds"]


def test_selection_skips_offers_yet_fills_every_round():
    log = _run(selection="greso")
    assert sum(m["sampling/skipped_prompts"] for m in log) > 0
    for m in log:  # a round always holds train_groups prompts (forced after a full pass of skips)
        assert m["sampling/generated_groups"] == 16 * m["sampling/rounds"]
        assert m["sampling/offered_prompts"] == (
            m["sampling/generated_groups"] + m["sampling/skipped_prompts"] - m["sampling/forced_prompts"]
        )
        assert m["sampling/informative_groups"] <= m["sampling/generated_groups"]


def test_a_drifting_run_is_the_same_run_until_the_drift():
    """Paired seeds: up to ``drift_at`` the drifting arm is bit for bit the stationary one;
    at the drift the drifted prompts' accuracy falls (they now need 3 work tokens)."""
    still, drift = _run(selection="retire"), _run(selection="retire", drift_at=10)
    for a, b in zip(still[:10], drift[:10]):
        assert a == {k: v for k, v in b.items() if k != "toy/expected_accuracy_drifted"}
    assert drift[10]["toy/expected_accuracy"] < still[10]["toy/expected_accuracy"]
    assert drift[10]["toy/expected_accuracy_drifted"] < drift[9]["toy/expected_accuracy_drifted"]
    assert "toy/expected_accuracy_drifted" not in still[0]


def test_greso_generates_fewer_tokens_per_informative_group_than_dynamic_sampling_on_every_seed():
    """The experiment's primary at 3 + 3 seeds (-24 tokens on 10 + 10): on every seed of both
    blocks, GRESO's rollouts cost fewer tokens per informative group; and the selection costs
    accuracy at equal optimizer steps (-0.07 on 10 + 10), the price reported next to it."""
    arms = ("ds", "greso", "drift_ds", "drift_greso")
    exp = replace(
        EXPERIMENT,
        arms={a: EXPERIMENT.arms[a] for a in arms},
        contrasts=tuple(c for c in EXPERIMENT.contrasts if c.a in arms and c.b in arms),
    )
    (r,) = run_experiments([exp], seeds=3, jobs=1, progress=False)
    tokens = r.summaries["tokens_per_informative"]
    assert all(g < d for g, d in zip(tokens["greso"], tokens["ds"]))
    assert r.primary.verdict == "reproduced"
    acc = r.summaries["accuracy_final"]
    assert sum(acc["greso"]) < sum(acc["ds"])
    assert DRIFT_AT < exp.steps
    logs = r.logs["drift_greso"]
    assert all("toy/expected_accuracy_drifted" in m for log in logs.values() for m in log)
