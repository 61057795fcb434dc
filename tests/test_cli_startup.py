"""`dapo --help`, every subcommand's help and reading a log must not load torch (seconds of
imports on every call): the core's names are imported on first use (``dapo/__init__.py``),
commands import their machinery after parsing. Times live in benchmarks/cli_startup.py; these
tests assert what makes them short, so they do not depend on the machine's speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_fuzz import LEAVES

import dapo

PROBE = """
import sys
from dapo.cli import main
code = main(sys.argv[1:])
heavy = sorted(
    m for m in ("torch", "transformers", "accelerate", "vllm", "gymnasium", "scipy", "matplotlib") if m in sys.modules
)
print("HEAVY=" + ",".join(heavy))
sys.exit(code)
"""


def _heavy_imports(*argv: str, cwd: Path | None = None) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line, proc.stderr[-2000:]
    return proc.returncode, [m for m in line[-1][len("HEAVY=") :].split(",") if m]


@pytest.mark.parametrize(
    "leaf",
    [[], *sorted({tuple(x[:1]) for x, _ in LEAVES}), *[x for x, _ in LEAVES if len(x) > 1]],
    ids=lambda x: " ".join(["dapo", *x]),
)
def test_help_loads_no_heavy_module(leaf):
    code, heavy = _heavy_imports(*leaf, "--help")
    assert code == 0
    assert heavy == [], f"dapo {' '.join(leaf)} --help imports {heavy}"


def test_diagnose_reads_a_log_without_torch(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        "".join(
            json.dumps({"step": s, "actor/entropy": 1.0, "rollout/accuracy": 0.5}) + "\n" for s in range(30)
        )
    )
    code, heavy = _heavy_imports("diagnose", str(log))
    assert code in (0, 1, 3)
    assert "torch" not in heavy


def test_core_names_resolve_lazily_and_completely():
    """Every name in ``dapo.__all__`` resolves to the object its module defines; an unknown
    name is an AttributeError, as for any module."""
    import importlib

    for name in dapo.__all__:
        if name == "__version__":
            continue
        value = getattr(dapo, name)
        module = importlib.import_module(f"dapo.{dapo._MODULE_OF[name]}")
        assert value is getattr(module, name)
    assert sorted(n for n in dapo.__all__ if n != "__version__") == sorted(dapo._MODULE_OF)
    assert set(dapo.__all__) <= set(dir(dapo))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        dapo.nonexistent  # noqa: B018


def test_refusals_before_the_engine_do_not_import_it(tmp_path):
    """``dapo train``'s refusals after the config (no toy gate for the commit) and ``dapo
    eval``'s after the tokenizer (a context too short for --max-new-tokens) come before vLLM
    and accelerate are imported: seconds of imports for a one-line answer (``scale/ops/cli.py``
    imports them right before the engine)."""
    pytest.importorskip("transformers")
    import dapo_shaped

    code, heavy = _heavy_imports(
        "train", "--config", "tiny-cpu", f"output.dir={tmp_path / 'o'}", "--require-gate", cwd=tmp_path
    )
    assert code == 5 and "torch" in heavy
    assert "vllm" not in heavy and "accelerate" not in heavy, heavy
    assert not (tmp_path / "o" / "metrics.jsonl").exists()

    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    model = dapo_shaped.model_dir(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    code, heavy = _heavy_imports(
        "eval", "--model", str(model), "--data", str(data), "--chat-template", "false"
    )
    assert code == 2 and "transformers" in heavy
    assert "vllm" not in heavy, heavy
