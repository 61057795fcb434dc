"""Experiment 3: sample-level vs token-level loss (Section 3.3, Figure 4).

Design. :func:`toybench.tasks.length_task` has one right path per prompt and a reward
that never depends on length. Under sample-level aggregation each response carries the
same total weight, so each of its tokens weighs 1/|o_i|: the stop decision of a short
response is credited or blamed more than that of a long one. On a path whose responses
have positive advantage, stopping early is reinforced most; on a path with negative
advantage, stopping early is punished most. Right paths drift shorter, wrong paths
longer. Under token-mean every token weighs the same and the stop and continue decisions
of a path cancel in expectation.

Primary metric: the exact expected length of the wrong path minus that of the right path
(the tabular policy gives it in closed form), after the horizon.

Overlong filtering is off in both arms: with it on, wrong answers escape their negative
advantage by running into the ceiling (truncated responses get no loss), a drift towards
truncation that both aggregations share and that would mask this one.
"""

from dapo import AlgoConfig

from ..experiment import Arm, Contrast, Experiment, Summary, change, final

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
    expected_len=18,
    cache_len=6,
    max_grad_norm=None,
)
LR = 20.0


def _gap(log):
    tail = log[-10:]
    return sum(m["toy/length_worst_path"] - m["toy/length_best_path"] for m in tail) / len(tail)


EXPERIMENT = Experiment(
    name="length_bias",
    title="Length bias: sample-level (seq-mean-token-mean) vs token-level (token-mean) loss",
    paper="Section 3.3, Figure 4 (length and entropy drift without token-level loss)",
    task="length",
    steps=150,
    arms={
        "token_level": Arm(BASE, LR),
        "sample_level": Arm(BASE.replace(loss_agg="seq-mean-token-mean"), LR),
    },
    labels={"token_level": "token-level loss (DAPO)", "sample_level": "sample-level loss (GRPO)"},
    summaries={
        "length_gap": Summary(_gap, "expected length of the wrong path minus the right path, last 10 steps"),
        "right_path_length": Summary(final("toy/length_best_path"), "expected length on the right path"),
        "wrong_path_length": Summary(final("toy/length_worst_path"), "expected length on a wrong path"),
        "wrong_length": Summary(final("rollout/length_wrong_mean"), "mean length of sampled wrong responses"),
        "right_length": Summary(
            final("rollout/length_correct_mean"), "mean length of sampled right responses"
        ),
        "length_change": Summary(change("rollout/length_mean"), "change in mean sampled length"),
        "entropy_final": Summary(final("actor/entropy"), "mean token entropy, last 10 steps"),
        "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
    },
    contrasts=(
        Contrast(
            "sample-level drives wrong paths longer than right ones",
            "token_level",
            "sample_level",
            "length_gap",
            "+",
        ),
        Contrast(
            "sample-level makes right answers shorter",
            "token_level",
            "sample_level",
            "right_path_length",
            "-",
            role="secondary",
        ),
        Contrast(
            "sample-level makes wrong answers longer",
            "token_level",
            "sample_level",
            "wrong_path_length",
            "+",
            role="secondary",
        ),
        Contrast(
            "sample-level raises entropy (Fig. 4a)",
            "token_level",
            "sample_level",
            "entropy_final",
            "+",
            role="secondary",
            note="in the paper the rise comes from long low-quality responses; here responses shorten instead",
        ),
        Contrast(
            "mean sampled length change (Fig. 4b)",
            "token_level",
            "sample_level",
            "length_change",
            "?",
            role="secondary",
        ),
    ),
    curves=("toy/length_worst_path", "toy/length_best_path", "actor/entropy"),
)
