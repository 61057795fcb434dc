"""A run's records (:class:`Records`, started once by the trainer): what rank 0 writes when a
run starts (:func:`start_records`: the config, the contamination report, the trackers), the
JSONL logs trimmed on resume (:func:`trim_jsonl`), the per-rank rollout trace (:class:`Trace`,
``output.trace_rollouts``), the live diagnosis (``dapo.health``) and each step's metrics line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def trim_jsonl(path: Path, step: int) -> list[dict[str, Any]]:
    """Drop the lines of ``path`` (JSONL, one object per line with ``step``, counted from 1) of
    steps after ``step`` (the steps completed): on resume, the steps that will run again. The
    lines kept ([] without the file)."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = [r for r in rows if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return keep


class Trace:
    """``output.trace_rollouts``: one line per generation round (what this rank's engine was
    asked for: the members of a rollout group write the same) and one per step (this rank's
    share of the batch: groups and response tokens), in ``<out>/trace/rank<r>.jsonl``."""

    def __init__(self, out: Path, ranks: Any):
        self.ranks = ranks
        self.path = out / "trace" / f"rank{ranks.rank}.jsonl"
        self.step = 0
        """The steps completed; lines carry the step being made (``step + 1``)."""

    def __call__(self, **fields: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "step": self.step + 1,  # the step being made, numbered as printed and in metrics.jsonl
            **{k: getattr(self.ranks, k) for k in ("rank", "dp_rank", "tp_rank")},
            **fields,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def share(self, batch: Any) -> None:
        """What this rank trains on this step."""
        self(
            share_groups=batch.num_groups if batch is not None else 0,
            share_tokens=int(batch.mask.sum()) if batch is not None else 0,
        )


def tracker_config(config: dict[str, Any]) -> dict[str, int | float | str | bool]:
    """The run config as trackers take hyper-parameters: flat ``section.field`` keys and scalar
    values (tensorboard's ``add_hparams`` refuses nested dicts, lists and None)."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in config.items():
        if isinstance(value, dict):  # a section, or a section inside one (model.lora)
            flat.update({f"{key}.{k}": v for k, v in tracker_config(value).items()})
        else:
            flat[key] = (
                value if isinstance(value, (int, float, str, bool)) else json.dumps(value, default=str)
            )
    return flat


def start_records(cfg: Any, acc: Any, prompts: Any, log: Any) -> None:
    """Rank 0: the run's config (``config.json``), the train/eval contamination report and the
    trackers (with the config as hyper-parameters)."""
    if not acc.is_main_process:
        return
    out = Path(cfg.output.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    prompts.check_contamination(cfg.data.contamination_ngram, out, log)
    if cfg.output.trackers:
        acc.init_trackers("dapo", config=tracker_config(cfg.to_dict()))


class Records:
    """What a run writes as it goes: ``metrics.jsonl`` and the trackers (:meth:`write`, rank 0),
    the rollout trace (:attr:`trace`, each rank) and the live diagnosis (:attr:`health`, fed
    the metrics so far: on resume, those of the steps kept)."""

    def __init__(self, cfg: Any, acc: Any, trace: Trace, health: Any):
        self.cfg, self.acc, self.trace, self.health = cfg, acc, trace, health
        self.metrics = Path(cfg.output.dir) / "metrics.jsonl"

    @classmethod
    def start(cls, cfg: Any, acc: Any, ranks: Any, prompts: Any, *, step: int, log: Any) -> Records:
        """The run's start records (rank 0); a resumed run's metrics and traces of the steps
        after ``step``, which will run again, dropped; the health monitor fed the rest."""
        from dapo.health.callback import HealthMonitor
        from dapo.health.knobs import from_config

        start_records(cfg, acc, prompts, log)
        out = Path(cfg.output.dir)
        trace = Trace(out, ranks)
        trim_jsonl(trace.path, step)  # each rank its own trace
        health = HealthMonitor(cfg.diagnose.every_steps, knobs=from_config(cfg.to_dict()))
        health.extend(trim_jsonl(out / "metrics.jsonl", step) if acc.is_main_process else [])
        return cls(cfg, acc, trace, health)

    def write(self, m: dict[str, Any]) -> None:
        """One step's metrics line (rank 0): non-finite values as null; to the trackers too."""
        if not self.acc.is_main_process:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}
        with self.metrics.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.cfg.output.trackers:
            self.acc.log(
                {k: v for k, v in m.items() if isinstance(v, (int, float)) and math.isfinite(v)},
                step=int(m["step"]),
            )
