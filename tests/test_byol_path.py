"""The README's "your loss, from the toy check to the trainer" path, run as written: the three
``dapo`` commands of its marked block, in a fresh git repository holding the how-to page's
example loss as ``mylosses.py``, after a real toy summary (``dapo toy run all``, what
``nox -s toy`` writes). The example loss passes and trains; a broken loss put in its place
stops at the gate, named, with what failed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from forkserver import run_dapo
from scale_support import need

need("transformers", "accelerate", "yaml", "vllm")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- byol: run as written by tests/test_byol_path.py -->"


def readme_commands() -> list[list[str]]:
    """The ``dapo`` lines of the README's block under :data:`MARK`."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(MARK) :].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("dapo ")]


def example_loss() -> str:
    """The first Python block of docs/how-to/bring-your-own-loss.md: the example loss."""
    text = (ROOT / "docs" / "how-to" / "bring-your-own-loss.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


BROKEN = '''
from dapo.loss import policy_loss


def my_loss(logp, old_logp, advantages, mask, clip, *, is_weights=None):
    """Gradient ascent: the objective J returned as the loss."""
    loss, stats = policy_loss(logp, old_logp, advantages, mask, clip, is_weights=is_weights)
    return -loss, stats
'''


def dapo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m dapo.cli ARGS`` in ``cwd`` (``train`` forked from a process that imported the
    stack once: tests/forkserver.py)."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    return run_dapo(args, env=env, cwd=cwd, timeout=900)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture(scope="module")
def toy_summary(tmp_path_factory) -> Path:
    """A real runs/toy/summary.json (the part of ``nox -s toy`` the gate reads)."""
    out = tmp_path_factory.mktemp("toy") / "toy"
    r = dapo(["toy", "run", "all", "--seeds", "10", "--no-plots", "--quiet", "--out", str(out)], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return out / "summary.json"


def project(tmp_path: Path, loss_source: str, toy_summary: Path) -> Path:
    """A user's project in a fresh repository (one commit), mylosses.py beside it untracked, as
    a loss from elsewhere (an installed package) is: the commit does not change when it does,
    the gate's source hash does. The toy summary in runs/."""
    (tmp_path / "notes.txt").write_text("a project\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "notes.txt")
    git(tmp_path, "commit", "-q", "-m", "start")
    (tmp_path / "mylosses.py").write_text(loss_source)
    (tmp_path / "runs" / "toy").mkdir(parents=True)
    (tmp_path / "runs" / "toy" / "summary.json").write_bytes(toy_summary.read_bytes())
    return tmp_path


def test_the_readme_names_three_commands_check_gate_train():
    steps = [c[:2] for c in readme_commands()]
    assert steps == [["toy", "check"], ["gate", "write"], ["train", "--config"]]


def test_the_example_loss_goes_from_the_check_through_the_gate_into_train(tmp_path, toy_summary):
    here = project(tmp_path, example_loss(), toy_summary)
    check, write, train = readme_commands()
    r = dapo(check, here)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    r = dapo(write, here)
    assert r.returncode == 0, r.stderr[-2000:]
    r = dapo(train, here)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "policy loss mylosses:my_loss" in r.stderr
    gate = json.loads((here / "runs" / "tiny-cpu" / "gate.json").read_text())
    assert gate["policy_loss"] == "mylosses:my_loss" and not gate.get("forced")
    assert gate["record"]["losses"]["mylosses:my_loss"]["passed"]
    # an edit of the loss's module after its check: the next run is refused, naming the loss
    (here / "mylosses.py").write_text(example_loss() + "\n\nEPS = 1e-8  # a helper added\n")
    r = dapo([*train[:-1], "output.dir=runs/second", train[-1]], here)
    assert r.returncode == 5, r.stderr[-2000:]
    assert "refusing to start" in r.stderr and "'mylosses:my_loss' changed since its toy check" in r.stderr


def test_a_broken_loss_stops_at_the_gate(tmp_path, toy_summary):
    here = project(tmp_path, BROKEN, toy_summary)
    check, write, train = readme_commands()
    r = dapo(check, here)
    assert r.returncode == 1 and "gradient_sign" in r.stdout, r.stdout[-3000:]
    r = dapo(write, here)
    assert r.returncode == 1 and "'mylosses:my_loss' failed its toy check" in r.stderr, r.stderr[-2000:]
    r = dapo(train, here)
    assert r.returncode == 5, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "refusing to start" in line and "'mylosses:my_loss' failed its toy check" in line
    assert "gradient_sign" in line and "dapo toy check --config" in line
    assert not (here / "runs" / "tiny-cpu" / "metrics.jsonl").exists()
