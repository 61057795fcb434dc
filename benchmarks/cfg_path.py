"""Following ``cfg`` from ``dapo train``'s entry point: which modules a run's config visits, in
order, and how often the path returns to a module it had left (issue 49's measure).

A tiny CPU run (the ``tiny-cpu`` preset, transformers engine, one process, one step) under a
profiler: from the entry point (``dapo train``'s function), every call of a function of ``scale/`` that receives the run config (an argument
that is a :class:`scale.config.RunConfig`, or a ``self`` holding one as ``.cfg``) is a step of
the path, in call order; consecutive calls in one module are one *stay*; a stay in a module
that had an earlier stay is a *return*. The config's own methods (``scale/config.py``) are the
thing followed, not a place it visits, and are left out. Printed for the construction (up to
``Trainer.train``) and for the whole run.

    python benchmarks/cfg_path.py              # this checkout
    python benchmarks/cfg_path.py --json

The entry point comes from ``dapo.cli.COMMANDS["train"]``, so the same script measures an
older layout when that checkout is first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def trace_run(workdir: Path) -> list[tuple[str, str]]:
    """(module, function) of every call that receives the run config, in call order."""
    import dapo.cli as dcli
    import scale
    from scale.config import RunConfig

    root = Path(scale.__file__).resolve().parents[1]
    scale_dir = str(root / "scale") + os.sep
    config_file = str(root / "scale" / "config.py")
    calls: list[tuple[str, str]] = []

    def holds_cfg(frame: Any) -> bool:
        args = frame.f_code.co_varnames[: frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
        for name in args:
            v = frame.f_locals.get(name)
            if isinstance(v, RunConfig) or (
                name == "self" and isinstance(getattr(v, "cfg", None), RunConfig)
            ):
                return True
        return False

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(scale_dir) or path == config_file or not holds_cfg(frame):
            return
        module = ".".join(Path(path).resolve().relative_to(root).with_suffix("").parts)
        calls.append((module.removesuffix(".__init__"), frame.f_code.co_name))

    target = dcli.COMMANDS["train"][1]
    main = dcli.resolve(target)
    calls.append((target.partition(":")[0], target.partition(":")[2]))  # the entry point: the path's start
    argv = [
        "--config",
        "tiny-cpu",
        "--quiet",
        "--steps",
        "1",
        f"output.dir={workdir / 'run'}",
        "rollout.engine=hf",
        "eval.every=0",
        "output.checkpoint_every=0",
    ]
    cwd = os.getcwd()
    os.chdir(workdir)  # the tiny preset builds its model and data under ./runs
    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
        os.chdir(cwd)
    if rc != 0:
        raise SystemExit(f"dapo train exited with {rc}")
    return calls


def stays(calls: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for module, _ in calls:
        if not out or out[-1] != module:
            out.append(module)
    return out


def summary(calls: list[tuple[str, str]]) -> dict[str, Any]:
    s = stays(calls)
    seen: set[str] = set()
    returns = []
    for m in s:
        if m in seen:
            returns.append(m)
        seen.add(m)
    return {"modules": len(seen), "stays": len(s), "returns": len(returns), "path": s, "returned_to": returns}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dapo-cfg-path-") as tmp:
        calls = trace_run(Path(tmp))
    until = next((i for i, (m, f) in enumerate(calls) if f == "train" and m.endswith("trainer")), len(calls))
    report = {"construction": summary(calls[:until]), "run (one step)": summary(calls)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for part, r in report.items():
        print(f"{part}: {r['modules']} modules, {r['stays']} stays, {r['returns']} returns")
        print("  " + " -> ".join(r["path"]))
        if r["returned_to"]:
            print("  returns to: " + ", ".join(r["returned_to"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
