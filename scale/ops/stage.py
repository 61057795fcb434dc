"""``dapo stage``: fetch a config's model and data from the hub once, into a directory the run
then reads with the hub offline.

128 ranks that each resolve ``Qwen/Qwen2.5-32B`` and ``BytedTsinghua-SIA/DAPO-Math-17k`` by
hub id at start meet the hub's rate limits, and compute nodes are often offline. Staging
writes, under ``--dir`` (a shared file system, or each node's local disk):

* ``model/``: the model repository's weights, config, generation config and tokenizer files
  (``huggingface_hub.snapshot_download``);
* ``data/train.parquet`` and ``data/eval.parquet``: the configured splits (``datasets``);
* ``stage.json``: the overrides that point a run at them and the offline environment
  (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``).

``dapo launch --staged DIR`` adds both to the launch it writes. A model or data spec that is
already a local path is recorded as it is. Without staging, :func:`hub_environment` still
keeps the hub to one process per node: every rank but each node's local rank 0 runs offline
and waits for that rank to fill the node's hub cache (``scale.trainer``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..dist.hub import MODEL_FILES, OFFLINE_ENV, is_hub_id

STAGE_FILE = "stage.json"


def stage(cfg: Any, root: Path, log: Any = print) -> dict[str, Any]:
    """Fetch ``cfg``'s model and data into ``root``; write and return ``stage.json``."""
    root.mkdir(parents=True, exist_ok=True)
    overrides = []
    model = cfg.model.path
    if is_hub_id(model):
        from huggingface_hub import snapshot_download

        log(f"model: {model} -> {root / 'model'}")
        snapshot_download(repo_id=model, local_dir=str(root / "model"), allow_patterns=MODEL_FILES)
        model = str(root / "model")
    overrides.append(f"model.path={Path(model).expanduser().resolve()}")
    for name, spec, split in (
        ("train", cfg.data.train, cfg.data.train_split),
        ("eval", cfg.data.eval, cfg.data.eval_split),
    ):
        if not spec:
            continue
        if is_hub_id(spec):
            import datasets

            target = root / "data" / f"{name}.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            log(f"data.{name}: {spec}[{split}] -> {target}")
            datasets.load_dataset(spec, split=split).to_parquet(str(target))
            spec = str(target)
        overrides.append(f"data.{name}={Path(spec).expanduser().resolve()}")
    record = {"overrides": overrides, "env": OFFLINE_ENV}
    (root / STAGE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read(root: Path) -> dict[str, Any]:
    """``stage.json`` of a staged directory (a :class:`dapo.cliargs.UsageError` if missing)."""
    from dapo.cliargs import UsageError

    f = root / STAGE_FILE
    try:
        record: dict[str, Any] = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(
            f"--staged: {f} is not a staged directory's record ({err}); run dapo stage first"
        ) from None
    if not isinstance(record.get("overrides"), list) or not isinstance(record.get("env"), dict):
        raise UsageError(f"--staged: {f} lacks 'overrides' or 'env'; run dapo stage again")
    return record


def build_parser():  # type: ignore[no-untyped-def]
    from dapo.cliargs import OutDir, Parser

    from ..config import config_arguments

    ap = Parser(
        prog="dapo stage",
        description="Fetch a config's model and data from the hub once, for runs with the hub offline.",
    )
    config_arguments(ap)
    ap.add_argument(
        "--dir", type=OutDir(), required=True, help="where to stage (shared, or each node's disk)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..config import load_for_cli

    cfg = load_for_cli("dapo stage", args.config, args.overrides)
    if cfg is None:
        return 2
    try:
        record = stage(cfg, args.dir, log=lambda m: print(f"dapo stage: {m}", file=sys.stderr))
    except (OSError, ValueError) as err:  # the hub refused, or nothing there
        print(
            f"dapo stage: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            file=sys.stderr,
        )
        return 2
    print(f"staged in {args.dir}; launch with: dapo launch --staged {args.dir} ...")
    print("  overrides: " + " ".join(record["overrides"]))
    print("  environment: " + " ".join(f"{k}={v}" for k, v in record["env"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
