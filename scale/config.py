"""Run configuration of the full regime: YAML -> dataclasses that reject unknown keys.

A run file has one section per dataclass below plus ``algo`` (the core's
:class:`dapo.config.AlgoConfig`). Every field is documented where it is declared. Loading
uses ``yaml.safe_load`` only; overrides are ``section.field=value`` strings whose value is
parsed as YAML.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.config import AlgoConfig, ConfigError
from dapo.config import from_dict as algo_from_dict

PRESET_DIR = Path(__file__).parent / "configs"


QWEN2_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Qwen2 decoder block: attention (q, k, v, o) and MLP (gate, up, down)."""


@dataclass(frozen=True)
class LoraConfig:
    """A LoRA policy (``model.lora``): low-rank adapters trained on the learner through PEFT,
    the base weights frozen (:mod:`scale.learner.lora`). ``rank: 0`` is full fine-tuning.

    The engine always receives the merged weights ``W + (alpha / rank) * B @ A`` under the base
    model's names (the weight sync merges them bucket by bucket, as TRL does); a checkpoint
    holds the adapters and their optimizer state, not the frozen base (read again from
    ``model.path`` on resume); ``dapo export`` writes the merged model. Set on the command line
    as ``model.lora.rank=8`` (any field: ``model.lora.<field>=value``)."""

    rank: int = 0
    """r, the adapters' rank; 0: no adapters, every weight trained (full fine-tuning)."""
    alpha: float | None = None
    """The LoRA scaling numerator: the update is ``(alpha / rank) * B @ A``. None: ``2 * rank``
    (a scale of 2, a common choice for RL with LoRA)."""
    target_modules: tuple[str, ...] = QWEN2_PROJECTIONS
    """Names of the linear layers that get adapters (PEFT's ``target_modules``: a module whose
    name ends with one of them). Default: every attention and MLP projection of a Qwen2 block;
    embeddings and the (tied) output layer are never adapted."""
    dropout: float = 0.0
    """Dropout on the adapters' input during training (PEFT's ``lora_dropout``). 0 keeps the
    trainer's log-probs deterministic, so the recomputed old log-probs equal the engine's."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def lora_alpha(self) -> float:
        """``alpha``, or ``2 * rank`` when it is not set."""
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    def validate(self, section: str = "model.lora") -> None:
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(f"{section}.rank", f"must be an integer >= 0 (0: no LoRA; got {self.rank!r})")
        if self.alpha is not None and not self.alpha > 0:
            raise ConfigError(f"{section}.alpha", f"must be > 0 or null (2 * rank; got {self.alpha!r})")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"{section}.dropout", f"must lie in [0, 1) (got {self.dropout!r})")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ConfigError(
                f"{section}.target_modules",
                f"must be a non-empty list of module names (got {list(self.target_modules)!r})",
            )


@dataclass(frozen=True)
class ModelConfig:
    path: str
    """A local directory or a hub id of a causal LM with its tokenizer (Qwen2.5 family)."""
    dtype: str = "float32"
    """Dtype of the trainer's master weights and optimizer state. ``float32`` (the default,
    as verl and TRL keep them): at lr 1e-6 a bf16 weight cannot hold most updates (about 2%
    of bf16 weights move in 20 AdamW steps). Compute precision is ``train.mixed_precision``;
    the engine's dtype is ``rollout.dtype``."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (needed for 20k-token responses)."""
    logprob_chunk: int = 1024
    """Tokens per chunk of the memory-bounded log-prob/entropy computation."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (:class:`LoraConfig`; ``rank: 0``, the
    default, trains every weight)."""


@dataclass(frozen=True)
class DataConfig:
    train: str
    """Training prompts: a ``.jsonl``/``.json``/``.parquet`` file or a hub dataset id."""
    eval: str | None = None
    """Evaluation set (AIME-style integer answers), same formats; None disables evaluation."""
    train_split: str = "train"
    """Split of a hub dataset (ignored for local files)."""
    eval_split: str = "train"
    """Split of the evaluation set when it is a hub dataset (ignored for local files)."""
    prompt_key: str | None = None
    """Field holding the problem; None detects ``prompt`` / ``problem`` / ``question`` (a
    chat-format list takes its last user message)."""
    answer_key: str | None = None
    """Field holding the integer answer; None detects ``answer``, ``reward_model.ground_truth``."""
    template: str = "dapo"
    """``dapo``: wrap problems in the paper's "Answer:" instruction unless already present;
    ``none``: use the prompt as is."""
    chat_template: bool | str = True
    """``true`` (as verl's DAPO recipe): the tokenizer's own chat template, applied as
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` to the
    record's messages (a chat-list prompt keeps all of them, a system message too; the
    instruction template goes into the last user message); ``false``: the prompt as plain
    text; a path: a Jinja chat template file used instead of the tokenizer's. ``true`` with a
    tokenizer that has no template is an error, never a silent fallback."""
    cache_dir: str | None = "~/.cache/dapo/data"
    """Where the prepared sets (validated, templated, de-duplicated, tokenised) are cached, in
    files named by a hash of the data file's bytes (a hub dataset's fingerprint), the
    tokenizer, the chat template and the options above; a later start reads the file instead.
    ``null``: no cache. Writes are atomic, so ranks and nodes may share the directory."""
    max_prompt_tokens: int = 2048
    """Prompts longer than this are reported as malformed (never silently cut)."""
    contamination_ngram: int = 13
    """Word n-gram size of the train/eval overlap check; 0 disables it."""
    shuffle_seed: int = 0
    """Seed of the epoch-wise shuffle of training prompts."""


PLACEMENTS = ("colocated", "disaggregated")
"""The built-in placements (``rollout.mode``; :data:`scale.placement.interface.BUILT_IN` builds them)."""


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "vllm"
    """``vllm`` or ``hf`` (transformers generate)."""
    mode: str = "colocated"
    """``colocated``: every rank generates with its own engine, then trains (the engine sleeps
    during the update). ``disaggregated``: the run's ranks only train; ``generators`` other
    processes (started by rank 0, or on nodes of their own: ``generator_nodes``) only
    generate, each with its own engine, and take each new policy version over a process group
    that spans both (:mod:`scale.dist.bridge`)."""
    generators: int = 1
    """Generator processes of a disaggregated run (each one rollout group with its own engine)."""
    generator_nodes: int = 0
    """Where a disaggregated run's generators run. 0: on the learner rank 0's node, started by
    it, on the GPUs after the learners'. N >= 1: on N nodes of their own, ``generators / N``
    per node (N must divide ``generators``), each started by an agent the cluster's launcher
    runs there (:mod:`scale.placement.generator_node`; ``dapo launch`` writes it, ``dapo plan``
    times the weights crossing the network). ``output.dir`` must be on a shared file system."""
    max_staleness: int = 0
    """k: batch s is sampled by policy version max(0, s - 1 - k) (:mod:`dapo.pipeline`), so
    generation of the next k batches overlaps training and no token is more than k versions
    old. 0: synchronous. Above 0 needs ``mode: disaggregated``. See the toys' table of
    tolerated staleness (reports/off_policy) before choosing it."""
    partial: bool = False
    """Partial rollouts (needs ``max_staleness >= 1``): in each batch, the first round's
    responses stop after ``partial_tokens`` tokens, the generator loads the next policy version
    (interrupted by the weight update, as AReaL and verl's fully-async trainer do), and those
    still running continue under it; every later token of the batch is sampled by that
    version. Finished tokens keep their version, so long responses train on fresher tokens
    and the bound k holds for every token. The cut is a token count, not a time, so a run
    stays reproducible."""
    partial_tokens: int = 256
    """Tokens of each response sampled by the batch's own version before the update (the
    paper's 20k-token runs: a small fraction of the ceiling)."""
    correction: str = "auto"
    """The off-policy correction when ``max_staleness > 0`` (:data:`dapo.offpolicy.CORRECTIONS`):
    ``auto`` keeps the algo section's own correction and, where it sets none, uses ``token_tis``
    (token-level truncated IS capped at 2, verl's default: tolerated up to k = 8 in the toys' table,
    with and without partial rollouts, where ``seq_tis`` is tolerated up to k = 1 only, its entropy
    falling 0.03-0.04 at k = 2; reports/off_policy);
    ``keep`` leaves the algo section as written; a preset name replaces its correction fields."""
    gen_groups: int | None = None
    """Prompts per generation round (over-sampling for dynamic sampling); None: the
    algorithm's ``train_groups``."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; must be 1.0 (see :meth:`RunConfig.validate`)."""
    top_p: float = 1.0
    """Nucleus sampling of training rollouts; must be 1.0."""
    tensor_parallel: int = 1
    """Ranks per vLLM engine (tensor parallelism; the paper's 32B run: 4). Consecutive ranks
    form a rollout group that shares prompts, seeds and every round decision; it must divide
    the number of processes. Runs on CPUs too (vLLM-CPU, ``nox -s rehearsal``). With
    ``mode: disaggregated`` each generator is this many processes, one engine across them."""
    gpu_memory_utilization: float = 0.5
    """vLLM's memory fraction for weights + KV cache (on CPU: of the first NUMA node's RAM,
    less what the process already holds; see ``kv_cache_gib``)."""
    kv_cache_gib: float | None = None
    """An explicit KV-cache size (GiB) instead of the fraction. The CPU presets set it: on
    vLLM-CPU the fraction counts against one NUMA node's memory minus the whole process's
    resident set, so the same fraction starts on one machine and fails on another."""
    sleep_during_training: bool = True
    """Put the vLLM engine to sleep during the update to free GPU memory (GPU only)."""
    sync_timeout_s: float = 600.0
    """A weight sync that takes longer ends the run with an error."""
    max_model_len: int | None = None
    """vLLM context length; None: longest prompt + the generation ceiling."""
    seed: int = 0
    """Base seed of the engine (each request gets its own seed from the run coordinates)."""
    dtype: str = "bfloat16"
    """Dtype of the engine's weights (``bfloat16`` on GPUs; the tiny CPU presets use
    ``float32``). The sync casts each trainer tensor to it, one tensor at a time."""
    sync_bucket_mb: float = 512.0
    """Upper bound of the weights the sync gathers at once (MiB); a tensor larger than this
    goes alone. The sync's extra memory is at most a bucket (plus its dtype cast), never the
    model."""
    delta_sync: bool = False
    """``rollout.mode: disaggregated``: send each policy version to the generators as the
    elements whose bits changed since the version before, where that is smaller than the
    tensor (:mod:`scale.dist.delta`; bit-exact). Costs a copy of the model in the engine's
    dtype in the host memory of the learner's rank 0 (``dapo plan`` counts it). Logged as
    ``sync/sent_bytes`` against ``sync/bytes`` and ``sync/changed_fraction``."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    """Training steps (rollout batches)."""
    lr: float = 1e-6
    """AdamW learning rate, constant after warm-up (the paper: 1e-6)."""
    warmup_steps: int = 20
    """Linear warm-up, in training steps (the paper: 20 rollout steps)."""
    weight_decay: float = 0.1
    """AdamW weight decay (the paper: 0.1)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (beta1, beta2)."""
    micro_batch_size: int = 4
    """Responses per forward/backward (memory only; the update is exact for any value)."""
    seed: int = 0
    """Seed of torch's global RNG on every rank and of LoRA's adapter initialisation."""
    mixed_precision: str = "no"
    """Compute precision of forward and backward: ``no`` (the master dtype) or ``bf16``
    (bf16 autocast under DDP; FSDP2's ``MixedPrecisionPolicy`` with bf16 parameters and fp32
    gradient reduction under ``sharding: fsdp2``). Master weights stay ``model.dtype``."""
    sharding: str = "none"
    """``none``: every rank holds the whole model (DDP over ranks); ``fsdp2``: parameters,
    gradients and optimizer state sharded over all ranks with ``torch.distributed.fsdp.
    fully_shard`` (one unit per decoder layer, then the root). The same setting holds under
    torchrun, accelerate and SLURM launches, on CPUs (gloo) and GPUs (NCCL)."""
    cpu_ram_efficient_loading: bool = True
    """With ``fsdp2``: only rank 0 reads the weights; the other ranks build the model on the
    meta device and receive their shards by broadcast (one host copy per node set, not one per
    rank)."""
    fsdp_offload: bool = False
    """With ``fsdp2`` on GPUs: keep sharded parameters, gradients and optimizer state in host
    memory (``CPUOffloadPolicy``)."""
    max_tokens_per_micro_batch: int | None = None
    """Micro-batches by token budget (prompt + response tokens per forward, packed without
    padding), like verl's dynamic batch size; every rank runs the same number of micro-batches.
    None: ``micro_batch_size`` responses per micro-batch. Memory only; the update is exact."""
    wait_report_s: float = 300.0
    """A rank that has waited this long for the others (in a generation round's exchange, a
    checkpoint, the metrics) says what it waits for, again every this many seconds (0: never)."""
    dist_timeout_s: float = 3600.0
    """Process-group timeout (seconds), passed to ``InitProcessGroupKwargs``: a collective
    whose peer died fails after this long. It must exceed the longest generation round (a
    20k-token round of the 32B run takes ~16 minutes); ``$DAPO_DIST_TIMEOUT_S`` overrides it."""
    startup_timeout_s: float = 1800.0
    """How long the processes may take to arrive (seconds): the learners' group is built with
    this bound (a rank still importing, on a loaded node or a slow shared file system, is not
    a collective that hangs), then its collectives are bounded by ``dist_timeout_s``. The
    bridge's groups with the generators are built only once every member has arrived (a host
    wait that notices a generator that died), so no bound applies to them."""
    heartbeat_s: float = 10.0
    """Each rank beats in the rendezvous store this often (:mod:`scale.dist.heartbeat`; 0: off)."""
    heartbeat_timeout_s: float = 60.0
    """A rank whose heartbeat has not moved for this long is dead or stopped: every other rank
    exits with one line naming it (status 3) instead of waiting ``dist_timeout_s`` in a
    collective."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate every N training steps (0: only when asked, ``dapo eval``)."""
    k: int = 32
    """Samples per problem (avg@k, pass@k, cons@k); the paper reports avg@32."""
    temperature: float = 1.0
    """Sampling temperature of the evaluation (training always samples at 1.0)."""
    top_p: float = 0.7
    """Nucleus sampling of the evaluation (the paper's 0.7); must lie in (0, 1]."""
    max_new_tokens: int | None = None
    """None: the algorithm's generation ceiling."""
    limit: int | None = None
    """Evaluate only the first N problems (smoke runs)."""


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "runs/scale"
    """Where the run writes: ``metrics.jsonl``, ``checkpoints/`` and the trackers' files."""
    checkpoint_every: int = 10
    """Training steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk: after each save the oldest beyond this many are deleted; >= 1."""
    trackers: tuple[str, ...] = ()
    """accelerate trackers besides the JSONL log: ``tensorboard``, ``wandb``."""
    trace_rollouts: bool = False
    """Write ``trace/rank<r>.jsonl``: per generation round, what this rank's engine was asked for
    (prompt rows, seed) and a digest of what it returned. The members of a rollout group must
    write identical lines; the run stops anyway when their digests differ."""


@dataclass(frozen=True)
class DiagnoseConfig:
    every_steps: int = 0
    """Diagnose the run so far every N training steps (``dapo.health``) and write the verdicts
    into that step's metrics as ``health/*`` (0: off). A change of verdict is also logged."""


@dataclass(frozen=True)
class RunConfig:
    algo: AlgoConfig
    """The DAPO objective's knobs (:class:`dapo.config.AlgoConfig`); a field left out keeps its
    default (the paper's recipe)."""
    model: ModelConfig
    """The policy: weights, master dtype, memory options, LoRA."""
    data: DataConfig
    """Training and evaluation prompts and how they become token sequences."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation: the engine, its memory, the weight sync, and where it runs (colocated or
    disaggregated)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The learner: steps, optimizer, micro-batches, sharding, timeouts and heartbeat."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training and the defaults of ``dapo eval``."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """The run's directory, checkpoints and trackers."""
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    """The live diagnosis of the run (``dapo.health``)."""

    @property
    def gen_groups(self) -> int:
        return self.rollout.gen_groups or self.algo.train_groups

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def disaggregated(self) -> bool:
        return self.rollout.mode == "disaggregated"

    @property
    def generator_nodes(self) -> int:
        """Nodes of the generators' own (``rollout.generator_nodes`` of a disaggregated run; else 0)."""
        return self.rollout.generator_nodes if self.disaggregated else 0

    def validate(self) -> None:
        """Cross-section checks (each section validates its own fields on construction)."""
        if self.rollout.engine not in ("vllm", "hf"):
            raise ConfigError("rollout.engine", f"must be 'vllm' or 'hf' (got {self.rollout.engine!r})")
        self._validate_placement()
        if self.data.template not in ("dapo", "none"):
            raise ConfigError("data.template", f"must be 'dapo' or 'none' (got {self.data.template!r})")
        chat = self.data.chat_template
        if not isinstance(chat, bool):
            if not isinstance(chat, str) or not chat.strip():
                raise ConfigError(
                    "data.chat_template",
                    f"must be true, false or the path of a Jinja chat template file (got {chat!r})",
                )
            if not Path(chat).expanduser().is_file():
                raise ConfigError(
                    "data.chat_template",
                    f"no such file: {chat!r} (true: the tokenizer's template, false: none, or the path "
                    "of a Jinja chat template file)",
                )
        if self.data.cache_dir is not None and not self.data.cache_dir.strip():
            raise ConfigError("data.cache_dir", "must be a directory or null (no cache), not ''")
        for name, dt in (("model.dtype", self.model.dtype), ("rollout.dtype", self.rollout.dtype)):
            if dt not in ("bfloat16", "float32", "float16"):
                raise ConfigError(name, f"unknown dtype {dt!r} (bfloat16, float32 or float16)")
        self.model.lora.validate()
        if self.train.sharding not in ("none", "fsdp2"):
            raise ConfigError(
                "train.sharding",
                f"must be 'none' (DDP) or 'fsdp2' (got {self.train.sharding!r}); FSDP1 is not supported",
            )
        if self.train.fsdp_offload and self.train.sharding != "fsdp2":
            raise ConfigError("train.fsdp_offload", "needs train.sharding: fsdp2")
        if not self.train.dist_timeout_s > 0:
            raise ConfigError(
                "train.dist_timeout_s", f"must be > 0 seconds (got {self.train.dist_timeout_s!r})"
            )
        if not self.train.startup_timeout_s > 0:
            raise ConfigError(
                "train.startup_timeout_s", f"must be > 0 seconds (got {self.train.startup_timeout_s!r})"
            )
        if self.train.heartbeat_s < 0:
            raise ConfigError("train.heartbeat_s", f"must be >= 0 seconds (got {self.train.heartbeat_s!r})")
        if self.train.heartbeat_s and not self.train.heartbeat_timeout_s > self.train.heartbeat_s:
            raise ConfigError(
                "train.heartbeat_timeout_s",
                f"must exceed train.heartbeat_s={self.train.heartbeat_s} (got {self.train.heartbeat_timeout_s!r})",
            )
        if self.train.wait_report_s < 0:
            raise ConfigError(
                "train.wait_report_s", f"must be >= 0 seconds (got {self.train.wait_report_s!r})"
            )
        if self.rollout.tensor_parallel > 1 and self.rollout.engine != "vllm":
            raise ConfigError(
                "rollout.tensor_parallel", "needs rollout.engine: vllm (the hf engine generates on one rank)"
            )
        if not self.rollout.sync_bucket_mb > 0:
            raise ConfigError("rollout.sync_bucket_mb", f"must be > 0 (got {self.rollout.sync_bucket_mb!r})")
        budget = self.train.max_tokens_per_micro_batch
        if budget is not None and budget < 1:
            raise ConfigError(
                "train.max_tokens_per_micro_batch", f"must be a positive integer or null (got {budget!r})"
            )
        if self.train.mixed_precision not in ("no", "bf16"):
            raise ConfigError("train.mixed_precision", f"unknown value {self.train.mixed_precision!r}")
        for name, value in (
            ("train.steps", self.train.steps),
            ("train.micro_batch_size", self.train.micro_batch_size),
            ("rollout.tensor_parallel", self.rollout.tensor_parallel),
            ("eval.k", self.eval.k),
            ("model.logprob_chunk", self.model.logprob_chunk),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be a positive integer (got {value!r})")
        if not 0 < self.train.lr < 1:
            raise ConfigError("train.lr", f"must lie in (0, 1) (got {self.train.lr!r})")
        if self.train.warmup_steps < 0:
            raise ConfigError("train.warmup_steps", "must be >= 0")
        if self.gen_groups < 1:
            raise ConfigError("rollout.gen_groups", "must be >= 1")
        for name, top_p in (("rollout.top_p", self.rollout.top_p), ("eval.top_p", self.eval.top_p)):
            if not 0 < top_p <= 1:
                raise ConfigError(name, f"must lie in (0, 1] (got {top_p})")
        if self.eval.temperature <= 0:
            raise ConfigError("eval.temperature", "must be > 0")
        if self.rollout.temperature != 1.0 or self.rollout.top_p != 1.0:
            # the ratio of Eq. 8 needs the sampling distribution's log-probs; the engines report
            # the raw (temperature 1, untruncated) distribution, as the paper trains
            raise ConfigError(
                "rollout.temperature",
                "training samples at temperature 1.0 and top_p 1.0 (the "
                "paper's setting); other values would make old_logp differ from the sampling "
                "policy (evaluation may use any: eval.temperature, eval.top_p)",
            )
        if not 0 < self.rollout.gpu_memory_utilization <= 1:
            raise ConfigError("rollout.gpu_memory_utilization", "must lie in (0, 1]")
        if self.rollout.kv_cache_gib is not None and not self.rollout.kv_cache_gib > 0:
            raise ConfigError("rollout.kv_cache_gib", "must be > 0 GiB (or null: the memory fraction)")
        if self.diagnose.every_steps < 0:
            raise ConfigError("diagnose.every_steps", f"must be >= 0 (got {self.diagnose.every_steps})")
        if self.output.keep_checkpoints < 1:
            raise ConfigError("output.keep_checkpoints", "must be >= 1")
        for t in self.output.trackers:
            if t not in ("tensorboard", "wandb"):
                raise ConfigError("output.trackers", f"unknown tracker {t!r}")

    def _validate_placement(self) -> None:
        r = self.rollout
        if r.mode not in PLACEMENTS and ":" not in str(r.mode):
            raise ConfigError(
                "rollout.mode",
                f"must be {' or '.join(repr(m) for m in PLACEMENTS)}, or module:Class for a placement of "
                f"one's own (scale.placement.interface) (got {r.mode!r})",
            )
        if not isinstance(r.max_staleness, int) or r.max_staleness < 0:
            raise ConfigError("rollout.max_staleness", f"must be an integer >= 0 (got {r.max_staleness!r})")
        if r.partial and r.max_staleness < 1:
            raise ConfigError(
                "rollout.partial",
                "needs rollout.max_staleness >= 1 (the next policy version must exist before the "
                "learner trains the batch)",
            )
        if not isinstance(r.partial_tokens, int) or r.partial_tokens < 1:
            raise ConfigError(
                "rollout.partial_tokens", f"must be a positive integer (got {r.partial_tokens!r})"
            )
        if r.max_staleness and r.mode != "disaggregated":
            raise ConfigError(
                "rollout.max_staleness",
                f"= {r.max_staleness} needs rollout.mode: disaggregated (colocated, generation and "
                "training share the devices and take turns: there is nothing to overlap)",
            )
        from dapo.offpolicy import CORRECTIONS

        if r.correction not in ("auto", "keep", *CORRECTIONS):
            raise ConfigError(
                "rollout.correction",
                f"unknown {r.correction!r}; auto, keep or one of {', '.join(CORRECTIONS)}",
            )
        if not isinstance(r.generator_nodes, int) or r.generator_nodes < 0:
            raise ConfigError(
                "rollout.generator_nodes", f"must be an integer >= 0 (got {r.generator_nodes!r})"
            )
        if r.generator_nodes and r.mode != "disaggregated":
            raise ConfigError(
                "rollout.generator_nodes",
                f"= {r.generator_nodes} needs rollout.mode: disaggregated (colocated, every rank generates)",
            )
        if r.mode != "disaggregated":
            return
        if not isinstance(r.generators, int) or r.generators < 1:
            raise ConfigError("rollout.generators", f"must be a positive integer (got {r.generators!r})")
        if r.generator_nodes and r.generators % r.generator_nodes:
            raise ConfigError(
                "rollout.generator_nodes",
                f"= {r.generator_nodes} does not divide rollout.generators={r.generators} (each "
                "generator node runs an equal share)",
            )
        if self.gen_groups % r.generators:
            raise ConfigError(
                "rollout.gen_groups",
                f"= {self.gen_groups} is not divisible by rollout.generators={r.generators} "
                "(each generator takes an equal slice of every round)",
            )
        if self.eval.every:
            raise ConfigError(
                "eval.every",
                "must be 0 with rollout.mode: disaggregated (the generators hold older policy versions); "
                "evaluate the checkpoints with `dapo eval`",
            )
        if self.algo.prompt_selection != "none":
            raise ConfigError(
                "algo.prompt_selection",
                "must be none with rollout.mode: disaggregated (the history would have to travel with "
                "the batches in flight; not supported yet)",
            )


def with_correction(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``rollout.correction`` applied to its algo section where staleness > 0."""
    r = cfg.rollout
    if not r.max_staleness or r.correction == "keep":
        return cfg
    a = cfg.algo
    if r.correction == "auto":
        if a.tis_cap is not None or a.rejection is not None or a.behaviour_clip:
            return cfg
        name = "token_tis"  # the toys' table: tolerated up to k = 8 (RolloutConfig.correction)
    else:
        name = r.correction
    from dapo.offpolicy import correction_fields

    try:
        algo = dataclasses.replace(a, **correction_fields(name))  # type: ignore[arg-type]
    except (ConfigError, ValueError) as err:
        raise ConfigError("rollout.correction", f"{name}: {err}") from None
    return dataclasses.replace(cfg, algo=algo)


_SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "output": OutputConfig,
    "diagnose": DiagnoseConfig,
}


def _type_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` does not fit the field type ``hint`` (YAML scalars and lists), or None."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        args = typing.get_args(hint)
    if hint is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "must be a finite number"
    if hint is str:
        return None if isinstance(value, str) else "must be a string"
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, tuple):
            return "must be a list"
        if len(args) == 2 and args[1] is Ellipsis:
            items = [args[0]] * len(value)
        else:
            if len(value) != len(args):
                return f"must be a list of {len(args)}"
            items = list(args)
        for item_hint, item in zip(items, value):
            if (why := _type_problem(item_hint, item)) is not None:
                return f"items: {why}"
        return None
    return None


def _build(cls, values: Any, section: str):
    if not isinstance(values, dict):
        raise ConfigError(section, f"must be a mapping (got {type(values).__name__})")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(
                f"{section}.{key}", f"unknown field{_did_you_mean(key, list(known))}; known: {sorted(known)}"
            )
    missing = [
        n
        for n, f in known.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in values
    ]
    if missing:
        raise ConfigError(f"{section}.{missing[0]}", "is required")
    hints = typing.get_type_hints(cls)
    clean = {}
    for k, v in values.items():
        if dataclasses.is_dataclass(hints[k]):  # a nested section (model.lora)
            clean[k] = _build(hints[k], {} if v is None else v, f"{section}.{k}")
            continue
        if isinstance(v, list):
            v = tuple(v)
        if (why := _type_problem(hints[k], v)) is not None:
            raise ConfigError(f"{section}.{k}", f"{why} (got {v!r})")
        clean[k] = v
    try:
        return cls(**clean)
    except TypeError as err:
        raise ConfigError(section, str(err)) from None


def from_dict(values: dict[str, Any], source: str = "config") -> RunConfig:
    if not isinstance(values, dict):
        raise ConfigError("<root>", f"{source}: the file must hold a mapping of sections")
    unknown = sorted(set(values) - set(_SECTIONS) - {"algo"})
    if unknown:
        raise ConfigError(
            unknown[0],
            f"unknown section in {source}{_did_you_mean(unknown[0], ['algo', *_SECTIONS])}; "
            f"known: algo, {', '.join(_SECTIONS)}",
        )
    for required in ("algo", "model", "data"):
        if required not in values:
            raise ConfigError(required, f"section missing in {source}")
    try:
        algo = algo_from_dict(values["algo"] or {}, source=f"{source}: algo")
    except ConfigError as err:
        raise ConfigError(f"algo.{err.field}", err.message) from None
    sections = {
        name: _build(cls, values.get(name) or {}, name)
        for name, cls in _SECTIONS.items()
        if name in values or name in ("model", "data")
    }
    cfg = RunConfig(algo=algo, **sections)
    cfg.validate()
    return with_correction(cfg)


def _known_fields() -> dict[str, list[str]]:
    """Section -> its field names (``algo`` included)."""
    classes = {"algo": AlgoConfig, **_SECTIONS}
    return {name: [f.name for f in dataclasses.fields(cls)] for name, cls in classes.items()}


def _nested_sections() -> dict[str, type]:
    """Dotted name -> dataclass of each section inside a section (``model.lora``)."""
    found: dict[str, type] = {}
    for name, cls in _SECTIONS.items():
        for f, hint in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(hint):
                found[f"{name}.{f}"] = typing.cast(type, hint)
    return found


def _did_you_mean(word: str, choices: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``section.field=value`` (value parsed as YAML) applied to a raw config mapping. A
    section or field that does not exist is refused here, as a command-line mistake (with the
    closest name), before the file's own contents are checked."""
    import yaml

    known = _known_fields()
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(item, "command-line override: expected section.field=value")
        key, raw = item.split("=", 1)
        section, name = key.split(".", 1)
        said = f"command-line override {item!r}"
        nested = _nested_sections()
        head, _, tail = name.partition(".")
        sub = nested.get(f"{section}.{head}") if tail else None
        if sub is not None:  # section.sub.field=value (model.lora.rank=8)
            owner, field, fields = f"{section}.{head}", tail, [f.name for f in dataclasses.fields(sub)]
        elif section not in known:
            raise ConfigError(
                key,
                f"{said}: unknown section {section!r}{_did_you_mean(section, list(known))}; "
                f"sections: {', '.join(known)}",
            )
        else:
            owner, field, fields = section, name, known[section]
        if field not in fields:
            raise ConfigError(
                key,
                f"{said}: {owner} has no field {field!r}{_did_you_mean(field, fields)}; "
                f"its fields: {', '.join(fields)}",
            )
        target = out.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(section, "is not a section")
        if sub is not None:
            inner = target.get(head)
            if inner is not None and not isinstance(inner, dict):
                raise ConfigError(owner, "is not a section")
            target[head] = target = dict(inner or {})
        try:
            target[field] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(key, f"{said}: the value is not valid YAML") from None
    return out


def presets() -> list[str]:
    """The bundled presets' names (``scale/configs/*.yaml``)."""
    return sorted(q.stem for q in PRESET_DIR.glob("*.yaml"))


def resolve_path(name_or_path: str) -> Path:
    """A YAML file path, or the name of a bundled preset (:func:`presets`)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.is_file():
        return preset
    raise ConfigError(
        "config",
        f"no such file or preset: {name_or_path!r} (presets: {', '.join(presets())})",
    )


def load(name_or_path: str, overrides: list[str] | None = None) -> RunConfig:
    import yaml

    path = resolve_path(name_or_path)
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError("config", f"{where}: not valid YAML ({problem})") from None
    values = apply_overrides(values or {}, overrides or [])
    given = {item.split("=", 1)[0]: item for item in overrides or []}
    try:
        return from_dict(values, source=str(path))
    except ConfigError as err:  # blame where the value came from: the command line or the file
        where = f"command-line override {given[err.field]!r}" if err.field in given else f"in {path}"
        raise ConfigError(err.field, f"{err.message} ({where})") from None


def load_for_cli(prog: str, name_or_path: str, overrides: list[str] | None = None) -> RunConfig | None:
    """:func:`load`, printing ``prog: invalid config: ...`` and returning None on a bad config."""
    import sys

    try:
        return load(name_or_path, overrides)
    except ConfigError as err:
        print(f"{prog}: invalid config: {err}", file=sys.stderr)
        return None


def config_arguments(p: argparse.ArgumentParser) -> None:
    """``--config`` and the ``section.field=value`` overrides (the config is checked by
    :func:`load_for_cli` before any work)."""
    from dapo.cliargs import Text

    p.add_argument(
        "--config",
        type=Text(),
        required=True,
        help=f"a YAML file or a bundled preset: {', '.join(presets())}",
    )
    p.add_argument("overrides", type=Text(), nargs="*", help="section.field=value (value parsed as YAML)")
