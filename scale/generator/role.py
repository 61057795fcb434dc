"""The generator side of the full regime: prompts, engine, generation rounds, dynamic sampling.

:class:`Generator` is one rollout group's role, the same in both placements
(``rollout.mode``):

* **colocated** (:class:`scale.trainer.Trainer`): every rank of the run generates with its
  engine, then trains; the generator's rounds and the learner's update alternate;
* **disaggregated**: separate processes generate (:func:`main`, started by the learner's
  rank 0), each with its own engine, while the learner's ranks train. Batch ``s`` is sampled
  by policy version :func:`dapo.pipeline.behaviour_version` ``(s, rollout.max_staleness)``
  whatever the timing; the generators take each version from the learner over the bridge
  (:mod:`scale.dist.bridge`) into host memory as soon as it is published, load it into the engine
  when a batch needs it, decide dynamic sampling together over their own group, and send
  their kept groups and the learners' plan to the learner's rank 0.

Every token of a batch carries the version that sampled it (``extras["version"]``), so the
learner can check the staleness bound and report it (``async/*``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dapo import RolloutBatch, config_reward
from dapo.pipeline import behaviour_version, partial_version, versions_needed
from dapo.prompt_selection import PromptSelection, select
from dapo.rewards import score_integer_answer
from dapo.sampling import SamplingWarning

from ..config import RunConfig
from ..dist.topology import Ranks
from .data import PromptStream
from .engines import Generation
from .rollout import GlobalDynamicSampler, batch_state, round_digest


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
        self.pad_id = tokenizer.pad_token_id

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


# ---- the generator process of a disaggregated run ----------------------------------------------


class _Versions:
    """Policy versions received from the learner, kept in host memory until the engine needs
    them (filled by a thread that does nothing but receive, in increasing order)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self.error: BaseException | None = None
        self.floor = 0
        """Versions below this were dropped (a generator never goes back)."""
        self.newest = -1
        """The newest version received."""
        self.finished = False
        """Every version this generator's batches need has been received."""

    def put(self, version: int, tensors: list[tuple[str, torch.Tensor]]) -> None:
        with self.cond:
            self.held[version] = tensors
            self.newest = max(self.newest, version)
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.finished = True
            self.cond.notify_all()

    def fail(self, err: BaseException) -> None:
        with self.cond:
            self.error = err
            self.cond.notify_all()

    def take(self, version: int) -> list[tuple[str, torch.Tensor]]:
        """Version ``version``, waiting for it while it can still arrive; older versions are
        dropped."""
        with self.cond:
            if version < self.floor:
                raise RuntimeError(f"policy version {version} was asked for after version {self.floor}")
            self.floor = version
            while version not in self.held:
                if self.error is not None:
                    raise RuntimeError(f"receiving policy versions failed: {self.error}") from self.error
                if self.newest > version or self.finished:
                    raise RuntimeError(
                        f"waiting for policy version {version}, which can no longer arrive (the "
                        f"learner has sent up to version {self.newest}"
                        f"{' and nothing more is due' if self.finished else ''}); a schedule bug"
                    )
                self.cond.wait(1.0)
            for v in [v for v in self.held if v < version]:
                del self.held[v]
            return self.held[version]


def _engine(
    cfg: RunConfig, index: int, max_model_len: int, tokenizer: Any, shm_ident: str | None = None
) -> Any:
    from .engines import make_engine

    r = cfg.rollout
    if r.engine == "hf":  # its own copy of the model, loaded with each version
        from transformers import AutoModelForCausalLM

        from ..learner.sharding import dtype

        lm = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype(cfg.model.dtype))
        return make_engine(
            "hf", model=lm, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, owns=True
        )
    return make_engine(
        "vllm",
        model_path=cfg.model.path,
        dtype=r.dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_gib=r.kv_cache_gib,
        tensor_parallel=r.tensor_parallel,
        seed=r.seed + index,
        sleep_during_training=False,  # a generator never shares its devices with training
        sync_timeout_s=r.sync_timeout_s,
        distributed=r.tensor_parallel > 1,  # one engine across the generator's processes
        dummy_weights=True,  # the learner's version arrives before the first round
        shm_ident=shm_ident,
    )


def main(argv: list[str] | None = None) -> int:
    """One generator process of a disaggregated run (started by the learner's rank 0)."""
    ap = argparse.ArgumentParser(prog="python -m scale.generator.role")
    ap.add_argument("--run-dir", required=True, help="the run's output.dir (its config.json)")
    ap.add_argument("--addr", required=True, help="the bridge's store (the learner's rank 0)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--index", type=int, required=True, help="this generator, from 0")
    ap.add_argument("--count", type=int, required=True, help="generators in the run")
    ap.add_argument(
        "--tp-rank",
        type=int,
        default=0,
        help="this process within its generator (rollout.tensor_parallel processes, one engine; 0 sends)",
    )
    ap.add_argument(
        "--weights-backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="how versions arrive (the learner's choice, scale.placement.disaggregated.generator_gpus)",
    )
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from ..config import from_dict
    from ..dist import bridge
    from .data import prepare_problems

    cfg = from_dict(json.loads((Path(args.run_dir) / "config.json").read_text()), source="config.json")
    i, n, j, tp = args.index, args.count, args.tp_rank, cfg.rollout.tensor_parallel
    g, procs = i * tp + j, n * tp  # this process among every generator process
    timeout = cfg.train.dist_timeout_s
    kv = bridge.store(args.addr, args.port, is_master=False, members=procs + 1, timeout_s=timeout)
    backend = args.weights_backend
    batches = bridge.group(kv, "batches", g + 1, procs + 1, timeout)
    peers = bridge.group(kv, "generators", g, procs, timeout)
    shm_ident = None
    if tp > 1:  # the generator's processes: a default group of their own for vLLM's external_launcher
        from datetime import timedelta

        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(j)
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            store=dist.PrefixStore(f"dapo-bridge/generator{i}/", kv),
            rank=j,
            world_size=tp,
            timeout=timedelta(seconds=timeout),
        )
        shm_ident = f"dapo-gen{i}-{args.addr.replace('/', '_')}_{args.port}"
    hello = bridge.load(batches.wait("hello", "the learner's start message"))
    first, last, k, learners = hello["first"], hello["last"], hello["k"], hello["learners"]
    floor = hello.get("floor", 0)  # the oldest version the learner can publish (a resume's step)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    d = cfg.data
    train = prepare_problems(
        d.train,
        split=d.train_split,
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        template=d.template,
        chat_template=d.chat_template,
        tokenizer=tokenizer,
        max_prompt_tokens=d.max_prompt_tokens,
        cache_dir=d.cache_dir,
        log=lambda _msg: None,
    )
    stream = PromptStream(train.problems, seed=d.shuffle_seed)
    stream.load_state_dict(hello["stream"])
    versions = _Versions()
    engine = _engine(cfg, i, hello["max_model_len"], tokenizer, shm_ident)
    # the weights group only now that the engine exists (scale.placement.disaggregated GeneratorPool._join_weights)
    batches.post(f"ready/{g}")
    batches.wait("join", "the learner to send its first policy version")
    weights = bridge.group(kv, "weights", g + 1, procs + 1, timeout, backend=backend)

    def receive() -> None:
        try:
            for v in versions_needed(first, last, k, cfg.rollout.partial, floor):
                versions.put(v, bridge.recv_weights(weights, v))
            versions.finish()
        except BaseException as err:  # the main thread reports it
            versions.fail(err)

    receiver = threading.Thread(target=receive, name="dapo-generator-weights", daemon=True)
    receiver.start()
    trace_path = Path(args.run_dir) / "trace" / f"generator{i}.jsonl"
    step = [first]

    def trace(**fields: Any) -> None:
        """``output.trace_rollouts``: per round what this engine was asked for, per batch the
        version it sampled with and a digest of the weights it had loaded."""
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        with trace_path.open("a") as f:
            f.write(json.dumps({"step": step[0], "generator": i, **fields}) + "\n")

    gen = Generator(
        cfg,
        tokenizer=tokenizer,
        prompt_ids=dict(zip((p.prompt for p in train.problems), train.prompt_ids or [])),
        stream=stream,
        engine=engine,
        ranks=Ranks(g, procs, tp),
        comm=bridge.PickledComm(peers),
        trace=trace if cfg.output.trace_rollouts and j == 0 else None,
    )
    loaded = -1

    def switch(b: int) -> Callable[[], int] | None:
        fresh = partial_version(b, k, floor)
        if fresh is None:
            return None

        def load() -> int:
            nonlocal loaded
            engine.sync_weights(iter(tensors := versions.take(fresh)))
            loaded = fresh
            if cfg.output.trace_rollouts and j == 0:
                trace(version=fresh, weights=bridge.digest(tensors), partial=True)
            return fresh

        return load

    for b in range(first, last + 1):
        v = behaviour_version(b, k, floor)
        t0 = time.perf_counter()
        tensors = versions.take(v)
        idle = time.perf_counter() - t0
        step[0] = b
        if loaded != v:
            engine.sync_weights(iter(tensors))
            loaded = v
        if cfg.output.trace_rollouts and j == 0:
            trace(version=v, weights=bridge.digest(tensors))
        t1 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SamplingWarning)
            sampler = gen.rounds(b - 1, v, switch(b) if cfg.rollout.partial else None)
            keys, mine, plan = sampler.kept(learners)
        message: dict[str, Any] = {
            "batch": b,
            "version": v,
            "keys": [list(x) for x in keys],
            "groups": batch_state(mine),
            "stream": stream.state_dict(),
            "idle_s": idle,
            "generate_s": time.perf_counter() - t1,
        }
        if j:  # the leader (tensor-parallel process 0) sends; the others hold the same batch
            continue
        if i == 0:
            message["plan"] = [[list(x) for x in part] for part in plan]
            message["metrics"] = sampler.metrics()
            message["warnings"] = [str(w.message) for w in caught]
        batches.post(f"batch/{b}/{i}")  # the learner receives it as soon as it sees this
        batches.send(message, bridge.LEARNER, f"the learner to take batch {b}")
    receiver.join(timeout)
    if (shutdown := getattr(engine, "shutdown", None)) is not None:
        shutdown()
    if tp > 1:
        import torch.distributed as dist

        if dist.is_initialized():  # vLLM's shutdown may have ended it
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
