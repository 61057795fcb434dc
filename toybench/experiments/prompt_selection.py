"""Beyond the paper: prompt selection before generation against dynamic sampling alone (issue 33).

Design. :func:`toybench.tasks.prompt_pool_task` has 64 prompts of graded difficulty: easy ones
are solved within a few steps and then give all-correct groups, the hardest give all-wrong
groups for most of the horizon. Prompts come from a data-loader stream (a permutation per
epoch). Every arm but ``no_filter`` runs dynamic sampling, which still fills each batch with
informative groups; the selection policies (:mod:`dapo.prompt_selection`, their published
defaults) decide before generating which prompts of the stream to generate at all:
GRESO's probabilistic skipping, retire-when-solved (open-instruct), difficulty pools
(prime-rl). The ``drift_*`` arms run the same policies on a task whose easiest quarter needs
3 work tokens from step 25 on (``drift_at``): prompts solved and set aside become
informative again, where skipping them should cost accuracy.

Measured, not assumed: groups and tokens generated per informative group, accuracy at equal
generated tokens, at equal optimizer steps (the horizon), and at equal time on the simulated
clock with a long tail (``tail1``) and training costing 0, 1 or 4 rounds per step.
No direction is predicted except the cost per informative group (GRESO's and every selection's
premise) and the drift arms' loss on the drifted prompts; everything else is reported as found.
"""

from ..experiment import Arm, Contrast, Experiment, Summary, at_budget, final
from .zero_gradient import BASE, LR

STEPS = 60
DRIFT_AT = 25
DS = BASE.replace(dynamic_sampling=True)
BUDGET = STEPS * BASE.train_groups * BASE.group_size * 5 / 2
"""Generated tokens at which accuracy is compared: about half of what ``no_filter`` (one round
per step) generates over the horizon (responses here run ~5 tokens), within every arm's."""
RHOS = (0.0, 1.0, 4.0)
POLICIES = ("greso", "retire", "pools")


def per_informative(metric: str):
    """Generated ``metric`` (groups or tokens) per informative group, over the whole run."""

    def fn(log):
        informative = sum(m["sampling/informative_groups"] for m in log)
        return sum(m[metric] for m in log) / informative if informative else float("nan")

    return fn


def clock_budget(rho: float) -> float:
    """The simulated time accuracy is compared at: 3,000 token times of generation plus half
    the horizon's training time, within every arm's horizon (``no_filter``, one round a step,
    spends ~3,800 + ``rho * max_len * 60``)."""
    return 3000.0 + rho * BASE.max_len * STEPS / 2


def accuracy_at_clock(rho: float):
    """Exact expected accuracy once the simulated clock (tail1: each round as long as its
    slowest response, plus ``rho * max_len`` per training step) reaches :func:`clock_budget`.
    A time-to-target would be censored for most arms here (few reach 0.8 in 60 steps) and
    censoring favours the arm that spends least, so the clock compares accuracy instead."""
    budget = clock_budget(rho)

    def fn(log):
        for i, m in enumerate(log):
            if m["cost/gen_time_tail1_total"] + rho * BASE.max_len * (i + 1) >= budget:
                return m["toy/expected_accuracy"]
        return log[-1]["toy/expected_accuracy"]

    return fn


def _arms() -> dict[str, Arm]:
    arms = {"no_filter": Arm(BASE, LR, selection="none"), "ds": Arm(DS, LR, selection="none")}
    arms.update({name: Arm(DS, LR, selection=name) for name in POLICIES})
    arms["drift_ds"] = Arm(DS, LR, selection="none", drift_at=DRIFT_AT)
    arms.update({f"drift_{name}": Arm(DS, LR, selection=name, drift_at=DRIFT_AT) for name in POLICIES})
    return arms


_POLICY_LABELS = {"greso": "GRESO", "retire": "retire when solved", "pools": "difficulty pools"}


def _labels() -> dict[str, str]:
    labels = {"no_filter": "no filtering, no DS", "ds": "dynamic sampling (DS) alone"}
    labels.update({name: f"{text} + DS" for name, text in _POLICY_LABELS.items()})
    labels.update(
        {f"drift_{k}": f"{v}, task drifts at step {DRIFT_AT}" for k, v in labels.items() if k != "no_filter"}
    )
    return labels


def _versus_ds(policy: str) -> tuple[Contrast, ...]:
    return (
        Contrast(
            f"{policy}: tokens generated per informative group",
            "ds",
            policy,
            "tokens_per_informative",
            "-",
            role="primary" if policy == "greso" else "secondary",
        ),
        Contrast(
            f"{policy}: groups per informative group",
            "ds",
            policy,
            "groups_per_informative",
            "-",
            "secondary",
        ),
        Contrast(
            f"{policy}: accuracy at equal generated tokens",
            "ds",
            policy,
            "accuracy_at_equal_tokens",
            "?",
            "secondary",
        ),
        Contrast(
            f"{policy}: accuracy at equal optimizer steps", "ds", policy, "accuracy_final", "?", "secondary"
        ),
        *(
            Contrast(
                f"{policy}: accuracy at equal clock, training {rho:g} round(s)/step, tail1",
                "ds",
                policy,
                f"accuracy_at_clock_rho{rho:g}",
                "?",
                "secondary",
                note="simulated generation time, slowest response per round",
            )
            for rho in RHOS
        ),
        Contrast(
            f"{policy} after drift: accuracy on the drifted prompts",
            "drift_ds",
            f"drift_{policy}",
            "drifted_accuracy_final",
            "-",
            "secondary",
            note="prompts set aside as solved become informative again at step 25",
        ),
    )


EXPERIMENT = Experiment(
    name="prompt_selection",
    title="Prompt selection before generation vs dynamic sampling alone",
    paper="beyond the paper: GRESO (arXiv 2506.02177), open-instruct's retire-when-solved, prime-rl's "
    "difficulty pools; Section 3.2's dynamic sampling is the baseline",
    task="prompt_pool",
    steps=STEPS,
    arms=_arms(),
    labels=_labels(),
    summaries={
        "tokens_per_informative": Summary(
            per_informative("sampling/generated_tokens"), "tokens generated per informative group"
        ),
        "groups_per_informative": Summary(
            per_informative("sampling/generated_groups"), "groups generated per informative group"
        ),
        "accuracy_at_equal_tokens": Summary(
            at_budget("toy/expected_accuracy", "cost/tokens_total", BUDGET),
            f"exact expected accuracy once {int(BUDGET)} tokens have been generated",
        ),
        "accuracy_final": Summary(
            final("toy/expected_accuracy", last=5), f"exact expected accuracy, last 5 of {STEPS} steps"
        ),
        "drifted_accuracy_final": Summary(
            final("toy/expected_accuracy_drifted", last=5),
            "exact expected accuracy on the drifted prompts, last 5 steps",
        ),
        "skipped_per_step": Summary(
            lambda log: sum(m.get("sampling/skipped_prompts", 0.0) for m in log) / len(log),
            "prompts skipped before generation per step",
        ),
        **{
            f"accuracy_at_clock_rho{rho:g}": Summary(
                accuracy_at_clock(rho),
                f"exact expected accuracy at simulated time {clock_budget(rho):g} (rho = {rho:g}, tail1)",
            )
            for rho in RHOS
        },
    },
    contrasts=(
        *_versus_ds("greso"),
        *_versus_ds("retire"),
        *_versus_ds("pools"),
        Contrast(
            "dynamic sampling alone: tokens per informative group vs no filtering",
            "no_filter",
            "ds",
            "tokens_per_informative",
            "?",
            "secondary",
            note="without DS uninformative groups are trained on, not regenerated",
        ),
        Contrast(
            "dynamic sampling alone: accuracy at equal generated tokens vs no filtering",
            "no_filter",
            "ds",
            "accuracy_at_equal_tokens",
            "?",
            "secondary",
        ),
    ),
    curves=(
        "toy/expected_accuracy",
        "toy/expected_accuracy@cost/tokens_total",
        "sampling/generated_groups",
        "sampling/skipped_prompts",
    ),
)
