"""Experiment 2: zero-gradient groups and dynamic sampling (Section 3.2, Figure 3b, Figure 6).

Design. :func:`toybench.tasks.zero_grad_task` has prompts of graded difficulty with one
deterministic right path each. As training proceeds easy prompts turn into all-correct
groups and hard ones stay all-wrong: their advantages are exactly zero, but their tokens
still sit in the token-mean denominator, so the effective step shrinks. Dynamic sampling
keeps drawing until the batch holds only informative groups.

What it costs is measured, not assumed: generated responses and tokens per step, the
accuracy reached for the same number of generated responses, and the time to the target
on a simulated clock (:data:`toybench.runner.SIM_TAILS`): every generation round takes as
long as its slowest response (lengths times a per-response slowdown with no tail or a
heavy lognormal tail), and every training step adds ``rho`` rounds' worth of training
time (``rho * max_len`` token times). Dynamic sampling trades optimizer steps for
generation rounds, so which arm wins on the clock depends on ``rho``: with training free
(``rho = 0``) only rounds count; with training as costly as several rounds, steps count.
"""

from dapo import AlgoConfig

from ..experiment import (
    Arm,
    Contrast,
    Experiment,
    Summary,
    at_budget,
    change,
    final,
    first_reaching,
    mean_over_run,
)

BASE = AlgoConfig(
    group_size=8,
    train_groups=16,
    mini_batch_groups=4,
    ppo_epochs=1,
    eps_low=0.2,
    eps_high=0.28,
    loss_agg="token-mean",
    overlong_filter=False,
    soft_overlong=False,
    dynamic_sampling=False,
    expected_len=4,
    cache_len=2,
    max_grad_norm=None,
    max_gen_rounds=10,
)
LR = 20.0
TARGET = 0.8
STEPS = 60
# half of what the arm without dynamic sampling generates over the horizon
BUDGET = STEPS * BASE.train_groups * BASE.group_size / 2
REGIMES = ((0.0, "tail0"), (0.0, "tail1"), (1.0, "tail1"), (4.0, "tail0"), (8.0, "tail0"), (8.0, "tail1"))
"""(rho, tail) pairs of the simulated clock reported: training cost per step in rounds of
full length, and the generation-time tail."""


def time_to_target(tail: str, rho: float):
    """Simulated time (token times) until exact expected accuracy >= TARGET: generation
    rounds (each as long as its slowest response) plus ``rho * max_len`` per training step,
    counted through the step that reaches it; censored at the horizon."""

    def fn(log):
        for i, m in enumerate(log):  # noqa: B007 (i is the step reached, used below)
            if m["toy/expected_accuracy"] >= TARGET:
                break
        return log[i][f"cost/gen_time_{tail}_total"] + rho * BASE.max_len * (i + 1)

    return fn


EXPERIMENT = Experiment(
    name="zero_gradient",
    title="Zero-gradient groups: no dynamic sampling vs dynamic sampling",
    paper="Section 3.2, Figure 3b (share of accuracy-1 groups grows), Figure 6 (fewer steps with DS)",
    task="zero_grad",
    steps=STEPS,
    arms={
        "no_ds": Arm(BASE, LR),
        "dynamic_sampling": Arm(BASE.replace(dynamic_sampling=True), LR),
    },
    labels={"no_ds": "no dynamic sampling", "dynamic_sampling": "dynamic sampling"},
    summaries={
        "steps_to_target": Summary(
            first_reaching("toy/expected_accuracy", TARGET, "cost/optimizer_steps_total"),
            f"optimizer steps until exact expected accuracy >= {TARGET} (censored at the horizon)",
        ),
        "all_correct_change": Summary(
            change("rollout/groups_all_correct"),
            "change in the share of all-correct groups, last 10 - first 10 steps",
        ),
        "zero_grad_share_final": Summary(
            final("rollout/groups_all_correct"), "share of all-correct groups, last 10 steps"
        ),
        "responses_per_step": Summary(
            mean_over_run("sampling/generated_groups"), "groups generated per step"
        ),
        "tokens_per_step": Summary(mean_over_run("sampling/generated_tokens"), "tokens generated per step"),
        "accuracy_at_equal_rollouts": Summary(
            at_budget("toy/expected_accuracy", "cost/responses_total", BUDGET),
            f"exact expected accuracy once {int(BUDGET)} responses have been generated",
        ),
        "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
        "rounds_per_step": Summary(mean_over_run("sampling/rounds"), "generation rounds per step"),
        **{
            f"time_to_target_rho{rho:g}_{tail}": Summary(
                time_to_target(tail, rho),
                f"simulated time to accuracy {TARGET} (rho = {rho:g} rounds of training per step, {tail})",
            )
            for rho, tail in REGIMES
        },
    },
    contrasts=(
        Contrast(
            "dynamic sampling reaches the target in fewer optimizer steps",
            "no_ds",
            "dynamic_sampling",
            "steps_to_target",
            "-",
        ),
        Contrast(
            "without DS the share of all-correct groups grows (Fig. 3b)",
            None,
            "no_ds",
            "all_correct_change",
            "+",
            role="secondary",
        ),
        Contrast(
            "cost: DS generates more groups per step",
            "no_ds",
            "dynamic_sampling",
            "responses_per_step",
            "+",
            role="secondary",
        ),
        Contrast(
            "accuracy at equal generated responses",
            "no_ds",
            "dynamic_sampling",
            "accuracy_at_equal_rollouts",
            "?",
            role="secondary",
            note="the paper makes no claim at equal rollouts",
        ),
        *(
            Contrast(
                f"clock: time to target, training {rho:g} round(s)/step, {tail}",
                "no_ds",
                "dynamic_sampling",
                f"time_to_target_rho{rho:g}_{tail}",
                "?",
                role="secondary",
                note="simulated generation time, slowest response per round",
            )
            for rho, tail in REGIMES
        ),
    ),
    curves=(
        "toy/expected_accuracy",
        "toy/expected_accuracy@cost/responses_total",
        "toy/expected_accuracy@cost/gen_time_tail1_total",
        "rollout/groups_all_correct",
        "sampling/generated_groups",
    ),
)
