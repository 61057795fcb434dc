"""The batched toy engine: many tabular runs (seeds, and arms that share a task) trained as
one tensor computation, with the same result as :func:`toybench.runner.train` per run.

A run is a :class:`~toybench.runner.RunSpec`. Runs that share a :func:`batch_key` (task,
horizon, learning rate, batch geometry) are stacked: one softmax table per run,
``W[run, prompt, position, path, token]``, trained by one SGD step per window, while each run
keeps its own ``torch.Generator``. Everything random is drawn per run, in the order and
with the shapes :func:`~toybench.runner.train` draws it, so a run's trajectory does not
depend on which runs share its batch. Everything else (sampling, verification, dynamic
sampling's bookkeeping, advantages, the clipped loss, optimizer steps, metrics) is one
batched computation with the DAPO core's functions over a leading run dimension.

Runs may differ in every ``AlgoConfig`` knob except the batch geometry (``group_size``,
``train_groups``): clip ranges, aggregation, overlong treatment, dynamic sampling,
mini-batch windows and epochs, the off-policy correction; in the policy loss
(``RunSpec.loss``: runs that share a loss and its knobs make one call, over their run
dimension); in staleness, partial rollouts and engine precision; and in prompt selection
(each run keeps its own history and data-loader stream; runs that share a batch share its
``drift_at``). A window a run does not have (fewer epochs or windows)
leaves that run's table exactly as it is: its gradient is zero and SGD adds ``-lr * 0``.

Arithmetic. The gradient each run receives is bit-for-bit the one ``dapo.update`` computes
for it alone (per-token terms are elementwise; a run's rows accumulate into its own slice
of the table in the same order; the rows outside a window contribute exact zeros), so
trajectories (sampled tokens, tables, exact accuracies) are bitwise identical to the
per-run loop. Reported reductions over a run's tokens (loss, clip fractions, grad norm)
may differ from the loop's in the last bits. A loss that is not one of the batched
built-ins is called on exactly its run's window (:meth:`_Members.windows`), never on rows a
batch-mate's window geometry adds, so its trajectory does not depend on its batch either.
Not covered, and run by the per-run loop instead: the GRU policy (its parameters are shared across a batch) and the injected
engine noise of the health checks. ``max_grad_norm`` is honoured per run, but there the
clip factor depends on the grad norm's last bits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo import (
    AlgoConfig,
    config_advantages,
    config_reward,
    masked_mean,
    rollout_stats,
    uniform_groups,
)
from dapo.loss import ClipAgg, window_denominator
from dapo.offpolicy import correct, finish, require_weights
from dapo.prompt_selection import PromptSelection, parse_spec, select
from dapo.registry import BUILTIN as BUILTIN_LOSSES
from dapo.registry import parse_spec as parse_loss_spec
from dapo.registry import resolve as resolve_loss

from .optim import OPTIMIZERS, advance, squared_norm
from .policies import (
    EOS,
    TabularPolicy,
    exact_accuracy,
    exact_lengths,
    read_log_table,
    sample_table,
    table_cdf,
    table_log_softmax,
    table_logp_entropy,
    table_probs,
)
from .runner import (
    SIM_TAILS,
    RunSpec,
    _best_paths,
    _drift,
    _long_prompts,
    engine_precision,
    make_task,
    partial_cuts,
    prompt_stream,
    round_times,
)
from .tasks import TokenTask, episode_end, verify

Log = list[dict[str, float]]


def batch_key(spec: RunSpec) -> tuple | None:
    """Runs with equal keys can share a batch; None for a run only the per-run loop can do."""
    if spec.policy != "tabular" or spec.engine_noise > 0 or spec.lr_boost != 1.0:
        return None
    c = spec.cfg
    return (
        spec.task,
        tuple(sorted(spec.task_kwargs.items())),
        spec.steps,
        spec.lr,
        spec.optimizer,
        spec.init_noise,
        spec.drift_at,
        c.group_size,
        c.train_groups,
    )


@dataclass
class _Round:
    """One generation round of the active runs, rows run-major."""

    run: Tensor  # [n] run index of each row
    prompts: Tensor
    tokens: Tensor
    lengths: Tensor
    truncated: Tensor
    correct: Tensor
    on_track: Tensor
    rewards: Tensor
    cut: Tensor  # [n] partial rollouts: positions < cut were sampled by the older version


def train_many(specs: Sequence[RunSpec], progress: Callable[[int], None] | None = None) -> list[Log]:
    """Train every spec (all sharing one :func:`batch_key`) and return one log per spec,
    as :func:`toybench.runner.train` would. ``progress(k)`` is called after each step
    with the number of run-steps just done."""
    specs = list(specs)
    if not specs:
        return []
    keys = {batch_key(s) for s in specs}
    if None in keys or len(keys) != 1:
        raise ValueError("train_many needs tabular runs without engine noise that share one batch_key")
    return _Engine(specs).run(progress)


class _Members:
    """Runs that share the scalar knobs of one batched core call."""

    def __init__(self, cfg: AlgoConfig, members: list[int], n_runs: int, loss: str = "dapo"):
        self.cfg = cfg
        self.loss_fn = resolve_loss(loss).fn
        name = parse_loss_spec(loss)[0]
        # DAPO's core and the batched built-ins weigh a fully masked row by exact zeros
        self.any_rows = name in BUILTIN_LOSSES and BUILTIN_LOSSES[name].batched
        self.members = members
        self.index = None if len(members) == n_runs else torch.tensor(members)

    def windows(self, start: list[int], count: list[int]) -> list[tuple[_Members, slice]]:
        """The loss calls of one window slot: each with its runs and their rows (of the slot's).

        A window is a contiguous range of its run's rows; where the runs of a batch split
        their rows differently (a dynamic-sampling arm beside one without), the slot spans
        every run's window, so a run's share of it holds rows of its other windows, fully
        masked. A loss that is not known to weigh those by exact zeros (a user's, a peer's,
        Clip-Cov's, which seeds its token draw from the batch) is called on exactly its
        run's window, as :func:`toybench.runner.train` calls it: runs whose windows
        coincide share a call. ``start`` and ``count`` give each run's window in the slot
        (``count`` 0: no window there, and no call)."""
        if self.any_rows:
            return [(self, slice(None))]
        by: dict[tuple[int, int], list[int]] = {}
        for r in self.members:
            if count[r]:
                by.setdefault((start[r], count[r]), []).append(r)
        calls = []
        for (lo, n), members in by.items():
            sub = self
            if members != self.members:  # a share of the group's runs: the same loss, no new resolve
                sub = copy.copy(self)
                sub.members, sub.index = members, torch.tensor(members)
            calls.append((sub, slice(lo, lo + n)))
        return calls

    def pick(self, x: Tensor) -> Tensor:
        return x if self.index is None else x[self.index]

    def put(self, dst: Tensor, value: Tensor) -> None:
        if self.index is None:
            dst.copy_(value)
        else:
            dst[self.index] = value


class _Engine:
    def __init__(self, specs: list[RunSpec]):
        self.specs = specs
        self.cfgs: list[AlgoConfig] = [s.cfg for s in specs]
        self.task = task = make_task(specs[0])
        for c in self.cfgs:
            if c.max_len != task.max_len:
                raise ValueError(
                    f"cfg.expected_len + cfg.cache_len = {c.max_len} must equal the task's "
                    f"max_len {task.max_len}"
                )
        self.R = R = len(specs)
        self.G = specs[0].cfg.group_size
        self.n_groups = specs[0].cfg.train_groups
        self.gens = []
        tables = []
        for s in specs:
            gen = torch.Generator().manual_seed(s.seed)
            tables.append(TabularPolicy(task, gen, init_noise=s.init_noise).table.detach())
            self.gens.append(gen)
        self.table = torch.nn.Parameter(torch.stack(tables))
        self.lr = specs[0].lr
        self.optimizer = specs[0].optimizer  # part of the batch key
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r}: choose from {', '.join(OPTIMIZERS)}")
        # ScaleFreeSGD's state, per run: the gradient's second moment and the steps taken
        self.v = torch.zeros(R, dtype=torch.float64)
        self.t = torch.zeros(R, dtype=torch.float64)
        self.best = _best_paths(task)  # of the task the run starts on, as the loop keeps it
        self._set_task(task)
        # prompt selection (per run: its own history and data-loader stream) and the drift
        self.selections = [
            PromptSelection(parse_spec(s.selection), seed=s.seed) if s.selection else None for s in specs
        ]
        self.streams = [prompt_stream(task.num_prompts, s.seed) if s.selection else None for s in specs]
        self.drift = _drift(specs[0])  # drift_at is part of the batch key
        self.groups = {
            name: [_Members(c, m, R, loss) for c, loss, m in g]
            for name, g in _config_groups(self.cfgs, [s.loss for s in specs]).items()
        }
        # whether any loss needs each run's own window (:meth:`_Members.windows`)
        self.exact_windows = not all(g.any_rows for g in self.groups["loss"])
        cfgs = self.cfgs
        self.max_rounds = torch.tensor([c.max_gen_rounds for c in cfgs])
        self.ds = torch.tensor([c.dynamic_sampling for c in cfgs])
        self.excl = torch.tensor([c.overlong_filter and c.filtered_group_stats == "excluded" for c in cfgs])
        self.filt = torch.tensor([c.overlong_filter for c in cfgs])
        self.epochs = torch.tensor([c.ppo_epochs for c in cfgs])
        self.mbg = torch.tensor([c.mini_batch_groups for c in cfgs])
        clip = [c.max_grad_norm for c in cfgs]
        self.clip = (
            None
            if all(c is None for c in clip)
            else torch.tensor([math.inf if c is None else c for c in clip], dtype=torch.float64)
        )
        # off-policy rollouts: past tables by version (the weights after each step)
        self.off = [s.off_policy for s in specs]
        self.any_off = any(self.off)
        self.partial = torch.tensor([s.partial for s in specs])
        keep = max((s.staleness + s.partial for s in specs), default=0) + 1
        self.versions: dict[int, Tensor] = {}
        self.keep_versions = keep
        self.behaviour: tuple[Tensor, Tensor] | None = None  # (new, old) engine tables of this step

    def _set_task(self, task: TokenTask) -> None:
        self.task = task
        self.long = _long_prompts(task)
        self.q_best = task.quality.argmax(1, keepdim=True)
        self.q_worst = task.quality.argmin(1, keepdim=True)

    # -- off-policy: the engine's weights ---------------------------------------------------
    def lag(self, r: int) -> int:
        s = self.specs[r]
        return s.staleness if self.step >= s.staleness_from else 0

    def engine_tables(self) -> tuple[Tensor, Tensor]:
        """The tables the engine samples with this step, [R, ...]: version ``step - k`` and,
        for partial rollouts, version ``step - k - 1`` (clamped at version 0), each in the
        engine's precision."""
        table = self.table.detach()
        if not self.any_off:
            return table, table
        self.versions[self.step] = table.clone()
        for v in [v for v in self.versions if v <= self.step - self.keep_versions]:
            del self.versions[v]

        def at(r: int, back: int) -> Tensor:
            return self.versions[max(self.step - back, 0)][r]

        new = torch.stack([at(r, self.lag(r)) for r in range(self.R)])
        old = torch.stack(
            [at(r, self.lag(r) + 1) if self.specs[r].partial else new[r] for r in range(self.R)]
        )
        for r, spec in enumerate(self.specs):
            if spec.mismatch is not None:
                new[r], old[r] = (
                    engine_precision(new[r], spec.mismatch),
                    engine_precision(old[r], spec.mismatch),
                )
        return new, old

    def behaviour_logp(self, batch: dict[str, Tensor]) -> Tensor:
        """Each token's log-prob under the engine version that sampled it."""
        assert self.behaviour is not None
        new, old = self.behaviour
        args = (batch["prompts"], batch["tokens"])
        lp_new, _ = table_logp_entropy(new, *args, run=batch["run"], entropy=False)
        if not bool(self.partial.any()):  # no cut anywhere: every token is the newer version's
            return lp_new
        lp_old, _ = table_logp_entropy(old, *args, run=batch["run"], entropy=False)
        before = torch.arange(lp_new.shape[-1]) < batch["cut"].unsqueeze(-1)
        return torch.where(before, lp_old, lp_new)

    # -- one generation round for the active runs --------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        active: list[int],
        cdf: Tensor,
        rnd: int = 0,
        cdf_old: Tensor | None = None,
        chosen: dict[int, list[int]] | None = None,
    ) -> _Round:
        """One round for the ``active`` runs; a run in ``chosen`` generates those prompts (its
        prompt selection's), the others draw theirs uniformly, as ``runner.rollout_round``."""
        task, g = self.task, self.G
        b = self.n_groups * g
        t = task.max_len
        prompts, uniforms = [], []
        for r in active:  # each run's own stream, in the order and sizes runner.rollout_round draws
            gen = self.gens[r]
            if chosen is not None and r in chosen:
                prompts.append(torch.tensor(chosen[r], dtype=torch.long))
            else:
                prompts.append(torch.randint(task.num_prompts, (self.n_groups,), generator=gen))
            # one draw for the three of rollout_round (first token, later tokens, verifier):
            # the CPU generator fills doubles sequentially (the equivalence test checks it)
            uniforms.append(torch.rand(b + b * (t - 1) + b, generator=gen, dtype=torch.float64))
        n = len(active)
        u = torch.stack(uniforms)
        run = torch.tensor(active).repeat_interleave(b)
        p = torch.stack(prompts).repeat_interleave(g, dim=1).view(-1)
        u_first, u_rest = u[:, :b].reshape(-1), u[:, b : b * t].reshape(n * b, t - 1)
        tokens = sample_table(cdf, p, u_first, u_rest, run=run)
        cut = torch.zeros(len(p), dtype=torch.long)
        partial = [i for i, r in enumerate(active) if self.specs[r].partial]
        if partial and cdf_old is not None:
            # the same uniforms through the older version before the cut, the newer after it
            # (a response's path is its first token, so the two halves join exactly)
            cut = torch.cat(
                [
                    partial_cuts(self.specs[r].seed, self.step, rnd, b, t)
                    if self.specs[r].partial
                    else torch.zeros(b, dtype=torch.long)
                    for r in active
                ]
            )
            first = sample_table(cdf_old, p, u_first, u_rest, run=run)
            later = sample_table(cdf, p, None, u_rest, first=first[:, 0], run=run)
            before = torch.arange(t).unsqueeze(0) < cut.unsqueeze(1)
            joined = torch.where(before, first, later)
            tokens = torch.where((cut > 0).unsqueeze(1), joined, tokens)
        lengths, truncated = episode_end(tokens, t)
        out = verify(task, p, tokens, lengths, truncated, u[:, b * t :].reshape(-1))
        groups = self.groups["reward"]
        if len(groups) == 1:
            rewards = config_reward(out.correct, lengths, groups[0].cfg).to(torch.float64)
        else:
            rewards = torch.empty(len(p), dtype=torch.float64)
            for grp in groups:
                rows = torch.isin(run, grp.index) if grp.index is not None else slice(None)
                rewards[rows] = config_reward(out.correct[rows], lengths[rows], grp.cfg).to(torch.float64)
        return _Round(run, p, tokens, lengths, truncated, out.correct, out.on_track, rewards, cut)

    # -- training -----------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None) -> list[Log]:
        logs: list[Log] = [[] for _ in range(self.R)]
        totals = [[0.0, 0.0, 0.0] for _ in range(self.R)]
        sim_totals = [dict.fromkeys(SIM_TAILS, 0.0) for _ in range(self.R)]
        for step in range(self.specs[0].steps):
            self.step = step
            if self.drift is not None and step == self.specs[0].drift_at:
                self._set_task(self.drift[0])
            policy = self.policy_metrics()
            batch, sampling, on_track = self.sample()
            selection = [{} if sel is None else sel.end_step() for sel in self.selections]
            actor = self.update(batch, step)
            for r in range(self.R):
                m: dict[str, float] = {"step": float(step)}
                m.update(policy[r])
                m.update(selection[r])
                m.update(sampling[r])
                m.update(actor[r])
                tot = totals[r]
                tot[0] += m["sampling/generated_groups"] * self.G
                tot[1] += m["sampling/generated_tokens"]
                tot[2] += m["actor/optimizer_steps"]
                m["toy/truncated_on_track"], gen_time = on_track[r]
                m["cost/responses_total"], m["cost/tokens_total"], m["cost/optimizer_steps_total"] = tot
                for name, t in gen_time.items():
                    sim_totals[r][name] += t
                    m[f"toy/gen_time_{name}"] = t
                    m[f"cost/gen_time_{name}_total"] = sim_totals[r][name]
                logs[r].append(m)
            if progress is not None:
                progress(self.R)
        return logs

    @torch.no_grad()
    def policy_metrics(self) -> list[dict[str, float]]:
        """``runner._policy_metrics`` for the tabular policy, every run at once."""
        table = self.table.detach()
        first = torch.softmax(table[:, :, 0, 0], dim=-1)  # [R, P, V]
        best = first.gather(2, self.best.view(1, -1, 1).expand(self.R, -1, 1)).squeeze(-1).mean(-1)
        self.probs = probs = table_probs(table)  # once a step: the metrics and the on-policy CDF
        acc = exact_accuracy(table, self.task, probs)
        lengths = exact_lengths(table, self.task, probs)
        cols = [
            best,
            acc.mean(-1),
            lengths.gather(2, self.q_best.expand(self.R, -1, -1)).squeeze(-1).mean(-1),
            lengths.gather(2, self.q_worst.expand(self.R, -1, -1)).squeeze(-1).mean(-1),
        ]
        names = [
            "toy/best_path_prob",
            "toy/expected_accuracy",
            "toy/length_best_path",
            "toy/length_worst_path",
        ]
        if bool(self.long.any()):
            cols.append(acc[:, self.long].mean(-1))
            names.append("toy/expected_accuracy_long")
        if self.drift is not None:
            cols.append(acc[:, self.drift[1]].mean(-1))
            names.append("toy/expected_accuracy_drifted")
        values = torch.stack(cols, 1).tolist()
        return [dict(zip(names, row)) for row in values]

    def sample(self) -> tuple[dict[str, Tensor], list[dict[str, float]], list[float]]:
        """Generation rounds until every run's dynamic sampler is done (a run that is done
        draws nothing more), then each run's batch as [R, B, ...] with a ``valid`` mask.
        ``DynamicSampler``'s rules and accounting, for all runs at once."""
        R, G, target = self.R, self.G, self.n_groups
        rounds = torch.zeros(R, dtype=torch.long)
        accepted = torch.zeros(R, dtype=torch.long)
        rejected = torch.zeros(R, 2, dtype=torch.long)
        parts: list[_Round] = []
        seen_run, kept_run, kept_gid = [], [], []
        offset = 0  # groups generated so far this step
        gen_time = {name: torch.zeros(R, dtype=torch.float64) for name in SIM_TAILS}
        new, old = self.engine_tables()
        self.behaviour = (new, old)
        cdf = table_cdf(new, None if self.any_off else self.probs)  # on-policy: new is this table
        cdf_old = table_cdf(old) if bool(self.partial.any()) else None
        while True:
            live = (accepted < target) & (rounds < self.max_rounds)
            if not bool(live.any()):
                break
            active_t = live.nonzero().view(-1)
            active = active_t.tolist()
            chosen = {  # as the trainer: one pass of offers, then the round filled
                r: select(sel, self.streams[r], target, self.step, self.task.num_prompts, fill=True)[0]
                for r in active
                if (sel := self.selections[r]) is not None
            }
            rd = self.generate(active, cdf, int(rounds[active_t[0]]), cdf_old, chosen)
            parts.append(rd)
            n = len(active_t)
            if chosen:
                n_correct = rd.correct.view(n, target, G).sum(-1).tolist()
                for i, r in enumerate(active):
                    if r in chosen:
                        self.selections[r].observe(chosen[r], n_correct[i], G, self.step)
            rnd = rounds[active_t]  # every active run is on the same round: rounds advance together
            times = round_times(
                rd.lengths.view(n, -1), [self.specs[r].seed for r in active], self.step, int(rnd[0])
            )
            for name, t in times.items():
                gen_time[name][active_t] += t
            correct = rd.correct.view(n, -1)
            all_c, all_w = uniform_groups(correct, G)
            excl = self.excl[active_t].unsqueeze(1)
            if bool(excl.any()):
                ex_c, ex_w = uniform_groups(correct, G, rd.truncated.view(n, -1))
                all_c, all_w = torch.where(excl, ex_c, all_c), torch.where(excl, ex_w, all_w)
            ds = self.ds[active_t].unsqueeze(1)
            keep = ~ds | ~(all_c | all_w)
            rounds[active_t] += 1
            rejected[active_t] += torch.stack([(all_c & ds).sum(1), (all_w & ds).sum(1)], 1)
            accepted[active_t] += keep.sum(1)
            run_of_group = active_t.repeat_interleave(target)
            seen_run.append(run_of_group)
            kept_run.append(run_of_group[keep.view(-1)])
            kept_gid.append((offset + torch.arange(n * target))[keep.view(-1)])
            offset += n * target
        data = _cat_rounds(parts, G)  # rows of every round, then one sentinel group
        all_runs = torch.cat(seen_run)
        seen_idx, seen_valid = _slots(
            all_runs, torch.arange(offset), R, int(rounds.max()) * target, offset, G
        )
        batch_idx, valid = _slots(torch.cat(kept_run), torch.cat(kept_gid), R, target, offset, G)
        lengths_seen = data["lengths"][seen_idx]
        truncated_seen = data["truncated"][seen_idx]
        stats = rollout_stats(
            correct=data["correct"][seen_idx],
            lengths=lengths_seen,
            truncated=truncated_seen,
            rewards=data["rewards"][seen_idx],
            group_size=G,
            valid=seen_valid,
        )
        n_truncated = truncated_seen.sum(1)
        on_track = data["on_track"][seen_idx].sum(1)
        generated_tokens = lengths_seen.sum(1).double()
        acc = accepted.clamp(max=target).double()
        nan = torch.full((R,), math.nan, dtype=torch.float64)
        cols = torch.stack(
            [
                *stats.values(),
                rounds.double(),
                (seen_valid.sum(1) // G).double(),
                generated_tokens,
                acc,
                rejected[:, 0].double(),
                rejected[:, 1].double(),
                accepted.double() - acc,
                (accepted < target).double(),
                torch.where(acc > 0, generated_tokens / acc.clamp(min=1), nan),
                *gen_time.values(),
                torch.where(n_truncated > 0, on_track.double() / n_truncated.clamp(min=1), nan),
            ],
            1,
        ).tolist()
        names = [
            *stats,
            "sampling/rounds",
            "sampling/generated_groups",
            "sampling/generated_tokens",
            "sampling/accepted_groups",
            "sampling/rejected_all_correct",
            "sampling/rejected_all_wrong",
            "sampling/surplus_groups",
            "sampling/underfilled",
            "sampling/tokens_per_accepted_group",
        ]
        metrics = [dict(zip(names, row[: len(names)])) for row in cols]
        extra = [dict(zip(gen_time, row[len(names) : -1])) for row in cols]
        batch = {k: v[batch_idx] for k, v in data.items()}
        batch["valid"] = valid
        batch["run"] = torch.arange(R).unsqueeze(1).expand_as(batch_idx)
        batch["n_rows"] = valid.sum(1)
        return batch, metrics, [(row[-1], extra[i]) for i, row in enumerate(cols)]

    def update(self, batch: dict[str, Tensor], step: int) -> list[dict[str, float]]:
        """``dapo.update`` for every run at once: the same windows, normalisers, skips and
        metrics, with one backward and one SGD step per window slot."""
        R, G = self.R, self.G
        n_rows = batch["n_rows"]
        has = n_rows > 0
        mask = batch["mask"]
        # the first window's forward reads the table old_logp is read from: one log-softmax
        # for both, until the first optimizer step changes the table
        log_table: Tensor | None = table_log_softmax(self.table)
        with torch.no_grad():
            old_logp, _ = read_log_table(
                log_table.detach(), self.table.shape, batch["prompts"], batch["tokens"], batch["run"], False
            )
        old_logp = torch.where(mask, old_logp, torch.zeros_like(old_logp))
        adv = torch.zeros(mask.shape[:2], dtype=torch.float64)
        for grp in self.groups["advantage"]:
            grp.put(
                adv,
                config_advantages(
                    grp.pick(batch["rewards"]),
                    grp.pick(batch["correct"]),
                    grp.pick(batch["lengths"]),
                    grp.pick(batch["truncated"]),
                    G,
                    grp.cfg,
                ),
            )
        filtered = batch["truncated"] & self.filt.unsqueeze(1)
        loss_mask = mask & ~filtered.unsqueeze(-1)
        ratio_logp, weights, off_metrics = self.correct(batch, old_logp, loss_mask)
        # windows: each run's responses in batch order, cut into ceil(groups / mini_batch) pieces
        n_win = torch.clamp((n_rows // G + self.mbg - 1) // self.mbg, min=1)
        win = _split_ids(n_rows, n_win, mask.shape[1])  # [R, B] window of each row (-1: none)
        nan_runs = [step in s.nan_steps for s in self.specs]
        acc = _Acc(R)
        shape = (R,) + (1,) * (self.table.dim() - 1)
        for epoch in range(int(self.epochs.max())):
            for w in range(int(n_win.max())):
                live = has & (epoch < self.epochs) & (w < n_win)
                if not bool(live.any()):
                    continue
                in_win = (win == w) & live.unsqueeze(1)
                # the rows any run uses in this slot (a window's rows when runs share a geometry)
                used = in_win.any(0).nonzero()
                rows = slice(int(used[0]), int(used[-1]) + 1)
                in_win = in_win[:, rows]
                slot_mask = loss_mask[:, rows] & in_win.unsqueeze(-1)
                denom = torch.zeros(R, dtype=torch.float64)
                for grp in self.groups["loss"]:
                    grp.put(
                        denom, window_denominator(grp.pick(slot_mask), grp.cfg.loss_agg, grp.cfg.norm_const)
                    )
                stepping = live & (denom > 0)
                acc.empty_windows += live & (denom == 0)
                if not bool(stepping.any()):
                    continue
                self.table.grad = None
                if log_table is None:
                    log_table = table_log_softmax(self.table)
                logp, entropy = read_log_table(
                    log_table,
                    self.table.shape,
                    batch["prompts"][:, rows],
                    batch["tokens"][:, rows],
                    batch["run"][:, rows],
                    entropy=epoch == 0,
                )
                log_table = None  # its graph goes with this window's backward
                if any(nan_runs):
                    # added, not multiplied: the backward of ``logp * nan`` is ``grad * nan``,
                    # NaN for every run (0 * nan), which took every batch-mate's step
                    poison = torch.where(torch.tensor(nan_runs).view(R, 1, 1), math.nan, 0.0)
                    logp = logp + poison.to(logp.dtype)
                loss = torch.zeros(R, dtype=torch.float64)
                stats = torch.zeros(R, len(_STATS), dtype=torch.float64)
                total = torch.zeros((), dtype=torch.float64)
                start: list[int] = []
                count: list[int] = []
                if self.exact_windows:
                    n_in = in_win.sum(1)
                    start = torch.where(n_in > 0, in_win.to(torch.uint8).argmax(1), 0).tolist()
                    count = n_in.tolist()
                for grp in self.groups["loss"]:
                    c = grp.cfg
                    for sub, cols in grp.windows(start, count):
                        weight_kw = (
                            {} if weights is None else {"is_weights": sub.pick(weights[:, rows][:, cols])}
                        )
                        li, si = sub.loss_fn(
                            sub.pick(logp[:, cols]),
                            sub.pick(ratio_logp[:, rows][:, cols]),
                            sub.pick(adv[:, rows][:, cols]),
                            sub.pick(slot_mask[:, cols]),
                            ClipAgg.of(c, sub.pick(denom)),
                            **weight_kw,
                        )
                        total = total + torch.where(sub.pick(stepping), li, torch.zeros_like(li)).sum()
                        sub.put(loss, li.detach())
                        sub.put(stats, torch.stack([si[k] for k in _STATS], 1))
                total.backward()
                grad = self.table.grad
                norm = torch.linalg.vector_norm(grad.flatten(1), dim=1)
                took = stepping & torch.isfinite(loss) & torch.isfinite(norm)
                if self.clip is not None:  # clip_grad_norm_'s arithmetic, per run
                    grad.mul_((self.clip / (norm + 1e-6)).clamp(max=1.0).view(shape))
                if not bool(took.all()):
                    self.table.grad = torch.where(took.view(shape), grad, torch.zeros_like(grad))
                self._step(took)
                ent_mask = mask[:, rows] & in_win.unsqueeze(-1)
                acc.add(stats, loss, norm, took, stepping & ~took, entropy if epoch == 0 else None, ent_mask)
        self.table.grad = None
        finish = acc.finish()
        mean_prob = masked_mean(torch.exp(old_logp), mask, dims=2)
        extra = torch.stack([mean_prob, loss_mask.sum((1, 2)).double(), filtered.sum(1).double()], 1).tolist()
        has_l = has.tolist()
        out = []
        for r in range(R):
            # dapo.update's order: toy/staleness (the loop's, before it), the step counts, mismatch/*, the rest
            head = {k: v for k, v in off_metrics[r].items() if k == "toy/staleness"}
            if not has_l[r]:  # no informative group at all: dapo.update returns early, no mismatch/*
                out.append({**head, "actor/optimizer_steps": 0.0, "actor/skipped_steps": 0.0})
                continue
            m = finish[r]
            m["actor/mean_prob"], m["actor/loss_tokens"], m["actor/filtered_responses"] = extra[r]
            steps = {k: m[k] for k in ("actor/optimizer_steps", "actor/skipped_steps")}
            out.append({**head, **steps, **off_metrics[r], **m})
        return out

    @torch.no_grad()
    def _step(self, took: Tensor) -> None:
        """One optimizer step for every run that ``took`` it (the others' gradients are zero).
        ``sgd``: ``torch.optim.SGD(lr).step()`` without momentum or weight decay, as the
        per-run loop takes it (``param.add_(grad, alpha=-lr)``: the same kernel, so the same
        bits), without constructing the optimizer, whose first construction imports
        torch._dynamo (1.6 s in every process that trains). ``scale_free``:
        :class:`toybench.optim.ScaleFreeSGD`'s step per run, with its ops on the run's own
        slice: the same bits as the loop, whatever shares the batch."""
        grad = self.table.grad
        assert grad is not None
        if self.optimizer == "sgd":
            self.table.add_(grad, alpha=-self.lr)
            return
        # per run, with the loop's own ops on the run's own slice (same shape, same kernel):
        # ScaleFreeSGD's bits, whatever else shares the batch
        for r in torch.nonzero(took).flatten().tolist():
            self.v[r], self.t[r], factor = advance(self.v[r], self.t[r], squared_norm(grad[r]), self.lr)
            self.table[r].add_(grad[r], alpha=-factor)

    def correct(
        self, batch: dict[str, Tensor], old_logp: Tensor, loss_mask: Tensor
    ) -> tuple[Tensor, Tensor | None, list[dict[str, float]]]:
        """The off-policy correction of each run's config against the engine's log-probs
        (:func:`dapo.offpolicy.correct`, run-batched as ``dapo.update`` applies it): the
        log-probs the ratio is taken against, the weights (None when no run weights) and
        ``mismatch/*`` + ``toy/staleness`` per off-policy run. ``loss_mask`` loses the
        rejected tokens in place. On-policy batches pass through untouched."""
        metrics: list[dict[str, float]] = [{} for _ in range(self.R)]
        if not self.any_off:
            return old_logp, None, metrics
        mask = batch["mask"]
        roll = torch.where(mask, self.behaviour_logp(batch), torch.zeros_like(old_logp))
        ratio_logp = old_logp.clone()
        weighted = [c.tis_cap is not None for c in self.cfgs]
        weights = torch.ones_like(old_logp) if any(weighted) else None
        for grp in self.groups["loss"]:
            if any(weighted[r] for r in grp.members):
                require_weights(grp.loss_fn)
        sums: list[dict[str, tuple[float, float]]] = [{} for _ in range(self.R)]  # each run its own names
        for grp in self.groups["correction"]:
            corr = correct(grp.pick(old_logp), grp.pick(roll), grp.pick(mask), grp.pick(loss_mask), grp.cfg)
            grp.put(loss_mask, corr.mask)
            if weights is not None and corr.weights is not None:
                grp.put(weights, corr.weights.to(weights.dtype))
            if grp.cfg.behaviour_clip:
                grp.put(ratio_logp, grp.pick(roll))
            for name, (total, count) in corr.sums.items():
                for r, t, c in zip(grp.members, total.tolist(), count.tolist()):
                    sums[r][name] = (t, c)
        pos = torch.arange(mask.shape[-1])
        for r in range(self.R):
            if not self.off[r]:
                continue
            k = min(self.lag(r), self.step)
            k_old = min(self.lag(r) + 1, self.step) if self.specs[r].partial else k
            lag = torch.where(pos < batch["cut"][r].unsqueeze(-1), float(k_old), float(k))
            n = mask[r].sum()
            metrics[r]["toy/staleness"] = float(lag[mask[r]].sum() / n) if n else math.nan
            for name, (total, count) in sums[r].items():
                metrics[r][name] = finish(name, total, count)
        return ratio_logp, weights, metrics


_TOKEN_STATS = ("clipfrac_upper", "clipfrac_lower", "dual_clipfrac", "approx_kl")
_STATS = ("n_tokens", *_TOKEN_STATS, "n_upclip", "upclip_old_prob")


class _Acc:
    """``dapo.update._Sums`` for every run at once (a window's statistics count only where
    its step was taken)."""

    def __init__(self, R: int):
        self.empty_windows = torch.zeros(R, dtype=torch.long)
        # steps, skipped, loss, norm, tokens, 4 x weighted stat, n_upclip, upclip prob, entropy tokens, sum
        self.sums = torch.zeros(R, 13, dtype=torch.float64)
        self.norm_max = torch.full((R,), -math.inf, dtype=torch.float64)

    def add(
        self,
        stats: Tensor,
        loss: Tensor,
        norm: Tensor,
        took: Tensor,
        skipped: Tensor,
        entropy: Tensor | None,
        ent_mask: Tensor,
    ) -> None:
        n = stats[:, 0]
        k_up = stats[:, 5]
        if entropy is not None:
            ent_tokens = ent_mask.sum((1, 2)).double()
            ent_sum = torch.where(ent_mask, entropy.to(torch.float64), 0.0).sum((1, 2))
        else:
            ent_tokens = ent_sum = torch.zeros_like(n)
        row = torch.stack(
            [
                torch.ones_like(n),
                torch.zeros_like(n),
                loss,
                norm,
                n,
                *(stats[:, 1:5] * n.unsqueeze(1)).T,
                k_up,
                torch.where(k_up > 0, stats[:, 6] * k_up, 0.0),
                ent_tokens,
                ent_sum,
            ],
            1,
        )
        self.sums += torch.where(took.unsqueeze(1), row, 0.0)
        self.sums[:, 1] += skipped.double()
        self.norm_max = torch.where(took, torch.maximum(self.norm_max, norm), self.norm_max)

    def finish(self) -> list[dict[str, float]]:
        s = self.sums
        nan = torch.full_like(s[:, 0], math.nan)

        def ratio(a: Tensor, b: Tensor) -> Tensor:
            return torch.where(b > 0, a / torch.where(b > 0, b, 1.0), nan)

        steps = s[:, 0]
        cols = [steps, s[:, 1]]
        cols += [ratio(s[:, 5 + i], s[:, 4]) for i in range(len(_TOKEN_STATS))]
        cols += [
            ratio(s[:, 10], s[:, 9]),
            ratio(s[:, 12], s[:, 11]),
            ratio(s[:, 2], steps),
            ratio(s[:, 3], steps),
            torch.where(steps > 0, self.norm_max, nan),
            self.empty_windows.double(),
        ]
        names = [
            "actor/optimizer_steps",
            "actor/skipped_steps",
            *(f"actor/{k}" for k in _TOKEN_STATS),
            "actor/upclip_old_prob",
            "actor/entropy",
            "actor/loss",
            "actor/grad_norm",
            "actor/grad_norm_max",
            "actor/empty_windows",
        ]
        return [dict(zip(names, row)) for row in torch.stack(cols, 1).tolist()]


def _split_ids(n_rows: Tensor, n_win: Tensor, width: int) -> Tensor:
    """The window of each row under ``torch.tensor_split(arange(n_rows), n_win)``, per run
    ([R, width]; -1 beyond a run's rows)."""
    i = torch.arange(width).unsqueeze(0)
    n, k = n_rows.unsqueeze(1), n_win.unsqueeze(1)
    q, rem = n // k, n % k
    boundary = rem * (q + 1)
    big = i // (q + 1)
    small = rem + (i - boundary) // q.clamp(min=1)
    win = torch.where(i < boundary, big, small)
    return torch.where(i < n, win, torch.full_like(win, -1))


def _cat_rounds(parts: list[_Round], group_size: int) -> dict[str, Tensor]:
    """Every round's rows in order, then one sentinel group of empty responses."""
    t = parts[0].tokens.shape[1]
    g = group_size

    def cat(name: str, pad: Tensor) -> Tensor:
        return torch.cat([getattr(p, name) for p in parts] + [pad])

    data = {
        "prompts": cat("prompts", torch.zeros(g, dtype=torch.long)),
        "tokens": cat("tokens", torch.full((g, t), EOS, dtype=torch.long)),
        "lengths": cat("lengths", torch.zeros(g, dtype=torch.long)),
        "truncated": cat("truncated", torch.zeros(g, dtype=torch.bool)),
        "correct": cat("correct", torch.zeros(g, dtype=torch.bool)),
        "on_track": cat("on_track", torch.zeros(g, dtype=torch.bool)),
        "rewards": cat("rewards", torch.zeros(g, dtype=torch.float64)),
        "cut": cat("cut", torch.zeros(g, dtype=torch.long)),
    }
    data["mask"] = torch.arange(t).unsqueeze(0) < data["lengths"].unsqueeze(1)
    return data


def _slots(
    run: Tensor, gid: Tensor, n_runs: int, width: int, sentinel: int, group_size: int
) -> tuple[Tensor, Tensor]:
    """Row indices [R, width * G] of each run's first ``width`` groups (``gid``, listed in
    generation order with their ``run``), padded with the sentinel group; and the valid mask."""
    order = torch.argsort(run, stable=True)
    r, g = run[order], gid[order]
    counts = torch.bincount(r, minlength=n_runs)
    rank = torch.arange(len(r)) - (torch.cumsum(counts, 0) - counts)[r]
    keep = rank < width
    slots = torch.full((n_runs, width), sentinel, dtype=torch.long)
    slots[r[keep], rank[keep]] = g[keep]
    rows = (slots.unsqueeze(-1) * group_size + torch.arange(group_size)).view(n_runs, -1)
    valid = (slots != sentinel).repeat_interleave(group_size, dim=1)
    return rows, valid


def _config_groups(
    cfgs: list[AlgoConfig], losses: list[str]
) -> dict[str, list[tuple[AlgoConfig, str, list[int]]]]:
    """Runs grouped by the knobs each batched core call takes as scalars (and, for the
    loss, by the policy loss each run uses)."""
    keys: dict[str, Callable[[AlgoConfig], tuple]] = {
        "reward": lambda c: (c.soft_overlong, c.expected_len, c.cache_len, c.overlong_penalty_factor),
        "advantage": lambda c: (
            c.overlong_filter,
            c.filtered_group_stats,
            c.adv_eps,
            c.adv_std_norm,
            c.soft_overlong,
            c.expected_len,
            c.cache_len,
        ),
        "loss": lambda c: (c.eps_low, c.eps_high, c.clip_ratio_c, c.loss_agg, c.norm_const),
        "correction": lambda c: (
            c.tis_cap,
            c.is_level,
            c.is_lower,
            c.rejection,
            c.rejection_threshold,
            c.behaviour_clip,
        ),
    }
    out: dict[str, list[tuple[AlgoConfig, str, list[int]]]] = {}
    for name, key in keys.items():
        groups: dict[tuple, list[int]] = {}
        first: dict[tuple, tuple[AlgoConfig, str]] = {}
        for r, (c, loss) in enumerate(zip(cfgs, losses)):
            k = (*key(c), loss) if name == "loss" else key(c)
            groups.setdefault(k, []).append(r)
            first.setdefault(k, (c, loss))
        out[name] = [(*first[k], members) for k, members in groups.items()]
    return out
