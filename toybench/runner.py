"""Train a toy policy with the shared DAPO core: batched rollouts -> RolloutBatch ->
dynamic sampling -> ``dapo.update``. One call, one seed, one list of per-step metrics."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dapo import AlgoConfig, DynamicSampler, RolloutBatch, SamplingWarning, config_reward, update
from dapo.prompt_selection import PromptSelection, parse_spec, select
from dapo.registry import resolve as resolve_loss

from .optim import make as make_optimizer
from .policies import POLICIES, TabularPolicy, ToyPolicy, sample_table, table_cdf, table_logp_entropy
from .tasks import TASKS, TokenTask, episode_end, verify


@dataclass(frozen=True)
class RunSpec:
    """Everything one toy training run depends on."""

    task: str
    """A key of :data:`toybench.tasks.TASKS`."""
    cfg: AlgoConfig
    """The algorithm; ``expected_len + cache_len`` must equal the task's ``max_len``."""
    steps: int
    """Training steps (rollout batches)."""
    lr: float
    """Learning rate of the policy's optimizer (SGD for tabular, Adam for GRU)."""
    optimizer: str = "sgd"
    """The tabular policy's optimizer (:data:`toybench.optim.OPTIMIZERS`): ``sgd``, or
    ``scale_free`` (:class:`toybench.optim.ScaleFreeSGD`, whose step a constant factor on the
    loss does not change; ``dapo toy check``). The GRU policy is always trained with Adam."""
    seed: int = 0
    """Seeds the policy's initial noise and every rollout (paired arms share it)."""
    policy: str = "tabular"
    """``tabular`` or ``gru``."""
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments of the task factory (e.g. a different ``max_len``)."""
    init_noise: float = 0.5
    """Std of the tabular policy's per-seed logit noise around the task prior."""
    engine_noise: float = 0.0
    """Fault injection for health checks: the std of Gaussian noise on the log-probs a
    simulated rollout engine reports (``rollout_logp``); 0 reports none."""
    engine_noise_from: int = 0
    """The step the engine noise starts at (a fault that appears late); before it the engine
    reports log-probs exact to 1e-7."""
    lr_boost: float = 1.0
    """Fault injection for health checks: the learning rate is multiplied by this from step
    ``lr_boost_from`` on (a run made to collapse late, at a known step); 1 changes nothing."""
    lr_boost_from: int = 0
    """The step the learning-rate fault starts at."""
    nan_steps: tuple[int, ...] = ()
    """Fault injection for health checks: steps whose new log-probs are NaN (a numerical
    fault the update must skip)."""
    loss: str = "dapo"
    """The policy loss, a spec of :func:`dapo.registry.resolve` (``dapo`` is
    :func:`dapo.loss.policy_loss`; the clip and aggregation knobs still come from ``cfg``)."""
    staleness: int = 0
    """Off-policy rollouts: step s generates with the policy version ``max(s - staleness, 0)``
    (a version is the weights after a training step, as peers count it: verl's
    ``staleness_threshold``, AReaL's ``max_head_offpolicyness``), and every token keeps the
    log-prob of the version that sampled it (``rollout_logp``); the trainer recomputes
    ``old_logp`` with the current weights, and ``cfg``'s correction (``dapo.offpolicy``)
    applies through ``dapo.update``. 0 is on-policy, bit for bit the same run. Tabular
    policy only."""
    staleness_from: int = 0
    """The step the staleness starts at (a fault that appears late, for the health checks);
    before it the run is on-policy."""
    partial: bool = False
    """Partial rollouts: a weight update interrupts each response at a cut drawn uniformly
    from positions 0..T (its own stream per seed, step and round): tokens before the cut
    come from version ``s - staleness - 1``, the rest from ``s - staleness``."""
    selection: str | None = None
    """Prompt selection before generation (a spec of ``AlgoConfig.prompt_selection``: ``none``,
    ``greso``, ``retire``, ``pools``, options after a colon): prompts come from a stream (each epoch a
    seeded permutation, as a data loader's) and the policy decides which to generate; a round
    holds ``train_groups`` prompts (after one pass of offers, the stream's next ones are taken
    undecided, as ``scale.generator.role`` does). None:
    prompts drawn uniformly with replacement (every other experiment)."""
    drift_at: int | None = None
    """From this step on the task is its ``drifted=True`` variant (``prompt_pool``): prompts
    whose requirement changed become informative again."""
    mismatch: str | None = None
    """Engine precision: the engine's logits are rounded to ``bf16`` or ``fp8`` (e4m3)
    before its softmax, for sampling and for the log-probs it reports; the trainer computes
    in float64 (the gap of a bf16 engine against an fp32 trainer). None: exact."""

    @property
    def off_policy(self) -> bool:
        """Whether the rollouts come from anything but the trainer's current weights."""
        return self.staleness > 0 or self.partial or self.mismatch is not None


PRECISIONS = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
"""The engine precisions ``RunSpec.mismatch`` can simulate."""


def engine_precision(table: Tensor, precision: str) -> Tensor:
    """The logits as an engine in ``precision`` holds them: rounded to that format (round
    to nearest even; fp8 e4m3 saturates at +-448) and back to float64."""
    if precision not in PRECISIONS:
        raise ValueError(f"mismatch must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return table.to(PRECISIONS[precision]).to(torch.float64)


def partial_cuts(seed: int, step: int, rnd: int, n: int, t: int) -> Tensor:
    """Where a weight update interrupts each of ``n`` responses (positions 0..t; 0: none of
    it came from the older version), from a stream of its own per (seed, step, round) so
    that partial rollouts change no other draw of the run."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rnd + 991)
    return torch.randint(0, t + 1, (n,), generator=gen)


def make_task(spec: RunSpec) -> TokenTask:
    if spec.task not in TASKS:
        raise ValueError(f"unknown task {spec.task!r}; known: {sorted(TASKS)}")
    return TASKS[spec.task](**spec.task_kwargs)


def make_policy(spec: RunSpec, task: TokenTask, generator: torch.Generator) -> ToyPolicy:
    if spec.policy == "tabular":
        return TabularPolicy(task, generator, init_noise=spec.init_noise)
    if spec.policy in POLICIES:
        return POLICIES[spec.policy](task, generator)
    raise ValueError(f"unknown policy {spec.policy!r}; known: {sorted(POLICIES)}")


@dataclass(frozen=True)
class EngineWeights:
    """What an off-policy engine samples one step's rounds with: the tables of version
    ``step - lag`` (``new``) and, for partial rollouts, ``step - lag - 1`` (``old``), each in
    the engine's precision."""

    new: Tensor
    old: Tensor
    partial: bool
    seed: int
    step: int


def engine_sample(
    weights: EngineWeights, prompts: Tensor, generator: torch.Generator, rnd: int, t: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens [b, t] sampled by the engine's weights, with the uniforms ``TabularPolicy.sample``
    draws; with partial rollouts each response is cut where a weight update interrupted it
    (:func:`partial_cuts`): the same uniforms through the older version before the cut, the
    newer after it. Returns the tokens, the cuts [b] and each token's behaviour log-prob."""
    b = prompts.shape[0]
    u_first = torch.rand(b, generator=generator, dtype=torch.float64)
    u_rest = torch.rand((b, t - 1), generator=generator, dtype=torch.float64)
    cdf = table_cdf(weights.new)
    tokens = sample_table(cdf, prompts, u_first, u_rest)
    cut = torch.zeros(b, dtype=torch.long)
    if weights.partial:
        cut = partial_cuts(weights.seed, weights.step, rnd, b, t)
        first = sample_table(table_cdf(weights.old), prompts, u_first, u_rest)
        later = sample_table(cdf, prompts, None, u_rest, first=first[:, 0])
        before = torch.arange(t).unsqueeze(0) < cut.unsqueeze(1)
        tokens = torch.where((cut > 0).unsqueeze(1), torch.where(before, first, later), tokens)
    logp, _ = table_logp_entropy(weights.new, prompts, tokens, entropy=False)
    if weights.partial:
        lp_old, _ = table_logp_entropy(weights.old, prompts, tokens, entropy=False)
        logp = torch.where(before, lp_old, logp)
    return tokens, cut, logp


def rollout_round(
    policy: ToyPolicy,
    task: TokenTask,
    cfg: AlgoConfig,
    n_groups: int,
    generator: torch.Generator,
    chosen: list[int] | None = None,
    engine: EngineWeights | None = None,
    rnd: int = 0,
) -> RolloutBatch:
    """Sample ``n_groups`` prompts (uniformly, with replacement; or the ``chosen`` ones) x G
    responses each, by the policy or, off-policy, by the ``engine``'s weights (round ``rnd``
    of the step), each token then carrying its sampler's log-prob (``rollout_logp``)."""
    g = cfg.group_size
    if chosen is None:
        picked = torch.randint(task.num_prompts, (n_groups,), generator=generator)
    else:
        picked = torch.tensor(chosen, dtype=torch.long)
    prompts = picked.repeat_interleave(g)
    extras: dict[str, Tensor] = {}
    rollout_logp = None
    if engine is None:
        tokens = policy.sample(prompts, generator)
    else:
        tokens, extras["cut"], rollout_logp = engine_sample(engine, prompts, generator, rnd, task.max_len)
    lengths, truncated = episode_end(tokens, task.max_len)
    u = torch.rand(prompts.shape[0], generator=generator, dtype=torch.float64)
    out = verify(task, prompts, tokens, lengths, truncated, u)
    mask = torch.arange(task.max_len).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        old_logp, _ = policy.logp_entropy(prompts, tokens)
    old_logp = torch.where(mask, old_logp, torch.zeros_like(old_logp))
    if rollout_logp is not None:
        rollout_logp = torch.where(mask, rollout_logp, torch.zeros_like(rollout_logp))
    return RolloutBatch(
        old_logp=old_logp,
        rollout_logp=rollout_logp,
        mask=mask,
        lengths=lengths,
        truncated=truncated,
        correct=out.correct,
        rewards=config_reward(out.correct, lengths, cfg).to(torch.float64),
        group_ids=prompts,
        group_size=g,
        extras={"prompts": prompts, "tokens": tokens, "on_track": out.on_track, "path": out.path, **extras},
    )


SIM_TAILS: dict[str, tuple[float, str]] = {
    "tail0": (0.0, "max"),
    "tail1": (1.0, "max"),
    "tail1_mean": (1.0, "mean"),
}
"""The generation-time model (reported, never trained on). Responses of a round decode in
lockstep, so a round takes as long as its slowest response: ``max_i L_i * m_i`` token
times, where L_i is the response's length and ``m_i = exp(sigma * z_i)``, z_i ~ N(0, 1),
a per-response slowdown (a long tail of slow or long generations: sigma 0 is none, sigma 1
a heavy one). ``tail1_mean`` is the mean instead of the max: a generator that never waits
for its slowest response (partial rollouts: interrupted responses continue later), the
work-conserving limit. The z_i come from their own stream per (seed, step, round), so the
model never changes a run. Metrics: ``toy/gen_time_<clock>`` per step (all rounds) and
``cost/gen_time_<clock>_total``."""


def round_times(lengths: torch.Tensor, seeds: list[int], step: int, rnd: int) -> dict[str, torch.Tensor]:
    """Simulated time of one round per run: ``lengths`` [n, b] (run i with ``seeds[i]``)."""
    z = torch.stack(
        [
            torch.randn(
                lengths.shape[1],
                dtype=torch.float64,
                generator=torch.Generator().manual_seed((s * 1_000_003 + step) * 1_009 + rnd + 77),
            )
            for s in seeds
        ]
    )
    length = lengths.to(torch.float64)
    out = {}
    for name, (sigma, reduce) in SIM_TAILS.items():
        t = length * torch.exp(sigma * z)
        out[name] = t.amax(1) if reduce == "max" else t.mean(1)
    return out


def _best_paths(task: TokenTask) -> torch.Tensor:
    feasible = (task.need_work + 2 <= task.max_len).to(task.quality.dtype)
    return (task.quality * feasible).argmax(dim=1) + 1  # token id of the best path


def prompt_stream(n: int, seed: int) -> Iterator[int]:
    """Prompt indices, epoch after epoch, each epoch a permutation of ``range(n)`` from its own
    generator (the training stream never perturbs the run's sampling stream)."""
    gen = torch.Generator().manual_seed(seed * 7_919 + 104_729)
    while True:
        yield from torch.randperm(n, generator=gen).tolist()


def _drift(spec: RunSpec) -> tuple[TokenTask, torch.Tensor] | None:
    """The drifted task and the prompts whose requirement changed (None without drift)."""
    if spec.drift_at is None:
        return None
    before = make_task(spec)
    after = TASKS[spec.task](**{**spec.task_kwargs, "drifted": True})
    changed = ((after.need_work != before.need_work) | (after.quality != before.quality)).any(1)
    return after, changed


def train(spec: RunSpec) -> list[dict[str, float]]:
    """Run ``spec`` and return one metrics dict per step (the ``dapo.metrics`` schema plus
    ``toy/*`` and cumulative cost counters)."""
    task = make_task(spec)
    cfg = spec.cfg
    if spec.off_policy and (spec.policy != "tabular" or spec.engine_noise > 0):
        raise ValueError(
            "staleness, partial and mismatch need the tabular policy, without injected engine noise "
            "(the engine's log-probs are the stale version's)"
        )
    if cfg.max_len != task.max_len:
        raise ValueError(
            f"cfg.expected_len + cfg.cache_len = {cfg.max_len} must equal the task's max_len {task.max_len}"
        )
    torch.manual_seed(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed)
    policy = make_policy(spec, task, gen)
    if spec.optimizer != "sgd" and spec.policy != "tabular":
        raise ValueError(f"optimizer {spec.optimizer!r} needs the tabular policy (the GRU trains with Adam)")
    if spec.optimizer == "sgd":
        optimizer = policy.make_optimizer(spec.lr)
    else:
        optimizer = make_optimizer(spec.optimizer, policy.parameters(), spec.lr)
    loss_fn = resolve_loss(spec.loss).fn
    all_prompts = torch.arange(task.num_prompts)
    best = _best_paths(task)

    def logp_fn(mb: RolloutBatch):
        logp, ent = policy.logp_entropy(mb.extras["prompts"], mb.extras["tokens"])
        return (logp * float("nan") if step in spec.nan_steps else logp), ent

    log: list[dict[str, float]] = []
    totals = {"responses": 0.0, "tokens": 0.0, "opt_steps": 0.0, **dict.fromkeys(SIM_TAILS, 0.0)}
    selection = PromptSelection(parse_spec(spec.selection), seed=spec.seed) if spec.selection else None
    stream = prompt_stream(task.num_prompts, spec.seed)
    drift = _drift(spec)
    versions: dict[int, Tensor] = {}  # off-policy: the weights before each step
    for step in range(spec.steps):
        if drift is not None and step == spec.drift_at:
            task = policy.task = drift[0]
        engine = _engine_weights(spec, policy, versions, step) if spec.off_policy else None
        sampler = DynamicSampler.for_config(cfg)
        truncated = on_track = 0
        gen_time = dict.fromkeys(SIM_TAILS, 0.0)
        while not sampler.done:
            chosen = None
            if selection is not None:  # as the trainer: one pass of offers, then fill the round
                chosen, _ = select(selection, stream, cfg.train_groups, step, task.num_prompts, fill=True)
            rb = rollout_round(policy, task, cfg, cfg.train_groups, gen, chosen, engine, sampler.rounds)
            if selection is not None and chosen is not None:
                n_correct = rb.correct.view(-1, cfg.group_size).sum(1).tolist()
                selection.observe(chosen, n_correct, cfg.group_size, step)
            truncated += int(rb.truncated.sum())
            on_track += int(rb.extras["on_track"].sum())
            for name, t in round_times(rb.lengths.view(1, -1), [spec.seed], step, sampler.rounds).items():
                gen_time[name] += float(t[0])
            sampler.add(rb)
        m: dict[str, float] = {"step": float(step)}
        with torch.no_grad():
            m.update(_policy_metrics(policy, all_prompts, best, step))
            if drift is not None and isinstance(policy, TabularPolicy):
                m["toy/expected_accuracy_drifted"] = float(policy.exact_accuracy()[drift[1]].mean())
        if selection is not None:
            m.update(selection.end_step())
        with warnings.catch_warnings():  # recorded as sampling/underfilled instead
            warnings.simplefilter("ignore", SamplingWarning)
            batch = sampler.take()
        if batch is not None and spec.engine_noise > 0:
            std = spec.engine_noise if step >= spec.engine_noise_from else min(spec.engine_noise, 1e-7)
            noisy = batch.old_logp + std * torch.randn(
                batch.old_logp.shape, generator=gen, dtype=batch.old_logp.dtype
            )
            batch = RolloutBatch(
                **{
                    **batch.__dict__,
                    "rollout_logp": torch.where(batch.mask, noisy.clamp(max=0.0), torch.zeros_like(noisy)),
                }
            )
        m.update(sampler.metrics())
        if engine is not None:
            m["toy/staleness"] = _staleness(spec, step, batch)
        if spec.lr_boost != 1.0 and step == spec.lr_boost_from:
            for group in optimizer.param_groups:
                group["lr"] = spec.lr * spec.lr_boost
        m.update(update(batch, logp_fn, optimizer, cfg, loss_fn=loss_fn))
        totals["responses"] += m["sampling/generated_groups"] * cfg.group_size
        totals["tokens"] += m["sampling/generated_tokens"]
        totals["opt_steps"] += m["actor/optimizer_steps"]
        m["toy/truncated_on_track"] = on_track / truncated if truncated else float("nan")
        m["cost/responses_total"] = totals["responses"]
        m["cost/tokens_total"] = totals["tokens"]
        m["cost/optimizer_steps_total"] = totals["opt_steps"]
        for name in SIM_TAILS:
            totals[name] += gen_time[name]
            m[f"toy/gen_time_{name}"] = gen_time[name]
            m[f"cost/gen_time_{name}_total"] = totals[name]
        log.append(m)
    return log


def _lag(spec: RunSpec, step: int) -> int:
    return spec.staleness if step >= spec.staleness_from else 0


def _engine_weights(
    spec: RunSpec, policy: ToyPolicy, versions: dict[int, Tensor], step: int
) -> EngineWeights:
    """This step's engine: the version ``step - k`` (and ``step - k - 1`` for partial
    rollouts), clamped at version 0, in the engine's precision."""
    assert isinstance(policy, TabularPolicy)
    versions[step] = policy.table.detach().clone()
    for v in [v for v in versions if v < step - spec.staleness - 1]:
        del versions[v]
    lag = _lag(spec, step)
    new = versions[max(step - lag, 0)]
    old = versions[max(step - lag - 1, 0)] if spec.partial else new
    if spec.mismatch is not None:
        new, old = engine_precision(new, spec.mismatch), engine_precision(old, spec.mismatch)
    return EngineWeights(new, old, spec.partial, spec.seed, step)


def _staleness(spec: RunSpec, step: int, batch: RolloutBatch | None) -> float:
    """``toy/staleness``: the mean policy-version lag of the batch's response tokens."""
    if batch is None or not bool(batch.mask.any()):
        return float("nan")
    k = min(_lag(spec, step), step)
    k_old = min(_lag(spec, step) + 1, step) if spec.partial else k
    pos = torch.arange(batch.mask.shape[-1])
    lag = torch.where(pos < batch.extras["cut"].unsqueeze(-1), float(k_old), float(k))
    return float(lag[batch.mask].sum() / batch.mask.sum())


def _long_prompts(task: TokenTask) -> torch.Tensor:
    """Prompts whose best path needs at least half the ceiling in work tokens."""
    best = _best_paths(task) - 1
    need = task.need_work.gather(1, best.unsqueeze(1)).squeeze(1)
    return need * 2 >= task.max_len


def _policy_metrics(
    policy: ToyPolicy, prompts: torch.Tensor, best: torch.Tensor, step: int
) -> dict[str, float]:
    """Properties of the policy *before* this step's update: exact for the tabular policy,
    Monte Carlo estimates (``MC_SAMPLES`` per prompt, a fixed generator per step) otherwise."""
    task = policy.task
    first = policy.first_token_probs(prompts)
    out = {"toy/best_path_prob": float(first.gather(1, best.unsqueeze(1)).mean())}
    q = task.quality
    if isinstance(policy, TabularPolicy):
        acc = policy.exact_accuracy()
        lengths = policy.exact_lengths()
    else:
        acc, lengths = _monte_carlo(policy, task, torch.Generator().manual_seed(10_000 + step))
    out["toy/expected_accuracy"] = float(acc.mean())
    out["toy/length_best_path"] = float(lengths.gather(1, q.argmax(1, keepdim=True)).mean())
    out["toy/length_worst_path"] = float(lengths.gather(1, q.argmin(1, keepdim=True)).mean())
    long = _long_prompts(task)
    if bool(long.any()):
        out["toy/expected_accuracy_long"] = float(acc[long].mean())
    return out


MC_SAMPLES = 32


def _monte_carlo(
    policy: ToyPolicy, task: TokenTask, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accuracy per prompt [P] and length per (prompt, path) [P, K] by sampling."""
    p, k, n = task.num_prompts, task.num_paths, MC_SAMPLES
    prompts = torch.arange(p).repeat_interleave(n)
    tokens = policy.sample(prompts, gen)
    lengths, truncated = episode_end(tokens, task.max_len)
    u = torch.rand(prompts.shape[0], generator=gen, dtype=torch.float64)
    acc = verify(task, prompts, tokens, lengths, truncated, u).correct.double().view(p, n).mean(1)
    forced_prompts = torch.arange(p).repeat_interleave(k * n)
    forced_first = (torch.arange(k) + 1).repeat_interleave(n).repeat(p)
    forced = policy.sample(forced_prompts, gen, first=forced_first)
    forced_len, _ = episode_end(forced, task.max_len)
    return acc, forced_len.double().view(p, k, n).mean(-1)
