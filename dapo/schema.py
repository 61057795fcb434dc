"""The metric schema shared by the toy regime, the scale trainer and ``dapo.health``: every
name to its meaning. One flat ``dict[str, float]`` per training step, written as a JSONL
line; fractions are in [0, 1]; NaN means "not defined this step". Free of torch, so that
reading a log (``dapo diagnose``) does not load it; the producers are in
:mod:`dapo.metrics`."""

from __future__ import annotations

SCHEMA: dict[str, str] = {
    "step": "training step (one rollout batch = one step; optimizer steps are counted apart)",
    # rollout: over every response generated this step, before dynamic-sampling filtering
    "rollout/accuracy": "fraction of responses whose answer is correct (Eq. 7)",
    "rollout/reward_mean": "mean shaped reward (Eq. 7 + Eq. 13 penalty)",
    "rollout/groups_all_correct": "fraction of groups with accuracy 1 (zero gradient; Fig. 3b)",
    "rollout/groups_all_wrong": "fraction of groups with accuracy 0 (zero gradient)",
    "rollout/length_mean": "mean response length in tokens (Fig. 7a)",
    "rollout/length_max": "longest response length in tokens",
    "rollout/length_correct_mean": "mean length of correct responses (NaN if none)",
    "rollout/length_wrong_mean": "mean length of incorrect responses (NaN if none)",
    "rollout/truncation_rate": "fraction of responses that hit the generation ceiling without EOS",
    # dynamic sampling cost
    "sampling/rounds": "generation rounds this step",
    "sampling/generated_groups": "groups generated this step, all rounds",
    "sampling/generated_tokens": "response tokens generated this step, all rounds",
    "sampling/accepted_groups": "groups handed to the update",
    "sampling/rejected_all_correct": "groups dropped because every response was correct",
    "sampling/rejected_all_wrong": "groups dropped because every response was wrong",
    "sampling/surplus_groups": "informative groups generated beyond the batch and dropped",
    "sampling/underfilled": "1 if the round limit was hit before the batch was full, else 0",
    "sampling/tokens_per_accepted_group": "generated tokens / accepted groups",
    "sampling/accept_rate": "informative groups accepted / groups generated (all rounds, all ranks)",
    "sampling/rank_token_imbalance": "largest rank's share of the batch's tokens / the mean share (1: balanced)",
    # prompt selection before generation (algo.prompt_selection, dapo.prompt_selection)
    "sampling/offered_prompts": "prompts the stream offered to the selection this step",
    "sampling/skipped_prompts": "offered prompts skipped before generation (consumed, not generated)",
    "sampling/skipped_easy": "skipped prompts whose last groups were all correct",
    "sampling/skipped_hard": "skipped prompts whose last groups were all wrong",
    "sampling/skipped_retired": "skipped prompts retired as solved",
    "sampling/forced_prompts": "prompts generated undecided to fill a round after a full pass of skips",
    "sampling/retired_prompts": "prompts retired as solved at the end of the step (retire)",
    "sampling/informative_groups": "groups generated this step with 0 < #correct < G (all rounds)",
    "sampling/predicted_informative_rate": "mean P(informative) the history predicted for this step's "
    "groups (prompts seen before; NaN if none)",
    "sampling/realised_informative_rate": "informative groups / groups generated this step",
    "sampling/selection_p_easy": "GRESO's exploration probability for all-correct prompts, after this step",
    "sampling/selection_p_hard": "GRESO's exploration probability for all-wrong prompts, after this step",
    "time/generate_s": "seconds spent generating (all rounds)",
    "time/update_s": "seconds in the update (old log-probs + optimizer steps)",
    "time/sync_s": "seconds syncing weights into the rollout engine",
    "time/step_s": "seconds for the whole training step",
    "memory/update_peak_gib": "peak GPU memory allocated during the update, GiB (the largest rank; GPU runs only)",
    "actor/lr": "learning rate after this step's schedule update",
    # actor: from the update
    "actor/entropy": "mean per-token entropy of the full next-token distribution (Fig. 2b; first PPO epoch, steps taken)",
    "actor/mean_prob": "mean probability of the sampled tokens under the sampling policy (Fig. 7d)",
    "actor/clipfrac_upper": "fraction of loss tokens with A > 0 and ratio > 1 + eps_high (steps taken)",
    "actor/clipfrac_lower": "fraction of loss tokens with A < 0 and ratio < 1 - eps_low (steps taken)",
    "actor/dual_clipfrac": "fraction of loss tokens bounded by the dual clip (steps taken)",
    "actor/upclip_old_prob": "mean old probability of up-clipped tokens (Fig. 3a; NaN if none)",
    "actor/approx_kl": "k3 estimate of KL(pi_old || pi) over loss tokens (steps taken)",
    "actor/loss": "mean policy loss per optimizer step",
    "actor/grad_norm": "mean global gradient norm (before clipping) over optimizer steps",
    "actor/grad_norm_max": "largest gradient norm of the step",
    "actor/optimizer_steps": "optimizer steps taken this training step",
    "actor/skipped_steps": "optimizer steps skipped for a non-finite loss or gradient",
    "actor/empty_windows": "optimizer-step windows with no loss token (all filtered), not stepped",
    "actor/loss_tokens": "tokens carrying loss weight (after overlong filtering)",
    "actor/filtered_responses": "responses given zero weight by overlong filtering",
    # rollout/trainer mismatch
    "mismatch/logp_gap": "mean |old_logp - rollout_logp| over response tokens (engine vs trainer)",
    "mismatch/logp_gap_max": "largest |old_logp - rollout_logp| over response tokens",
    "mismatch/tis_weight_mean": "mean importance weight over response tokens (dapo.offpolicy)",
    "mismatch/tis_capped_frac": "fraction of tokens whose weight hit the cap (TIS) or was zeroed outside the band",
    "mismatch/kl": "mean log mu - log pi_old over response tokens: KL(engine || trainer), k1 (verl `kl`)",
    "mismatch/k3_kl": "mean rho - 1 - log rho over response tokens, rho = pi_old / mu (verl `k3_kl`)",
    "mismatch/chi2_token": "mean rho^2 - 1 over response tokens (verl `chi2_token`)",
    "mismatch/chi2_seq": "mean (prod_t rho_t)^2 - 1 over responses (verl `chi2_seq`)",
    "mismatch/ppl_ratio": "mean over responses of the trainer's perplexity over the engine's (verl `ppl_ratio`)",
    "mismatch/log_ppl_abs_diff": "mean over responses of |log ppl trainer - log ppl engine| (verl `log_ppl_abs_diff`)",
    "mismatch/rejected_frac": "fraction of response tokens removed by rejection (algo.rejection)",
    "mismatch/rejected_seq_frac": "fraction of responses with a token removed by rejection",
    # disaggregated runs (rollout.mode: disaggregated; dapo.pipeline)
    "async/staleness_mean": "mean over the step's response tokens of the versions between their sampler and the learner",
    "async/staleness_max": "largest such staleness (never above rollout.max_staleness)",
    "async/generator_idle_s": "seconds the slowest generator waited for the policy version of this step's batch",
    "async/trainer_idle_s": "seconds the learner waited for this step's batch",
    "async/tokens_in_flight": "response tokens generated for later steps, held by the learner when this step began",
    # read from peers' logs by dapo diagnose (this project does not produce them)
    "actor/ref_kl": "KL to the reference policy (TRL `kl`, verl `actor/kl_loss`; DAPO drops it)",
    "eval/score": "validation score, higher is better (verl `val-core/*/mean@N`, TRL `eval_reward`; this project: eval/avg@k)",
    "rollout/groups_uniform": "fraction of groups whose rewards are all equal (TRL `frac_reward_zero_std`)",
    "rollout/reward_std": "mean within-group standard deviation of the reward (TRL `reward_std`)",
    "rollout/reward_max": "largest reward of the step (verl `critic/score/max`)",
    "rollout/reward_min": "smallest reward of the step (verl `critic/score/min`)",
    "rollout/advantage_abs_max": "largest |advantage| of the step (verl `critic/advantages/max`/`min`); 0: no signal",
    "rollout/advantage_std": "standard deviation of the step's advantages (custom trainers' `Adv Std`); 0: no signal",
    # the trainer's live diagnosis (diagnose.every_steps; dapo.health.callback)
    "health/verdict": "run verdict so far: 0 healthy, 1 warning, 2 failing, 3 inconclusive",
    **{
        f"health/{rule}": f"{rule} rule: -1 unknown, 0 healthy, 1 warning, 2 failing"
        for rule in (
            "entropy_collapse",
            "entropy_explosion",
            "vanishing_signal",
            "not_learning",
            "reward_collapse",
            "validation",
            "length_growth",
            "truncation_noise",
            "rollout_mismatch",
            "off_policy_drift",
            "kl_blowup",
            "gradients",
            "loss_spikes",
        )
    },
}
