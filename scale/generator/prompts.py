"""The generator's inputs, prepared from the config before any model loads: the model's
files (fetched once per node), the tokenizer, the training and evaluation problems (read,
validated, templated and tokenised once per node), the engine's context, the one global
prompt stream and the prompt selection.

:class:`Prompts` owns the generator's part of a checkpoint: the stream's position and the
selection's history (:meth:`Prompts.state_dict`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dapo.prompt_selection import PromptSelection, parse_spec

from ..config import RunConfig
from ..dist.hub import CONFIG_FILES, MODEL_FILES, is_hub_id
from ..dist.topology import all_max, barrier, waiting_for
from .data import DataError, Problem, ProblemSet, PromptStream, contamination, prepare_problems


@dataclass
class Prompts:
    tokenizer: Any
    problems: list[Problem]
    eval_problems: list[Problem] | None
    prompt_ids: dict[str, list[int]]
    """Each prompt's token ids, as :func:`scale.generator.data.prepare_problems` encoded them."""
    context_len: int
    stream: PromptStream
    """One prompt stream, identical on every rank: each round every rollout group takes its
    slice of the same draw (no prompt twice in an epoch, whatever the world size)."""
    selection: PromptSelection | None
    """``algo.prompt_selection``: one outcome history, updated on every rank from the same
    all-gathered reports, so every rank makes the same choices (:mod:`dapo.prompt_selection`)."""

    @classmethod
    def build(cls, cfg: RunConfig, acc: Any, log: Any, *, evaluation: bool = True) -> Prompts:
        """Fetch the model's files, load the tokenizer, then the data: a malformed record or a
        prompt too long for the context refuses the run before any model is allocated.
        ``acc``: the learners' accelerator, or :data:`ALONE` in a generator process;
        ``evaluation``: the evaluation set too."""
        from transformers import AutoTokenizer

        _fetch_model_files(cfg.model.path, acc)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        d = cfg.data
        train = _problem_set(cfg, acc, tokenizer, log, "data.train", d.train, d.train_split)
        prompt_ids = dict(zip((p.prompt for p in train.problems), train.prompt_ids or []))
        evals = None
        if d.eval and evaluation:
            evals = _problem_set(cfg, acc, tokenizer, log, "data.eval", d.eval, d.eval_split).head(
                cfg.eval.limit
            )
            prompt_ids.update(zip((p.prompt for p in evals.problems), evals.prompt_ids or []))
        return cls(
            tokenizer=tokenizer,
            problems=train.problems,
            eval_problems=evals.problems if evals is not None else None,
            prompt_ids=prompt_ids,
            context_len=_context_len(cfg, train, evals),
            stream=PromptStream(train.problems, seed=d.shuffle_seed),
            selection=PromptSelection(parse_spec(cfg.algo.prompt_selection), seed=d.shuffle_seed)
            if cfg.algo.prompt_selection != "none"
            else None,
        )

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def encode(self, prompt: str) -> list[int]:
        """A prompt's token ids, as :func:`scale.generator.data.prepare_problems` encoded them."""
        return self.prompt_ids[prompt]

    def state_dict(self) -> dict[str, Any]:
        """The generator's part of a rank's checkpoint: the stream's position, the selection's history."""
        state: dict[str, Any] = {"stream": self.stream.state_dict()}
        if self.selection is not None:
            state["selection"] = self.selection.state_dict()
        return state

    def check_contamination(self, n: int, out: Path, log: Any) -> None:
        """Train/eval prompt pairs that share ``n``-grams, in ``out/contamination.json`` (rank 0)."""
        if not n or not self.eval_problems:
            return
        hits = contamination(self.problems, self.eval_problems, n=n)
        (out / "contamination.json").write_text(json.dumps([asdict(h) for h in hits], indent=2))
        if hits:
            rows = sorted({h.eval_row for h in hits})
            log(
                f"warning: {len(hits)} train/eval prompt pair(s) share {n}-grams (eval rows {rows[:10]}"
                f"{'...' if len(rows) > 10 else ''}); see {out / 'contamination.json'}"
            )


ALONE = SimpleNamespace(
    is_main_process=False, is_local_main_process=True, process_index=1, num_processes=1, device="cpu"
)
"""The ``acc`` of a process outside the learners' group (a generator process,
:mod:`scale.placement.generator_process`): it prepares its inputs alone (from the learners'
``data.cache_dir`` where there is one), logs nothing, and fetches the model's config and
tokenizer, not its weights (its engine receives them, or loads its own copy)."""


def _fetch_model_files(path: str, acc: Any) -> None:
    """A model named by hub id: each node's local rank 0 fetches what its ranks read (rank 0
    the weights too) into the node's hub cache, and the others, offline, wait for it."""
    if not is_hub_id(path):
        return
    if acc.is_local_main_process:
        from huggingface_hub import snapshot_download

        snapshot_download(
            repo_id=path, allow_patterns=MODEL_FILES if acc.process_index == 0 else CONFIG_FILES
        )
    if acc.num_processes > 1:
        with waiting_for(f"local rank 0 to fetch {path} from the hub"):
            barrier()


def _problem_set(
    cfg: RunConfig, acc: Any, tokenizer: Any, log: Any, field: str, spec: str, split: str
) -> ProblemSet:
    """The unique problems of ``spec``, prepared once per node: local rank 0 reads, validates,
    templates and tokenises (and fills ``data.cache_dir``); the node's other ranks then read
    the cache. Without a cache every rank prepares the set itself."""
    d = cfg.data

    def prepare() -> ProblemSet:
        return prepare_problems(
            spec,
            split=split,
            prompt_key=d.prompt_key,
            answer_key=d.answer_key,
            template=d.template,
            chat_template=d.chat_template,
            tokenizer=tokenizer,
            max_prompt_tokens=d.max_prompt_tokens,
            cache_dir=d.cache_dir,
            log=log,
        )

    # local rank 0 first when there is a cache to fill or a hub to read (the node's other
    # ranks then read the cache, or the hub cache offline: scale.dist.hub.hub_environment)
    ordered = d.cache_dir is not None or is_hub_id(spec)
    first = acc.is_local_main_process or not ordered
    ps, failure = None, None
    if first:
        try:
            ps = prepare()
        except (DataError, FileNotFoundError) as err:
            failure = err
    if acc.num_processes > 1 and ordered:  # the others wait for local rank 0
        with waiting_for(f"local rank 0 to prepare {spec}"):
            failed = all_max(int(failure is not None), acc.device)
        if failure is None and failed:
            raise DataError([(spec, 0, "<file>", "not prepared: see local rank 0's error")])
    if failure is not None:
        raise failure
    if ps is None:
        ps = prepare()
    if acc.is_main_process:
        log(f"{field}: {ps.summary()}")
    return ps


def _context_len(cfg: RunConfig, train: ProblemSet, evals: ProblemSet | None) -> int:
    """The engine's context: ``rollout.max_model_len``, each prompt of both sets checked to
    fit with its response ceiling (refused by row, before any model loads); else the
    longest prompt of the whole prepared set plus its ceiling, training or evaluation."""
    c = cfg
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
