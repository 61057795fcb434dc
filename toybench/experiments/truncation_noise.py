"""Experiment 4: reward noise from truncated responses (Section 3.4, Figure 5).

Design. :func:`toybench.tasks.truncation_task` has prompts whose good path needs 8 work
tokens, close to the 12-token ceiling, and a base model that rambles (truncation is
common at first). Scoring a truncated response as wrong (-1) punishes the sound work in
it, including the early "keep going" decisions every right answer needs; overlong
filtering drops truncated responses from the loss instead; soft overlong punishment
(Eq. 13) adds a length ramp on top of filtering.

Primary metric: accuracy averaged over the run (the learning curve, as in Fig. 5a),
because the effect lives where truncation is common. At the end of the horizon filtering
is *behind* -1 punishment: once truncated responses carry no loss nothing pushes the
policy away from the ceiling and a few percent of responses stay truncated.

The soft punishment, and how filtered responses enter the group statistics
(``AlgoConfig.filtered_group_stats``). With overlong filtering a truncated response
carries no loss, but by default (``shaped``, what verl and TRL do) it still enters its
group's reward mean and std with its shaped reward, -1 - 1 = -2 under the soft ramp. That
pulls the group mean down and raises the advantage of every response that terminated,
short wrong answers included. The arms separate the two mechanisms: the same ramps with
truncated responses spared the penalty in the statistics (``unpenalized``: -1) or left
out of them (``excluded``), and filtering alone with truncated responses excluded.
"""

from dapo import AlgoConfig

from ..experiment import Arm, Contrast, Experiment, Summary, final, mean_over_run

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
    expected_len=10,
    cache_len=2,
    max_grad_norm=None,
)
LR = 20.0
SOFT = BASE.replace(overlong_filter=True, soft_overlong=True)

EXPERIMENT = Experiment(
    name="truncation_noise",
    title="Truncation noise: -1 for truncated vs overlong filtering vs soft overlong punishment",
    paper="Section 3.4, Figure 5 (overlong filtering stabilises training and improves accuracy)",
    task="truncation",
    steps=150,
    arms={
        "punish": Arm(BASE, LR),
        "filter": Arm(BASE.replace(overlong_filter=True), LR),
        "soft": Arm(BASE.replace(overlong_filter=True, soft_overlong=True), LR),
        "soft_overlap": Arm(
            BASE.replace(overlong_filter=True, soft_overlong=True, expected_len=5, cache_len=7), LR
        ),
        "soft_unpenalized": Arm(SOFT.replace(filtered_group_stats="unpenalized"), LR),
        "soft_excluded": Arm(SOFT.replace(filtered_group_stats="excluded"), LR),
        "soft_overlap_unpenalized": Arm(
            SOFT.replace(expected_len=5, cache_len=7, filtered_group_stats="unpenalized"), LR
        ),
        "filter_excluded": Arm(BASE.replace(overlong_filter=True, filtered_group_stats="excluded"), LR),
    },
    labels={
        "punish": "-1 for truncation",
        "filter": "overlong filtering",
        "soft": "filtering + soft punishment",
        "soft_overlap": "soft punishment, ramp overlapping useful lengths",
        "soft_unpenalized": "soft, truncated spared in group stats",
        "soft_excluded": "soft, truncated left out of group stats",
        "soft_overlap_unpenalized": "overlapping ramp, truncated spared in group stats",
        "filter_excluded": "filtering, truncated left out of group stats",
    },
    summaries={
        "accuracy_mean": Summary(
            mean_over_run("toy/expected_accuracy"), "exact expected accuracy averaged over the run"
        ),
        "accuracy_long_mean": Summary(
            mean_over_run("toy/expected_accuracy_long"), "same, on the prompts that need long reasoning"
        ),
        "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
        "truncation_final": Summary(final("rollout/truncation_rate"), "truncation rate, last 10 steps"),
        "truncation_mean": Summary(
            mean_over_run("rollout/truncation_rate"), "truncation rate averaged over the run"
        ),
        "on_track_share": Summary(
            mean_over_run("toy/truncated_on_track"), "share of truncated responses on a sound path"
        ),
        "length_final": Summary(final("rollout/length_mean"), "mean length, last 10 steps"),
    },
    contrasts=(
        Contrast(
            "overlong filtering learns faster than -1 for truncation",
            "punish",
            "filter",
            "accuracy_mean",
            "+",
        ),
        Contrast(
            "... and on the long-reasoning prompts",
            "punish",
            "filter",
            "accuracy_long_mean",
            "+",
            role="secondary",
        ),
        Contrast(
            "final accuracy: filtering vs -1",
            "punish",
            "filter",
            "accuracy_final",
            "+",
            role="secondary",
            note="calibration showed the reverse at the horizon: no loss on truncation, no push away from it",
        ),
        Contrast(
            "final truncation rate: filtering vs -1",
            "punish",
            "filter",
            "truncation_final",
            "?",
            role="secondary",
        ),
        Contrast(
            "soft punishment on top of filtering",
            "filter",
            "soft",
            "accuracy_mean",
            "+",
            role="secondary",
            note="truncated responses enter the group statistics at -2 (filtered_group_stats=shaped)",
        ),
        Contrast(
            "boundary: a ramp overlapping the useful length hurts",
            "filter",
            "soft_overlap",
            "accuracy_mean",
            "-",
            role="secondary",
            note="ramp 5..12 covers every useful length; shaped statistics",
        ),
        Contrast(
            "soft punishment, truncated spared the penalty in group stats",
            "filter",
            "soft_unpenalized",
            "accuracy_mean",
            "+",
            role="secondary",
            note="filtered_group_stats=unpenalized: truncated at -1",
        ),
        Contrast(
            "soft punishment, truncated left out of group stats",
            "filter",
            "soft_excluded",
            "accuracy_mean",
            "+",
            role="secondary",
            note="filtered_group_stats=excluded",
        ),
        Contrast(
            "overlapping ramp, truncated spared the penalty in group stats",
            "filter",
            "soft_overlap_unpenalized",
            "accuracy_mean",
            "?",
            role="secondary",
        ),
        Contrast(
            "the interaction: sparing truncated responses the penalty (same ramp)",
            "soft",
            "soft_unpenalized",
            "accuracy_mean",
            "?",
            role="secondary",
            note="shaped (-2) vs unpenalized (-1) statistics",
        ),
        Contrast(
            "filtering alone: truncated left out of group stats",
            "filter",
            "filter_excluded",
            "accuracy_mean",
            "?",
            role="secondary",
            note="no ramp: excluded vs shaped (-1) statistics",
        ),
    ),
    curves=("toy/expected_accuracy", "rollout/truncation_rate", "rollout/length_mean"),
)
