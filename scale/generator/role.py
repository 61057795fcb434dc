"""The generator side of the full regime: prompts, engine, generation rounds, dynamic sampling.

:class:`Generator` is one rollout group's role, the same in both placements
(``rollout.mode``):

* **colocated** (:class:`scale.placement.colocated.Colocated`): every rank of the run
  generates with its engine, then trains; the generator's rounds and the learner's update
  alternate;
* **disaggregated**: separate processes generate
  (:func:`scale.placement.generator_process.main`, started by the learner's rank 0), each
  with its own engine, while the learner's ranks train. Batch ``s`` is sampled
  by policy version :func:`dapo.pipeline.behaviour_version` ``(s, rollout.max_staleness)``
  whatever the timing; the generators take each version from the learner over the bridge
  (:mod:`scale.dist.bridge`) into host memory as soon as it is published, load it into the engine
  when a batch needs it, decide dynamic sampling together over their own group, and send
  their kept groups and the learners' plan to the learner's rank 0.

Every token of a batch carries the version that sampled it (``extras["version"]``), so the
learner can check the staleness bound and report it (``async/*``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from typing import Any

import torch

from dapo import RolloutBatch, config_reward
from dapo.prompt_selection import PromptSelection, select
from dapo.rewards import score_integer_answer

from ..config import RunConfig
from ..dist.topology import Ranks
from .data import PromptStream
from .engines import Generation
from .evaluation import ProblemResult, canonical_prediction, summarize
from .rollout import GlobalDynamicSampler, round_digest


def seed_from(*parts: Any) -> int:
    """A stable 31-bit seed from run coordinates (rank, step, round...)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class Generator:
    """One rollout group's generation: each round takes its slice of the global prompt draw,
    samples ``group_size`` responses per prompt (each prompt's seed from its place in the
    draw, so the samples are the same on any number of engines), scores them and hands them to
    the global dynamic sampler."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        tokenizer: Any,
        prompt_ids: dict[str, list[int]],
        stream: PromptStream,
        engine: Any,
        ranks: Ranks,
        comm: Any,
        trace: Callable[..., None] | None = None,
        selection: PromptSelection | None = None,
        between_rounds: Callable[[], None] | None = None,
    ):
        self.cfg = cfg
        self.selection = selection
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids
        self.stream = stream
        self.engine = engine
        self.ranks = ranks
        self.comm = comm
        self.trace = trace
        self.between_rounds = between_rounds
        """Called before each round, at the same place on every rank (a disaggregated
        generator takes new policy versions there: :mod:`scale.placement.receive`)."""
        self.pad_id = tokenizer.pad_token_id

    @classmethod
    def build(
        cls,
        cfg: RunConfig,
        prompts: Any,
        *,
        ranks: Ranks,
        comm: Any,
        trace: Callable[..., None] | None = None,
        model: Any = None,
        distributed: bool = False,
        sleep: bool | None = None,
        context_len: int | None = None,
        shm_ident: str | None = None,
    ) -> Generator:
        """A rollout group's generator on its own engine (``rollout.engine``), whichever
        placement holds it, over the inputs ``prompts`` (:class:`scale.generator.prompts.Prompts`).
        vLLM: from ``model.path`` with dummy weights (the learner's version arrives before the
        first round), seeded ``rollout.seed`` plus the group's index, asleep during the update
        when ``sleep`` (default ``rollout.sleep_during_training``), one engine across the group's
        ranks when ``distributed``, its context ``context_len`` (default the inputs'). The
        transformers engine: generating with ``model`` (the learner's own module) or, without
        one, its own copy of ``model.path``, loaded with each version."""
        from .engines import make_engine

        r = cfg.rollout
        if r.engine == "hf":
            owns = model is None
            if owns:
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_pretrained(
                    cfg.model.path, dtype=getattr(torch, cfg.model.dtype)
                )
            engine = make_engine("hf", model=model, eos_id=prompts.eos_id, pad_id=prompts.pad_id, owns=owns)
        else:
            engine = make_engine(
                "vllm",
                model_path=cfg.model.path,
                dtype=r.dtype,
                max_model_len=context_len or prompts.context_len,
                gpu_memory_utilization=r.gpu_memory_utilization,
                kv_cache_gib=r.kv_cache_gib,
                tensor_parallel=r.tensor_parallel,
                seed=r.seed + ranks.dp_rank,
                sleep_during_training=r.sleep_during_training if sleep is None else sleep,
                sync_timeout_s=r.sync_timeout_s,
                distributed=distributed,
                dummy_weights=True,
                shm_ident=shm_ident,
            )
        return cls(
            cfg,
            tokenizer=prompts.tokenizer,
            prompt_ids=prompts.prompt_ids,
            stream=prompts.stream,
            engine=engine,
            ranks=ranks,
            comm=comm,
            trace=trace,
            selection=prompts.selection,
        )

    def encode(self, prompt: str) -> list[int]:
        """A prompt's token ids, as :func:`scale.generator.data.prepare_problems` encoded them."""
        return self.prompt_ids[prompt]

    def rounds(
        self, step: int, version: int, switch: Callable[[], int] | None = None
    ) -> GlobalDynamicSampler:
        """Generation rounds for training step ``step + 1`` with policy ``version`` until the
        informative groups of every rollout group fill the batch (or the round limit).
        ``switch`` (partial rollouts): after the first ``rollout.partial_tokens`` tokens of the
        first round it loads the next version into the engine and returns it; the responses
        still running continue under it, as does every later round."""
        c, algo, me = self.cfg, self.cfg.algo, self.ranks
        sampler = GlobalDynamicSampler(algo, me, self.comm, step=step)
        per_group = c.gen_groups // me.dp_size
        while not sampler.done:
            if self.between_rounds is not None:
                self.between_rounds()
            first = me.dp_rank * per_group
            chosen = self._draw(step)
            problems = [self.stream.problems[i] for i in chosen[first : first + per_group]]
            prompts = [self.encode(p.prompt) for p in problems]
            seed = [seed_from(c.rollout.seed, step, sampler.rounds, first + i) for i in range(len(prompts))]
            gens, versions, version = self._sample(prompts, seed, version, switch)
            switch = None  # the update happens once, in the first round
            digest = round_digest(prompts, seed, [[x.token_ids for x in row] for row in gens])
            if self.trace is not None:
                self.trace(
                    round=sampler.rounds,
                    seed=seed,
                    prompts=[f"{p.source}:{p.row}" for p in problems],
                    digest=digest,
                )
            sampler.add(self.to_batch(problems, gens, versions), digest)
            if self.selection is not None:  # every group's outcome, known to every rank now
                self.selection.observe(chosen, sampler.last_round_correct(), algo.group_size, step)
        if self.selection is not None:
            sampler.extra_metrics = self.selection.end_step()
        return sampler

    def evaluate(self, problems: list[Any], step: int) -> dict[str, float]:
        """avg@k, pass@k and cons@k of ``problems`` after ``step`` steps: the rollout groups
        split the problems (a group's members generate together), every rank gets the summary."""
        e, algo = self.cfg.eval, self.cfg.algo
        me = self.ranks
        mine = problems[me.dp_rank :: me.dp_size]
        gens = (
            self.engine.generate(
                [self.encode(p.prompt) for p in mine],
                n=e.k,
                max_tokens=e.max_new_tokens or algo.max_len,
                temperature=e.temperature,
                top_p=e.top_p,
                seeds=[seed_from("eval", step, i) for i in range(me.dp_rank, len(problems), me.dp_size)],
            )
            if mine
            else []
        )
        results = [
            ProblemResult(
                p.answer,
                [
                    canonical_prediction(self.tokenizer.decode(g.token_ids, skip_special_tokens=True))
                    for g in row
                ],
            )
            for p, row in zip(mine, gens)
        ]
        everything = self.comm.all_gather(
            results if me.tp_rank == 0 else [], f"the other rollout groups' evaluation at step {step}"
        )
        # back in the problems' own order (rollout group d held problems d, d + dp_size, ...), so
        # the bootstrap intervals do not depend on the number of processes
        parts = [everything[d * me.tensor_parallel] for d in range(me.dp_size)]
        flat = [parts[i % me.dp_size][i // me.dp_size] for i in range(sum(map(len, parts)))]
        return summarize(flat) if flat else {}

    def _draw(self, step: int) -> list[int]:
        """The round's global draw: ``rollout.gen_groups`` problem indices from the stream,
        chosen by ``algo.prompt_selection`` when set (the same decisions on every rank: one
        history, one stream, hashed draws; at most one pass over the data is offered, then the
        round is filled with the stream's next prompts)."""
        n = self.cfg.gen_groups
        if self.selection is None:
            return list(itertools.islice(self.stream.offers(), n))
        chosen, _ = select(
            self.selection, self.stream.offers(), n, step, len(self.stream.problems), fill=True
        )
        return chosen

    def _sample(
        self, prompts: list[list[int]], seeds: list[int], version: int, switch: Callable[[], int] | None
    ) -> tuple[list[list[Generation]], list[list[list[int]]], int]:
        """``group_size`` responses per prompt, the version of each of their tokens, and the
        version the engine holds afterwards."""
        c, algo = self.cfg, self.cfg.algo
        n = algo.group_size
        kw = {"temperature": c.rollout.temperature, "top_p": c.rollout.top_p}
        budget = c.rollout.partial_tokens
        if switch is None or budget >= algo.max_len:
            gens = self.engine.generate(prompts, n=n, max_tokens=algo.max_len, seeds=seeds, **kw)
            return gens, [[[version] * len(g.token_ids) for g in row] for row in gens], version
        gens = self.engine.generate(prompts, n=n, max_tokens=budget, seeds=seeds, **kw)
        versions = [[[version] * len(g.token_ids) for g in row] for row in gens]
        running = [
            (i, j) for i, row in enumerate(gens) for j, g in enumerate(row) if g.finish_reason == "length"
        ]
        fresh = switch()  # the weight update: the engine now holds the next version
        if running:
            more = self.engine.generate(
                [prompts[i] + gens[i][j].token_ids for i, j in running],
                n=1,
                max_tokens=algo.max_len - budget,
                seeds=[seed_from(seeds[i], j, "continued") for i, j in running],
                **kw,
            )
            for (i, j), (tail,) in zip(running, more):
                head = gens[i][j]
                gens[i][j] = Generation(
                    head.token_ids + tail.token_ids, head.logprobs + tail.logprobs, tail.finish_reason
                )
                versions[i][j] += [fresh] * len(tail.token_ids)
        return gens, versions, fresh

    def to_batch(
        self, problems: list[Any], gens: list[list[Generation]], versions: int | list[list[list[int]]]
    ) -> RolloutBatch:
        """Scored responses as a batch; ``versions``: the policy version of every token (or one
        for all)."""
        algo = self.cfg.algo
        g = algo.group_size
        flat = [(p, x) for p, row in zip(problems, gens) for x in row]
        b = len(flat)
        t = max(len(x.token_ids) for _, x in flat)
        prompts = [self.encode(p.prompt) for p, _ in flat]
        p_max = max(len(p) for p in prompts)
        prompt_ids = torch.full((b, p_max), self.pad_id, dtype=torch.long)
        response_ids = torch.full((b, t), self.pad_id, dtype=torch.long)
        rollout_logp = torch.zeros(b, t, dtype=torch.float32)
        version = torch.full((b, t), versions if isinstance(versions, int) else 0, dtype=torch.int32)
        if not isinstance(versions, int):
            for i, v in enumerate(x for row in versions for x in row):
                version[i, : len(v)] = torch.tensor(v, dtype=torch.int32)
        for i, ((_prob, gen), pids) in enumerate(zip(flat, prompts)):
            prompt_ids[i, : len(pids)] = torch.tensor(pids)
            response_ids[i, : len(gen.token_ids)] = torch.tensor(gen.token_ids)
            rollout_logp[i, : len(gen.logprobs)] = torch.tensor(gen.logprobs)
        lengths = torch.tensor([len(x.token_ids) for _, x in flat])
        truncated = torch.tensor([x.finish_reason == "length" for _, x in flat])
        texts = self.tokenizer.batch_decode([x.token_ids for _, x in flat], skip_special_tokens=True)
        correct = torch.tensor([score_integer_answer(txt, p.answer) for txt, (p, _) in zip(texts, flat)])
        mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
        rollout_logp = torch.where(mask, rollout_logp.clamp(max=0.0), torch.zeros_like(rollout_logp))
        ids = torch.tensor([zlib.crc32(f"{p.source}:{p.row}".encode()) & 0x7FFFFFFF for p, _ in flat])
        return RolloutBatch(
            old_logp=rollout_logp.clone(),
            rollout_logp=rollout_logp,
            mask=mask,
            lengths=lengths,
            truncated=truncated,
            correct=correct,
            rewards=config_reward(correct, lengths, algo).float(),
            group_ids=ids,
            group_size=g,
            extras={
                "prompt_ids": prompt_ids,
                "prompt_len": torch.tensor([len(p) for p in prompts]),
                "response_ids": response_ids,
                "version": torch.where(mask, version, 0),
            },
        )


def empty_groups(n_groups: int, group_size: int, t: int, pad_id: int) -> RolloutBatch:
    """Groups with no response token: padding that equalises ranks' batch sizes (zero loss
    weight, zero gradient, not counted in any metric)."""
    b = n_groups * group_size
    return RolloutBatch(
        old_logp=torch.zeros(b, t),
        rollout_logp=torch.zeros(b, t),
        mask=torch.zeros(b, t, dtype=torch.bool),
        lengths=torch.zeros(b, dtype=torch.long),
        truncated=torch.zeros(b, dtype=torch.bool),
        correct=torch.zeros(b, dtype=torch.bool),
        rewards=torch.zeros(b),
        group_ids=torch.full((b,), -1, dtype=torch.long),
        group_size=group_size,
        extras={
            "prompt_ids": torch.full((b, 1), pad_id, dtype=torch.long),
            "prompt_len": torch.ones(b, dtype=torch.long),
            "response_ids": torch.full((b, t), pad_id, dtype=torch.long),
            "version": torch.zeros(b, t, dtype=torch.int32),
        },
    )
