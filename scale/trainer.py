"""The full-regime trainer: accelerate (DDP/FSDP) + rollout engines + the shared core.

Two roles, wired here for either placement (``rollout.mode``):

* the **generator** side (:mod:`scale.generator.role`): the prompt stream, the engines, the
  generation rounds and global dynamic sampling (:class:`scale.generator.rollout.GlobalDynamicSampler`);
* the **learner** side (this class): the model on its ranks (DDP or FSDP2), the optimizer,
  :func:`dapo.update`, checkpoints, metrics and health.

Colocated, every rank plays both roles in turn. Per training step, on every rank:

1. generation rounds: each rollout group (the ``rollout.tensor_parallel`` ranks of one engine,
   :class:`scale.dist.topology.Ranks`) takes its slice of ``gen_groups`` prompts from the one
   global prompt stream and generates G responses each, scored with
   :func:`dapo.rewards.score_integer_answer`; the sampler counts the informative groups of all
   ranks after each round, stops every rank together at ``train_groups`` (or the round limit)
   and hands each rank ``train_groups / world`` of them, balanced by tokens;
2. the engine sleeps; the trainer recomputes the sampling policy's log-probs of the kept
   responses (``old_logp``; the engine's stay as ``rollout_logp`` for the mismatch metric
   and the importance weights);
3. :func:`dapo.update` runs the optimizer steps, exact across micro-batches and ranks;
4. the learning-rate schedule steps (linear warm-up, then constant), the engine wakes and
   receives the new weights; metrics go to JSONL (and accelerate trackers);
5. periodic evaluation and checkpoints.

Disaggregated, the run's ranks are learners only: ``rollout.generators`` processes generate
(:class:`scale.placement.disaggregated.GeneratorPool`), batch ``s`` sampled by policy version
``max(0, s - 1 - rollout.max_staleness)`` while the learners train the steps before it; rank 0
receives each batch, checks its staleness and sends each rank its share; after each step every
rank takes part in publishing the new version (steps 2-4 otherwise as above).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dapo import RolloutBatch
from dapo.health.callback import HealthMonitor
from dapo.health.knobs import from_config
from dapo.prompt_selection import PromptSelection, parse_spec
from dapo.sampling import SamplingWarning

from .config import RunConfig
from .dist import bridge, heartbeat, topology
from .dist.hub import CONFIG_FILES, MODEL_FILES, is_hub_id
from .dist.topology import Comm, Ranks, all_max, barrier, make_accelerator, start_wait_reports, waiting_for
from .generator.data import DataError, ProblemSet, PromptStream, contamination, prepare_problems
from .generator.engines import make_engine
from .generator.evaluation import ProblemResult, canonical_prediction, eval_line, summarize
from .generator.role import Generator, empty_groups, seed_from
from .generator.rollout import batch_state, from_state
from .learner import checkpoint as ckpt
from .learner.policy import Policy
from .learner.role import Learner
from .learner.sharding import dtype
from .learner.sync import MIB, SyncStats, stream_weights, sync
from .placement.disaggregated import GeneratorPool, in_flight_to_continue, replan, weights_header


def _trim_jsonl(path: Path, step: int) -> list[dict[str, Any]]:
    """Drop the lines of ``path`` (JSONL, one object per line with ``step``, counted from 1) of
    steps after ``step`` (the steps completed): on resume, the steps that will run again. The
    lines kept ([] without the file)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = [r for r in rows if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return keep


def tracker_config(config: dict[str, Any]) -> dict[str, int | float | str | bool]:
    """The run config as trackers take hyper-parameters: flat ``section.field`` keys and scalar
    values (tensorboard's ``add_hparams`` refuses nested dicts, lists and None)."""
    flat: dict[str, int | float | str | bool] = {}
    for section, fields in config.items():
        for name, value in fields.items() if isinstance(fields, dict) else [("", fields)]:
            key = f"{section}.{name}" if name else section
            flat[key] = (
                value if isinstance(value, (int, float, str, bool)) else json.dumps(value, default=str)
            )
    return flat


def _labelled_barrier(what: str) -> None:
    with waiting_for(what):
        barrier()


PER_RANK_METRICS = ("time/", "sync/")
"""Metrics measured on each rank (the run logs the largest); all others are global."""


class LayoutError(ValueError):
    """The config does not fit this run's processes (said before any model loads)."""


class Trainer:
    def __init__(
        self, cfg: RunConfig, *, resume: str | None = None, accelerator=None, log=print, progress: bool = True
    ):
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.log = log
        self.progress = progress
        self.out = Path(cfg.output.dir)
        self.acc = accelerator or make_accelerator(cfg)
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        try:
            # disaggregated, the learners do not generate: rollout.tensor_parallel is the generators'
            self.ranks = Ranks(self.rank, self.world, 1 if cfg.disaggregated else cfg.rollout.tensor_parallel)
        except ValueError as err:
            raise LayoutError(str(err)) from None
        self.comm = Comm(self.ranks, self.acc.device)
        start_wait_reports(cfg.train.wait_report_s, log, self.rank)
        # rank 0 prepared the output directory (and the tiny preset's files) before it joined the
        # group; creating the group is no barrier where communicators start lazily (NCCL, gloo
        # with TORCH_GLOO_LAZY_INIT=1), so wait for it here, before anything reads them
        _labelled_barrier("rank 0 to prepare the output directory")
        # from here a dead or stopped rank ends every rank within train.heartbeat_timeout_s
        self.heartbeat = heartbeat.start(cfg, self.rank, self.world)
        if self.world > 1 and cfg.train.sharding == "fsdp2" and cfg.rollout.engine == "hf":
            raise LayoutError(
                "rollout.engine=hf generates with the trainer's module, which train.sharding=fsdp2 "
                "shards over ranks that generate different lengths; use rollout.engine=vllm"
            )
        algo = cfg.algo
        if algo.train_groups % self.world:
            raise LayoutError(
                f"algo.train_groups={algo.train_groups} is not divisible by the {self.world} processes"
            )
        if cfg.gen_groups % self.ranks.dp_size:
            raise LayoutError(
                f"rollout.gen_groups={cfg.gen_groups} is not divisible by the {self.ranks.dp_size} rollout "
                f"groups ({self.world} processes / rollout.tensor_parallel={self.ranks.tensor_parallel})"
            )
        torch.manual_seed(cfg.train.seed)

        self._fetch_model_files()
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_id, self.pad_id = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id

        # data first: refuse to start (before allocating a model) if any record is malformed
        train = self._problem_set("data.train", cfg.data.train, cfg.data.train_split)
        self.problems = train.problems
        self._prompt_ids: dict[str, list[int]] = dict(
            zip((p.prompt for p in train.problems), train.prompt_ids or [])
        )
        self.eval_problems = None
        evals = None
        if cfg.data.eval:
            evals = self._problem_set("data.eval", cfg.data.eval, cfg.data.eval_split).head(cfg.eval.limit)
            self.eval_problems = evals.problems
            self._prompt_ids.update(zip((p.prompt for p in evals.problems), evals.prompt_ids or []))
        self.context_len = self._context_len(train, evals)
        # one prompt stream, identical on every rank: each round every rollout group takes its
        # slice of the same draw (no prompt twice in an epoch, whatever the world size)
        self.stream = PromptStream(self.problems, seed=cfg.data.shuffle_seed)
        # algo.prompt_selection: one outcome history, updated on every rank from the same
        # all-gathered reports, so every rank makes the same choices (dapo.prompt_selection)
        self.selection = (
            PromptSelection(parse_spec(cfg.algo.prompt_selection), seed=cfg.data.shuffle_seed)
            if cfg.algo.prompt_selection != "none"
            else None
        )

        # which checkpoint to continue from, refused now if it cannot be (before the model loads)
        resume_from = self._resume_point(resume) if resume else None
        # the learner: the model on its ranks (DDP or FSDP2), its optimizer and schedule
        self.learner = Learner.build(cfg, self.acc, self.pad_id)
        self.step = 0
        self.held: dict[int, list[dict[str, Any]]] = {}
        """Disaggregated, rank 0: batches generated ahead of the step (in flight)."""
        self.totals = {"responses": 0.0, "tokens": 0.0, "optimizer_steps": 0.0, "skipped_steps": 0.0}

        if resume_from is not None:
            self._resume(*resume_from)
        elif resume:
            self.log(f"no checkpoint under {self.out}; starting from scratch")
        elif ckpt.latest(self.out) is not None or (self.out / "metrics.jsonl").is_file():
            raise FileExistsError(
                f"{self.out} holds a previous run (checkpoints or metrics.jsonl); continue it "
                "with --resume auto, or choose another output.dir"
            )
        self.engine = self.gen = self.pool = None
        if not cfg.disaggregated:
            self.engine = self._make_engine()
            self.gen = Generator(
                cfg,
                tokenizer=self.tokenizer,
                prompt_ids=self._prompt_ids,
                stream=self.stream,
                engine=self.engine,
                ranks=self.ranks,
                comm=self.comm,
                trace=self._trace if cfg.output.trace_rollouts else None,
                selection=self.selection,
            )
            self._sync_engine()
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
            self._check_contamination()
            if cfg.output.trackers:
                self.acc.init_trackers("dapo", config=tracker_config(cfg.to_dict()))
        self.health = HealthMonitor(cfg.diagnose.every_steps, knobs=from_config(cfg.to_dict()))
        self.health.extend(self._trim_metrics_log())
        _trim_jsonl(self._trace_path(), self.step)  # each rank its own trace

    # ---- setup helpers ----------------------------------------------------------------
    def _fetch_model_files(self) -> None:
        """A model named by hub id: each node's local rank 0 fetches what its ranks read (rank 0
        the weights too) into the node's hub cache, and the others, offline, wait for it."""
        path = self.cfg.model.path
        if not is_hub_id(path):
            return
        if self.acc.is_local_main_process:
            from huggingface_hub import snapshot_download

            snapshot_download(repo_id=path, allow_patterns=MODEL_FILES if self.rank == 0 else CONFIG_FILES)
        if self.world > 1:
            _labelled_barrier(f"local rank 0 to fetch {path} from the hub")

    def _unwrapped(self) -> Policy:
        return self.learner.unwrapped

    def _sync_engine(self) -> SyncStats:
        """Stream the weights into the engine, one bounded bucket at a time (:mod:`scale.learner.sync`)."""
        r = self.cfg.rollout
        return sync(
            self.engine,
            self.learner.lm,
            dtype=dtype(r.dtype),
            device=self.acc.device,
            bucket_mb=r.sync_bucket_mb,
        )

    def _ensure_pool(self, end: int) -> None:
        """Disaggregated: generator processes for the batches up to step ``end`` and the k after
        it (in flight at the checkpoint of step ``end``), starting after the batches held."""
        c = self.cfg
        k = c.rollout.max_staleness
        last = min(end + k, c.train.steps)
        if self.pool is not None:
            if self.pool.last >= last:
                return
            self.pool.close()
            if self.rank == 0:
                self.held.update(self.pool.received)
        first = self.step + 1 + all_max(len(self.held), self.acc.device)
        if self.rank == 0 and self.pool is None:  # a resumed run's traces: drop what runs again
            for path in (self.out / "trace").glob("generator*.jsonl"):
                _trim_jsonl(path, first - 1)
            _trim_jsonl(self.out / "trace" / "weights.jsonl", self.step - 1)
        self.pool = GeneratorPool(
            c,
            rank=self.rank,
            learners=self.world,
            first=first,
            last=last,
            stream_state=self.stream.state_dict()
            if not self.held
            else self.held[max(self.held)][-1]["stream"],
            max_model_len=self.context_len,
            floor=self.step,  # no older version exists here (a resumed run's checkpoint step)
            log=self.log,
        )
        if self.rank == 0:
            self.pool.restore(self.held)
        self.held = {}
        self._publish(self.step)

    def _publish(self, version: int) -> dict[str, float]:
        """Disaggregated: send policy ``version`` to the generators if a batch needs it."""
        assert self.pool is not None
        r = self.cfg.rollout
        dt = dtype(r.dtype)
        stats = SyncStats()
        t0 = time.perf_counter()
        sent_tensors: list[tuple[str, torch.Tensor]] = []
        traced = self.cfg.output.trace_rollouts and self.rank == 0

        def named() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in stream_weights(
                self.learner.lm,
                dtype=dt,
                device=self.acc.device,
                bucket_bytes=int(r.sync_bucket_mb * MIB),
                stats=stats,
            ):
                if traced:
                    sent_tensors.append((name, t.cpu()))
                yield name, t

        sent = self.pool.publish(version, named, weights_header(self.learner.lm, dt))
        stats.seconds = time.perf_counter() - t0
        if sent and traced:  # what the generators must report having loaded
            path = self.out / "trace" / "weights.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(
                    json.dumps({"step": version, "version": version, "weights": bridge.digest(sent_tensors)})
                    + "\n"
                )
        return stats.metrics() if sent else {}

    def _make_engine(self):
        c = self.cfg
        if c.rollout.engine == "hf":
            return make_engine("hf", model=self._unwrapped().lm, eos_id=self.eos_id, pad_id=self.pad_id)
        return make_engine(
            "vllm",
            model_path=c.model.path,
            dtype=c.rollout.dtype,
            max_model_len=self.context_len,
            gpu_memory_utilization=c.rollout.gpu_memory_utilization,
            kv_cache_gib=c.rollout.kv_cache_gib,
            tensor_parallel=c.rollout.tensor_parallel,
            seed=c.rollout.seed + self.ranks.dp_rank,
            sleep_during_training=c.rollout.sleep_during_training,
            sync_timeout_s=c.rollout.sync_timeout_s,
            distributed=self.world > 1,
            dummy_weights=True,  # the first sync follows at once
        )

    def _context_len(self, train: ProblemSet, evals: ProblemSet | None) -> int:
        """The engine's context: ``rollout.max_model_len``, each prompt of both sets checked to
        fit with its response ceiling (refused by row, before any model loads); else the
        longest prompt of the whole prepared set plus its ceiling, training or evaluation."""
        c = self.cfg
        sets = [(train, c.algo.max_len, "algo.max_len")]
        if evals is not None:
            sets.append((evals, c.eval.max_new_tokens or c.algo.max_len, "eval.max_new_tokens"))
        if c.rollout.max_model_len:
            problems = []
            for ps, ceiling, name in sets:
                try:
                    ps.check_context(ceiling, c.rollout.max_model_len, name)
                except DataError as err:
                    problems += err.problems
            if problems:
                raise DataError(problems)
            return c.rollout.max_model_len
        return max(ps.longest_prompt() + ceiling for ps, ceiling, _ in sets)

    def _check_contamination(self) -> None:
        n = self.cfg.data.contamination_ngram
        if not n or not self.eval_problems:
            return
        hits = contamination(self.problems, self.eval_problems, n=n)
        (self.out / "contamination.json").write_text(json.dumps([asdict(h) for h in hits], indent=2))
        if hits:
            rows = sorted({h.eval_row for h in hits})
            self.log(
                f"warning: {len(hits)} train/eval prompt pair(s) share {n}-grams (eval rows {rows[:10]}"
                f"{'...' if len(rows) > 10 else ''}); see {self.out / 'contamination.json'}"
            )

    def _encode(self, prompt: str) -> list[int]:
        """A prompt's token ids, as :func:`scale.generator.data.prepare_problems` encoded them."""
        return self._prompt_ids[prompt]

    def _problem_set(self, field: str, spec: str, split: str) -> ProblemSet:
        """The unique problems of ``spec``, prepared once per node: local rank 0 reads, validates,
        templates and tokenises (and fills ``data.cache_dir``); the node's other ranks then read
        the cache. Without a cache every rank prepares the set itself."""
        d = self.cfg.data

        def prepare() -> ProblemSet:
            return prepare_problems(
                spec,
                split=split,
                prompt_key=d.prompt_key,
                answer_key=d.answer_key,
                template=d.template,
                chat_template=d.chat_template,
                tokenizer=self.tokenizer,
                max_prompt_tokens=d.max_prompt_tokens,
                cache_dir=d.cache_dir,
                log=self.log,
            )

        # local rank 0 first when there is a cache to fill or a hub to read (the node's other
        # ranks then read the cache, or the hub cache offline: scale.dist.hub.hub_environment)
        ordered = d.cache_dir is not None or is_hub_id(spec)
        first = self.acc.is_local_main_process or not ordered
        ps, failure = None, None
        if first:
            try:
                ps = prepare()
            except (DataError, FileNotFoundError) as err:
                failure = err
        if self.world > 1 and ordered:  # the others wait for local rank 0
            with waiting_for(f"local rank 0 to prepare {spec}"):
                failed = all_max(int(failure is not None), self.acc.device)
            if failure is None and failed:
                raise DataError([(spec, 0, "<file>", "not prepared: see local rank 0's error")])
        if failure is not None:
            raise failure
        if ps is None:
            ps = prepare()
        if self.acc.is_main_process:
            self.log(f"{field}: {ps.summary()}")
        return ps

    # ---- rollouts ---------------------------------------------------------------------
    def collect(self) -> tuple[RolloutBatch | None, dict[str, float]]:
        """Generation rounds until the informative groups of all ranks fill the batch; this
        rank's balanced share of it (colocated), or its share of what the generator processes
        sent (disaggregated)."""
        if self.pool is not None:
            return self._collect_remote()
        assert self.gen is not None
        t0 = time.perf_counter()
        sampler = self.gen.rounds(self.step, self.step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SamplingWarning)
            batch = sampler.take()
        for w in caught:
            if self.acc.is_main_process:
                self.log(f"step {self.step + 1}: {w.message}")
        if self.cfg.output.trace_rollouts:  # what this rank trains on
            self._trace(
                share_groups=batch.num_groups if batch is not None else 0,
                share_tokens=int(batch.mask.sum()) if batch is not None else 0,
            )
        m = sampler.metrics()
        m["time/generate_s"] = time.perf_counter() - t0
        return batch, m

    def _collect_remote(self) -> tuple[RolloutBatch | None, dict[str, float]]:
        """Disaggregated: rank 0 takes batch ``step + 1`` from the generators (its staleness
        checked), splits it as their plan says and sends each learner rank its share."""
        assert self.pool is not None
        step = self.step + 1
        outgoing: dict[int, bytes] = {}
        m: dict[str, float] = {}
        taken = f"pool{self.pool.serial}/taken/{step}"
        if self.rank != 0:  # rank 0 may wait a generation round: wait on the host, not in the all-gather
            topology.wait_announced(taken, f"rank 0 to take batch {step} from the generators")
        if self.rank == 0:
            msgs, idle = self.pool.take(step)
            topology.announce(taken)
            self.stream.load_state_dict(msgs[-1]["stream"])
            m = dict(msgs[0]["metrics"])
            for line in msgs[0].get("warnings", []):
                self.log(f"step {step}: {line}")
            g = self.cfg.algo.group_size
            rows: dict[tuple[int, ...], tuple[RolloutBatch, int]] = {}
            ages = []
            for msg in msgs:
                if msg["groups"] is None:
                    continue
                b = from_state(msg["groups"])
                ages.append((step - 1) - b.extras["version"][b.mask].long())
                for j, key in enumerate(msg["keys"]):
                    rows[tuple(key)] = (b, j)
            for dst, keys in enumerate(msgs[0]["plan"]):
                parts = [
                    rows[tuple(k)][0].select(
                        torch.arange(rows[tuple(k)][1] * g, (rows[tuple(k)][1] + 1) * g), group_size=g
                    )
                    for k in keys
                ]
                if parts:
                    outgoing[dst] = bridge.dump(batch_state(RolloutBatch.concat(parts)))
            age = torch.cat(ages) if ages else torch.zeros(0, dtype=torch.long)
            m["async/staleness_mean"] = float(age.float().mean()) if age.numel() else math.nan
            m["async/staleness_max"] = float(age.max()) if age.numel() else math.nan
            m["async/trainer_idle_s"] = idle
            m["async/generator_idle_s"] = max(float(x["idle_s"]) for x in msgs)
            m["async/tokens_in_flight"] = float(self.pool.tokens_in_flight())
            m["time/generate_s"] = max(float(x["generate_s"]) for x in msgs)
        sizes = self.comm.all_gather(
            {dst: len(b) for dst, b in outgoing.items()}, f"the batch layout of step {step}"
        )
        incoming = {0: sizes[0][self.rank]} if self.rank in sizes[0] else {}
        got = self.comm.exchange(outgoing, incoming, f"this rank's share of batch {step}")
        batch = from_state(bridge.load(got[0])) if got else None
        if self.cfg.output.trace_rollouts:
            self._trace(
                share_groups=batch.num_groups if batch is not None else 0,
                share_tokens=int(batch.mask.sum()) if batch is not None else 0,
            )
        return batch, m

    def _trace_path(self) -> Path:
        return self.out / "trace" / f"rank{self.rank}.jsonl"

    def _trace(self, **fields: Any) -> None:
        """``output.trace_rollouts``: one line per generation round (what this rank's engine was
        asked for: the members of a rollout group write the same) and one per step (this rank's
        share of the batch: groups and response tokens)."""
        path = self._trace_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "step": self.step + 1,  # the step being made, numbered as printed and in metrics.jsonl
            **{k: getattr(self.ranks, k) for k in ("rank", "dp_rank", "tp_rank")},
            **fields,
        }
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    # ---- update -------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        c = self.cfg
        t0 = time.perf_counter()
        batch, m = self.collect()
        # equal group counts on every rank (dynamic sampling may leave them unequal)
        per_rank = c.algo.train_groups // self.world
        have = batch.num_groups if batch is not None else 0
        t_len = batch.mask.shape[1] if batch is not None else 1
        t_len, need = all_max(t_len, self.acc.device), all_max(have, self.acc.device)
        need = max(need, 1 if per_rank else 0)
        if have < need:
            pad = empty_groups(need - have, c.algo.group_size, t_len, self.pad_id)
            batch = pad if batch is None else RolloutBatch.concat([batch, pad])
        if self.engine is not None:
            self.engine.sleep()
        t1 = time.perf_counter()
        m.update(self.learner.step(batch))
        t2 = time.perf_counter()
        m.update(self._publish(self.step + 1) if self.pool is not None else self._sync_engine().metrics())
        m["time/update_s"] = t2 - t1
        m["time/sync_s"] = time.perf_counter() - t2
        m["time/step_s"] = time.perf_counter() - t0
        return m

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        if not self.eval_problems:
            return {}
        e, algo = self.cfg.eval, self.cfg.algo
        me = self.ranks  # rollout groups split the problems; their members generate together
        mine = self.eval_problems[me.dp_rank :: me.dp_size]
        gens = (
            self.engine.generate(
                [self._encode(p.prompt) for p in mine],
                n=e.k,
                max_tokens=e.max_new_tokens or algo.max_len,
                temperature=e.temperature,
                top_p=e.top_p,
                seeds=[
                    seed_from("eval", self.step, i)
                    for i in range(me.dp_rank, len(self.eval_problems), me.dp_size)
                ],
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
            results if me.tp_rank == 0 else [], f"the other rollout groups' evaluation at step {self.step}"
        )
        # back in the problems' own order (rollout group d held problems d, d + dp_size, ...), so
        # the bootstrap intervals do not depend on the number of processes
        parts = [everything[d * me.tensor_parallel] for d in range(me.dp_size)]
        flat = [parts[i % me.dp_size][i // me.dp_size] for i in range(sum(map(len, parts)))]
        return summarize(flat) if flat else {}

    # ---- the loop --------------------------------------------------------------------------
    def _reduce_metrics(self, m: dict[str, float]) -> dict[str, float]:
        """One line for the whole run. Timings and sync figures are per rank (the slowest rank
        counts); every other metric is global by construction (token-weighted sums over all
        ranks, or the same all-gathered reports), so rank 0's value stands for all. A global
        metric that differs across ranks is a bug: it is logged."""
        if self.world == 1:
            return m
        parts = self.comm.all_gather(m, f"the metrics of step {self.step + 1}")
        out = {}
        for k in sorted({k for p in parts for k in p}):
            vals = [p[k] for p in parts if k in p and not (isinstance(p[k], float) and math.isnan(p[k]))]
            if k.startswith(PER_RANK_METRICS):
                out[k] = max(vals) if vals else math.nan
                continue
            out[k] = parts[0].get(k, math.nan)
            if self.acc.is_main_process and vals and max(vals) - min(vals) > 1e-6 * max(1.0, abs(vals[0])):
                self.log(
                    f"step {self.step + 1}: warning: metric {k} differs across ranks ({min(vals)} .. {max(vals)})"
                )
        return out

    def _metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def _trim_metrics_log(self) -> list[dict[str, float]]:
        """On resume, drop lines of steps that will run again (nothing duplicated or lost);
        the rows kept."""
        return _trim_jsonl(self._metrics_path(), self.step) if self.acc.is_main_process else []

    def _write_metrics(self, m: dict[str, float]) -> None:
        if not self.acc.is_main_process:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
        with self._metrics_path().open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.cfg.output.trackers:
            self.acc.log(
                {k: v for k, v in m.items() if isinstance(v, (int, float)) and math.isfinite(v)},
                step=int(m["step"]),
            )

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Run to ``train.steps`` (or ``steps`` more steps); returns this call's metrics."""
        c = self.cfg
        end = c.train.steps if steps is None else min(c.train.steps, self.step + steps)
        history = []
        from dapo.progress import Progress

        # a bar on a terminal; in a redirected log a plain line per step, at most one per 30 s
        if c.disaggregated:
            self._ensure_pool(end)
        bar = Progress(end, "dapo train", enabled=self.acc.is_main_process and self.progress, start=self.step)
        while self.step < end:
            m = self._reduce_metrics(self.train_step())
            self.totals["responses"] += m["sampling/generated_groups"] * c.algo.group_size
            self.totals["tokens"] += m["sampling/generated_tokens"]
            self.totals["optimizer_steps"] += m["actor/optimizer_steps"]
            self.totals["skipped_steps"] += m["actor/skipped_steps"]
            if m["actor/skipped_steps"] and self.acc.is_main_process:
                self.log(
                    f"step {self.step + 1}: skipped {m['actor/skipped_steps']:.0f} optimizer step(s) with a "
                    "non-finite loss or gradient; weights left unchanged for them"
                )
            m.update({f"cost/{k}_total": v for k, v in self.totals.items()})
            self.step += 1
            m["step"] = self.step  # steps count from 1: the number printed, logged and checkpointed
            if c.eval.every and self.step % c.eval.every == 0:
                scores = self.evaluate()
                m.update(scores)
                if scores and self.acc.is_main_process:
                    bar.clear()
                    self.log(f"step {self.step}: {eval_line(scores)}")
            verdicts, change = self.health.observe(m)
            m.update(verdicts)
            if change and self.acc.is_main_process:
                bar.clear()
                self.log(f"step {self.step}: {change}")
            self._write_metrics(m)
            history.append(m)
            bar.update(
                self.step,
                f"acc={m.get('rollout/accuracy', math.nan):.3f} ent={m.get('actor/entropy', math.nan):.3f}",
            )
            if (c.output.checkpoint_every and self.step % c.output.checkpoint_every == 0) or self.step == end:
                self.save()
        bar.close()
        # the trackers' files closed; not accelerate's end_training(), which also destroys the
        # process group while the engine's groups and the checkpoint barrier still need it
        for tracker in self.acc.trackers if c.output.trackers else []:
            tracker.finish()
        return history

    def close(self) -> None:
        """Drop the wrapped model, the optimizer and the engine, and accelerate's references to
        them, so that the process group can really be freed (see :mod:`scale.dist.topology`). The
        engine is shut down first, while the group it was built on still exists."""
        if self.heartbeat is not None:  # done: the peers must not take this rank's exit for a death
            self.heartbeat.stop()
        if (shutdown := getattr(self.engine, "shutdown", None)) is not None:
            shutdown()
        if self.pool is not None:
            self.pool.close()
        self.acc.free_memory()
        self.learner = self.engine = None  # type: ignore[assignment]

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self) -> Path:
        """A sharded checkpoint, written by every rank (:mod:`scale.learner.checkpoint`)."""
        trainer_state = {
            "step": self.step,
            "totals": self.totals,
            "world_size": self.world,
            "config": self.cfg.to_dict(),
        }

        def hf_save(d: Path) -> None:
            self.learner.lm.config.save_pretrained(d)
            self.tokenizer.save_pretrained(d)

        return self.learner.save(
            self.out,
            self.step,
            rank_state=self._rank_state(),
            trainer_state=trainer_state,
            hf_save=hf_save,
            rank=self.rank,
            keep=self.cfg.output.keep_checkpoints,
            barrier=lambda: _labelled_barrier(f"the other ranks' checkpoint step_{self.step}"),
        )

    def _rank_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rank: its RNG and the prompt stream's position.
        Disaggregated, rank 0 also keeps the batches in flight (sampled for the k steps after
        this one by versions the checkpoint no longer holds) and the stream's position after
        them, where the generators continue."""
        state: dict[str, Any] = {"rng": ckpt.rng_state(), "stream": self.stream.state_dict()}
        if self.selection is not None:
            state["selection"] = self.selection.state_dict()
        held_key = f"pool{self.pool.serial}/held/{self.step}" if self.pool is not None else ""
        if self.pool is not None and self.rank != 0:  # rank 0 waits for k batches: on the host here
            topology.wait_announced(
                held_key, f"rank 0 to receive the batches in flight after step {self.step}"
            )
        if self.pool is not None and self.rank == 0:
            held = self.pool.in_flight(self.step)
            topology.announce(held_key)
            state["in_flight"] = held
            state["stream_at_step"] = state["stream"]  # before the held batches' prompts
            if held:
                state["stream"] = held[max(held)][-1]["stream"]
        return state

    def _resume_point(self, resume: str) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint ``--resume`` names and its trainer state (None: nothing to resume);
        :class:`scale.learner.checkpoint.ResumeError` if this run cannot continue it."""
        path = ckpt.latest(self.out) if resume == "auto" else Path(resume)
        if path is None:
            return None
        state = ckpt.load_trainer_state(path)
        written = state.get("config", {}).get("train", {}).get("sharding", self.cfg.train.sharding)
        if written != self.cfg.train.sharding:
            raise ckpt.ResumeError(
                f"--resume: {path} was written with train.sharding={written} and this run has "
                f"train.sharding={self.cfg.train.sharding}; resume it with train.sharding={written}"
            )
        # a history belongs to its policy (checked here, before the model loads)
        mine = self.cfg.algo.prompt_selection.partition(":")[0]
        theirs = str(state.get("config", {}).get("algo", {}).get("prompt_selection", "none")).partition(":")[
            0
        ]
        if mine != "none" and theirs not in ("none", mine):
            raise ckpt.ResumeError(
                f"--resume: {path}: the checkpoint's prompt selection is {theirs!r}, this run's {mine!r}; "
                f"resume it with algo.prompt_selection={theirs}"
            )
        return path, state

    def _continue_in_flight(self, path: Path, state: dict[str, Any], zero: dict[str, Any]) -> None:
        """The batches a disaggregated checkpoint held (sampled for the steps after it): kept
        where this run may train them, else dropped with the prompt stream put back where they
        began, so that their prompts are drawn again (nothing skipped). Colocated runs generate
        each batch with the current weights and keep none; a smaller k keeps those still within
        it (:func:`scale.placement.disaggregated.in_flight_to_continue`); another number of learner ranks
        splits them again (:func:`scale.placement.disaggregated.replan`)."""
        held = {int(b): msgs for b, msgs in zero.get("in_flight", {}).items()}
        if not held:
            return
        written = state.get("config", {}).get("rollout", {})
        k = self.cfg.rollout.max_staleness if self.cfg.disaggregated else -1
        kept, dropped = in_flight_to_continue(held, self.step, k) if k >= 0 else ({}, sorted(held))
        if dropped:
            if kept:
                self.stream.load_state_dict(kept[max(kept)][-1]["stream"])
            elif "stream_at_step" in zero:
                self.stream.load_state_dict(zero["stream_at_step"])
            else:
                raise ckpt.ResumeError(
                    f"--resume: {path} holds batches {sorted(held)} in flight but not the prompt "
                    "stream's position before them (an older checkpoint); resume it with "
                    f"rollout.mode={written.get('mode', 'disaggregated')} "
                    f"rollout.max_staleness={written.get('max_staleness', 0)}"
                )
            if self.rank == 0:
                why = (
                    "rollout.mode=colocated generates each batch with the current weights"
                    if k < 0
                    else f"their tokens are older than rollout.max_staleness={k} allows"
                )
                self.log(
                    f"{path}: batch(es) {dropped} held in flight are sampled again ({why}); "
                    "their prompts are drawn again from the same place of the prompt stream"
                )
        if self.rank == 0:
            for msgs in kept.values():
                if len(msgs[0]["plan"]) != self.world:
                    msgs[0]["plan"] = replan(msgs, self.world, self.cfg.algo.group_size)
            self.held = kept  # the other ranks learn their count where the pool starts

    def _resume(self, path: Path, state: dict[str, Any]) -> None:
        self.learner.load(path)
        written = int(state["world_size"])
        # the RNG streams are per rank and carry over only to the same world size; the prompt
        # stream is the same on every rank, and rank 0's position (the one a disaggregated run
        # advances) serves any world size
        mine = ckpt.load_tensors(path, f"rank{self.rank if written == self.world else 0}.pt")
        if written == self.world:
            ckpt.set_rng_state(mine["rng"])
        zero = mine if self.rank == 0 or written != self.world else ckpt.load_tensors(path, "rank0.pt")
        self.stream.load_state_dict(zero["stream"])
        self.step = int(state["step"])
        self._continue_in_flight(path, state, zero)
        if self.selection is not None:  # its policy was checked by _resume_point
            if "selection" in mine:
                self.selection.load_state_dict(mine["selection"])
            else:
                self.log(f"{path} holds no prompt-selection history: algo.prompt_selection starts from none")
        self.totals = {k: float(v) for k, v in state["totals"].items()}
        moved = (
            f" (written by {written} processes, resharded onto {self.world})" if written != self.world else ""
        )
        self.log(f"resumed from {path} at step {self.step}{moved}")
