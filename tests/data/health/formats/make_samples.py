"""Write the TensorBoard and W&B samples of ``dapo diagnose``'s readers from real logs.

Neither format could be had as published (event files are binary; no public W&B export of an
RL run was found), so the values come from two real calibration logs and are written the way
each framework writes them:

* ``tensorboard/verl/``: verl's TensorBoard backend (``verl.utils.tracking._TensorboardAdapter``
  calls ``SummaryWriter.add_scalar(key, value, step)`` for every metric of a step) with the
  values of ``calibration/verl-data-qwen2-7b-grpo-gsm8k.log``;
* ``tensorboard/trl/``: transformers' ``TensorBoardCallback.on_log`` (``rewrite_logs`` adds
  ``train/``, then ``add_scalar(k, v, state.global_step)``) with the values of
  ``calibration/website-sanitizer-qwen0.5b-grpo-truncation.log``;
* ``wandb-history.csv``: ``run.history().to_csv()`` of the verl run (pandas index column,
  ``_step``, ``_runtime``, ``_timestamp``, the metrics);
* ``wandb-panel.csv``: a W&B panel's "Export CSV" of the TRL run's ``train/reward`` and
  ``train/grad_norm`` (``Step``, ``<run> - <metric>``, ``__MIN``/``__MAX``);
* ``wandb-offline/``: the verl run through ``wandb`` itself in offline mode (verl's
  ``Tracking`` calls ``wandb.log(data=data, step=step)``); only the run's ``.wandb`` file is
  kept (``python tests/data/health/formats/make_samples.py wandb-offline``).

Run from the repository root: ``python tests/data/health/formats/make_samples.py [NAME ...]``
(needs ``tensorboard``, ``transformers``, ``pandas``; ``wandb`` for the offline run).
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
from torch.utils.tensorboard import SummaryWriter
from transformers.integrations.integration_utils import rewrite_logs

from dapo.health.readers import trl_console, verl_console

HERE = Path(__file__).parent
CAL = HERE.parent / "calibration"
VERL = CAL / "verl-data-qwen2-7b-grpo-gsm8k.log"
TRL = CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log"


def _raw(rows):
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def wandb_offline() -> None:
    import wandb

    out = HERE / "wandb-offline"
    shutil.rmtree(out, ignore_errors=True)
    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(mode="offline", dir=str(out), project="verl-gsm8k", name="qwen2-7b-grpo")
    for row in _raw(verl_console.READER.read(VERL)[0]):
        run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])  # verl's Tracking.log
    run.finish()
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    for p in sorted(run_dir.rglob("*"), reverse=True):
        if p.suffix != ".wandb":
            p.unlink() if p.is_file() else p.rmdir()


def main() -> None:
    verl_rows = _raw(verl_console.READER.read(VERL)[0])
    trl_rows = _raw(trl_console.READER.read(TRL)[0])
    for name in ("verl", "trl"):
        shutil.rmtree(HERE / "tensorboard" / name, ignore_errors=True)
    writer = SummaryWriter(str(HERE / "tensorboard" / "verl"), filename_suffix=".verl")
    for row in verl_rows:
        data = {k: v for k, v in row.items() if k != "step"}
        for key in data:  # _TensorboardAdapter.log(data, step)
            writer.add_scalar(key, data[key], row["step"])
    writer.close()
    writer = SummaryWriter(str(HERE / "tensorboard" / "trl"), filename_suffix=".trl")
    for row in trl_rows:
        logs = {k: v for k, v in row.items() if k != "step"}
        for k, v in rewrite_logs(logs).items():  # TensorBoardCallback.on_log
            if isinstance(v, (int, float)):
                writer.add_scalar(k, v, row["step"])
    writer.close()
    history = pd.DataFrame(
        [
            {"_step": r["step"], "_runtime": 60.0 * r["step"], "_timestamp": 1.7e9 + 60.0 * r["step"], **r}
            for r in verl_rows
        ]
    ).drop(columns=["step"])
    history.to_csv(HERE / "wandb-history.csv")
    with (HERE / "wandb-panel.csv").open("w", newline="") as fh:
        out = csv.writer(fh, quoting=csv.QUOTE_ALL)
        run = "qwen0.5b-grpo-lora"
        metrics = ("train/reward", "train/grad_norm")
        out.writerow(["Step", *(f"{run} - {m}{s}" for m in metrics for s in ("", "__MIN", "__MAX"))])
        for r in trl_rows:
            values = [r.get(m.split("/", 1)[1]) for m in metrics]
            out.writerow([r["step"], *(v for v in values for _ in range(3))])


if __name__ == "__main__":
    if sys.argv[1:] == ["wandb-offline"]:
        wandb_offline()
    else:
        main()
