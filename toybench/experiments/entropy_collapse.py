"""Experiment 1: entropy collapse under symmetric clipping, and Clip-Higher (Section 3.1,
Figure 2b; Figure 3a for the probability of up-clipped tokens).

Design. On :func:`toybench.tasks.entropy_task` rewards are noisy (common paths right half
the time) and one rare path is better. Several updates per rollout (4 epochs over the
batch) let the ratio leave [1 - eps, 1 + eps]; the upper bound then stops
low-probability tokens with positive advantage from growing while high-probability ones
keep sharpening, so entropy falls. Raising eps_high to 0.28 relaxes exactly that bound.

Negative control: one update per rollout. The ratio is exactly 1 at the only update, the
clip never acts, and the two arms run the same computation.

Boundary (reported): with the paper's geometry (4 mini-batches, 1 epoch) on this small
task a prompt rarely recurs across the windows of one rollout, the ratio barely moves and
the effect shrinks; and at low learning rates it vanishes (the prototypes saw symmetric
and no-clip become equal when the step size changes).
"""

from dapo import AlgoConfig

from ..experiment import Arm, Contrast, Experiment, Summary, change, final, mean_over_run

BASE = AlgoConfig(
    group_size=8,
    train_groups=16,
    mini_batch_groups=16,
    ppo_epochs=4,
    eps_low=0.2,
    eps_high=0.2,
    loss_agg="token-mean",
    overlong_filter=False,
    soft_overlong=False,
    dynamic_sampling=False,
    expected_len=6,
    cache_len=2,
    max_grad_norm=None,
)
LR = 50.0

EXPERIMENT = Experiment(
    name="entropy_collapse",
    title="Entropy collapse: symmetric clip (0.2/0.2) vs Clip-Higher (0.2/0.28)",
    paper="Section 3.1, Figure 2b (entropy), Figure 3a (up-clipped tokens have low probability)",
    task="entropy",
    steps=120,
    arms={
        "symmetric": Arm(BASE, LR),
        "clip_higher": Arm(BASE.replace(eps_high=0.28), LR),
        "symmetric_1upd": Arm(BASE.replace(ppo_epochs=1), LR),
        "clip_higher_1upd": Arm(BASE.replace(ppo_epochs=1, eps_high=0.28), LR),
        "symmetric_minibatch": Arm(BASE.replace(ppo_epochs=1, mini_batch_groups=4), LR),
        "clip_higher_minibatch": Arm(BASE.replace(ppo_epochs=1, mini_batch_groups=4, eps_high=0.28), LR),
    },
    labels={
        "symmetric": "symmetric clip (eps 0.2)",
        "clip_higher": "Clip-Higher (eps_high 0.28)",
        "symmetric_1upd": "symmetric, 1 update per rollout (control)",
        "clip_higher_1upd": "Clip-Higher, 1 update per rollout (control)",
        "symmetric_minibatch": "symmetric, 4 mini-batches x 1 epoch",
        "clip_higher_minibatch": "Clip-Higher, 4 mini-batches x 1 epoch",
    },
    summaries={
        "entropy_final": Summary(final("actor/entropy"), "mean token entropy over the last 10 steps"),
        "entropy_change": Summary(change("actor/entropy"), "entropy change, last 10 minus first 10 steps"),
        "best_path_prob": Summary(
            final("toy/best_path_prob"), "probability of the rare better path, last 10 steps"
        ),
        "upclip_old_prob": Summary(
            mean_over_run("actor/upclip_old_prob"), "mean old probability of up-clipped tokens"
        ),
        "mean_prob": Summary(mean_over_run("actor/mean_prob"), "mean probability of sampled tokens"),
        "clipfrac_upper": Summary(mean_over_run("actor/clipfrac_upper"), "fraction of tokens up-clipped"),
        "accuracy_final": Summary(final("toy/expected_accuracy"), "exact expected accuracy, last 10 steps"),
    },
    contrasts=(
        Contrast("Clip-Higher keeps entropy up", "symmetric", "clip_higher", "entropy_final", "+"),
        Contrast(
            "Clip-Higher finds the rare better path more",
            "symmetric",
            "clip_higher",
            "best_path_prob",
            "+",
            role="secondary",
        ),
        Contrast(
            "up-clipped tokens have low probability (Fig. 3a)",
            "symmetric",
            "symmetric",
            "mean_prob",
            "-",
            role="secondary",
            summary_b="upclip_old_prob",
            note="b - a = mean old prob of up-clipped tokens - mean prob of all sampled tokens",
        ),
        Contrast(
            "control: one update per rollout, clip cannot act",
            "symmetric_1upd",
            "clip_higher_1upd",
            "entropy_final",
            "0",
            role="control",
        ),
        Contrast(
            "boundary: paper's geometry (4 mini-batches x 1 epoch) on this small task",
            "symmetric_minibatch",
            "clip_higher_minibatch",
            "entropy_final",
            "?",
            role="secondary",
        ),
    ),
    curves=("actor/entropy", "toy/best_path_prob", "actor/clipfrac_upper"),
)
