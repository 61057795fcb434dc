"""Seeded bugs: realistic mistakes a later change could make in the objective, each of which
the core's tests must catch. ``mutmut`` covers the mechanical mutants (operators, constants);
this list covers the ones a person makes (a forgotten argument, a denominator that counts
the wrong thing, a statistic over padding), including the ten that once passed the whole
core subset (issue 15). Run by ``nox -s mutation``; exits 1 if any bug survives.

Each bug is applied to a copy of the repository in a temporary directory (the working tree
is never edited) and the core test subset runs there with ``-x``.

    python tests/mutation/seeded_bugs.py [--out reports/mutation/seeded.json] [-k NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
# the core's part of mutmut's test selection (every seeded bug is in dapo/, not toybench/)
CORE_TESTS = [
    t
    for t in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"
    ]
    if not t.startswith("tests/test_toy")
]


@dataclass(frozen=True)
class Bug:
    name: str
    file: str
    old: str
    new: str
    once_survived: bool = False
    """One of the ten bugs the suite missed before issue 15."""


BUGS = [
    # -- the ten that once survived ---------------------------------------------------
    Bug(
        "TIS weights computed but never passed to the loss",
        "dapo/update.py",
        'extra = {} if weights is None else {"is_weights": weights[idx]}',
        "extra = {}",
        True,
    ),
    Bug(
        "gradient clipping skipped",
        "dapo/update.py",
        "norm = clip_grad_norm(cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf)",
        "norm = clip_grad_norm(math.inf)",
        True,
    ),
    Bug(
        "seq-mean denominator counts fully filtered responses",
        "dapo/loss.py",
        "n_seq = mask.any(dim=-1).sum(-1).to(torch.float64)",
        "n_seq = torch.full(mask.shape[:-2], float(mask.shape[-2]), dtype=torch.float64)",
        True,
    ),
    Bug(
        "zero-std groups not forced to exactly 0",
        "dapo/advantages.py",
        "adv = torch.where(uniform, torch.zeros_like(centred), centred)",
        "adv = centred",
        True,
    ),
    Bug(
        "eps inside the square root of the std",
        "dapo/advantages.py",
        "centred = centred / (r.std(dim=1, keepdim=True) + eps)",
        "centred = centred / (r.var(dim=1, keepdim=True) + eps).sqrt()",
        True,
    ),
    Bug(
        "upper clip fraction counted over padding",
        "dapo/loss.py",
        "up = mask & (adv > 0) & (ratio > 1.0 + clip.eps_high)",
        "up = (adv > 0) & (ratio > 1.0 + clip.eps_high)",
        True,
    ),
    Bug(
        "lower clip fraction counted over padding",
        "dapo/loss.py",
        "low = mask & (adv < 0) & (ratio < 1.0 - clip.eps_low)",
        "low = (adv < 0) & (ratio < 1.0 - clip.eps_low)",
        True,
    ),
    Bug(
        "log-ratio clamp removed",
        "dapo/loss.py",
        "log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)",
        "log_ratio = (logp - old_logp)",
        True,
    ),
    Bug(
        "entropy metric accumulated over every epoch",
        "dapo/update.py",
        "                if epoch == 0:\n                    window.add_tokens(mb, entropy)",
        "                window.add_tokens(mb, entropy)",
        True,
    ),
    Bug(
        "non-finite-loss skip removed",
        "dapo/update.py",
        "                if float(dp.sum(bad)) > 0:  # every rank skips together\n"
        "                    finite = False\n                    break\n",
        "",
        True,
    ),
    # -- others of the same kind --------------------------------------------------------
    Bug(
        "population std instead of the sample std",
        "dapo/advantages.py",
        "r.std(dim=1, keepdim=True)",
        "r.std(dim=1, keepdim=True, unbiased=False)",
    ),
    Bug(
        "eps_low and eps_high swapped",
        "dapo/loss.py",
        "ratio.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high)",
        "ratio.clamp(1.0 - clip.eps_high, 1.0 + clip.eps_low)",
    ),
    Bug(
        "min instead of max of the two surrogates",
        "dapo/loss.py",
        "per_token = torch.maximum(unclipped, clipped)",
        "per_token = torch.minimum(unclipped, clipped)",
    ),
    Bug(
        "dual clip applied to positive advantages too",
        "dapo/loss.py",
        "dual = (adv < 0) & (per_token > bound)",
        "dual = per_token > bound",
    ),
    Bug(
        "old log-probs not detached",
        "dapo/loss.py",
        "token_advantages(advantages, logp), old_logp.detach()",
        "token_advantages(advantages, logp), old_logp",
    ),
    Bug(
        "padding multiplied instead of masked (0 * inf = nan)",
        "dapo/loss.py",
        "masked = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))",
        "masked = loss_mat * mask",
    ),
    Bug(
        "token-mean counts padding tokens",
        "dapo/loss.py",
        "return mask.sum((-2, -1)).to(torch.float64)",
        "return torch.full(mask.shape[:-2], float(mask.shape[-2] * mask.shape[-1]), dtype=torch.float64)",
    ),
    Bug(
        "TIS weights not capped",
        "dapo/offpolicy.py",
        "return raw.clamp(max=upper)",
        "return raw",
    ),
    Bug(
        "TIS ratio inverted",
        "dapo/offpolicy.py",
        "log_ratio = (old_logp - rollout_logp).detach()",
        "log_ratio = (rollout_logp - old_logp).detach()",
    ),
    Bug(
        "sequence rejection judged on the sum instead of the mean",
        "dapo/offpolicy.py",
        "stat = values.sum(-1, keepdim=True) / (n.unsqueeze(-1) + 1e-8)",
        "stat = values.sum(-1, keepdim=True)",
    ),
    Bug(
        "micro-batch loss not scaled by the world size",
        "dapo/update.py",
        "backward(loss * dp.world_size)",
        "backward(loss)",
    ),
    Bug(
        "window denominator not summed over ranks",
        "dapo/update.py",
        "denom = dp.sum(\n                window_denominator(",
        "denom = (\n                window_denominator(",
    ),
    Bug(
        "overlong filter ignored",
        "dapo/update.py",
        "loss_mask = loss_mask & ~batch.truncated.unsqueeze(-1)",
        "loss_mask = loss_mask",
    ),
    Bug(
        "dynamic sampling keeps all-wrong groups",
        "dapo/sampling.py",
        "return ~(all_correct | all_wrong), int(",
        "return ~all_correct, int(",
    ),
    Bug(
        "dynamic sampling filters on the shaped reward's std",
        "dapo/sampling.py",
        "batch.correct, group_size, batch.truncated if exclude_truncated else None",
        "batch.rewards > 0, group_size, batch.truncated if exclude_truncated else None",
    ),
    Bug(
        "surplus groups not dropped",
        "dapo/sampling.py",
        "        if held > self.target_groups:\n",
        "        if False:\n",
    ),
    Bug(
        "soft penalty ramp starts at the ceiling",
        "dapo/rewards.py",
        "over = (lengths.to(torch.float64) - expected_len) / cache_len",
        "over = (lengths.to(torch.float64) - expected_len - cache_len) / cache_len",
    ),
    Bug("penalty factor ignored", "dapo/rewards.py", "over.clamp(0.0, 1.0) * factor", "over.clamp(0.0, 1.0)"),
    Bug(
        "first boxed answer instead of the last",
        "dapo/rewards.py",
        'pos = text.rfind("\\\\boxed")',
        'pos = text.find("\\\\boxed")',
    ),
    Bug(
        "leading zeros not stripped",
        "dapo/rewards.py",
        'digits = s.lstrip("+-").lstrip("0") or "0"',
        'digits = s.lstrip("+-") or "0"',
    ),
    Bug(
        "chunked entropy gradient sign",
        "dapo/logprobs.py",
        "dz = log_p.add_(ent_all[s : s + chunk].unsqueeze(-1)).mul_(ge)",
        "dz = log_p.sub_(ent_all[s : s + chunk].unsqueeze(-1)).mul_(ge)",
    ),
    Bug(
        "chunked backward ignores the temperature",
        "dapo/logprobs.py",
        "                dz.mul_(inv_temp)\n",
        "                pass\n",
    ),
]


def _copy_repo(dst: Path) -> None:
    for name in ("dapo", "toybench", "tests"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def _pytest(work: Path) -> subprocess.CompletedProcess:
    # `python -m pytest` from the copy puts the copy first on sys.path (before the editable install)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not multiprocess",
            *CORE_TESTS,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def run_bug(bug: Bug, work: Path) -> dict:
    target = work / bug.file
    original = (ROOT / bug.file).read_text()
    if original.count(bug.old) != 1:
        return {
            "bug": bug.name,
            "file": bug.file,
            "status": "stale",
            "detail": f"the text to replace occurs {original.count(bug.old)} times in {bug.file} (expected once)",
        }
    target.write_text(original.replace(bug.old, bug.new))
    t0 = time.monotonic()
    try:
        r = _pytest(work)
    finally:
        target.write_text(original)
    failed = [line.split(" ")[1] for line in r.stdout.splitlines() if line.startswith("FAILED ")]
    status = "killed" if r.returncode == 1 and failed else ("survived" if r.returncode == 0 else "error")
    return {
        "bug": bug.name,
        "file": bug.file,
        "once_survived": bug.once_survived,
        "status": status,
        "caught_by": failed[:1],
        "seconds": round(time.monotonic() - t0, 1),
        **({"detail": r.stdout[-2000:] + r.stderr[-2000:]} if status == "error" else {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("-k", default="", help="only bugs whose name contains this text")
    args = ap.parse_args(argv)
    bugs = [b for b in BUGS if args.k.lower() in b.name.lower()]
    results = []
    with tempfile.TemporaryDirectory(prefix="dapo-seeded-") as tmp:
        work = Path(tmp)
        _copy_repo(work)
        clean = _pytest(work)
        if clean.returncode != 0:
            print(clean.stdout[-3000:] + clean.stderr[-3000:])
            print("seeded bugs: the unmodified code fails its tests; fix that first", file=sys.stderr)
            return 2
        for bug in bugs:
            res = run_bug(bug, work)
            results.append(res)
            print(f"{res['status']:>8}  {bug.name}  {' '.join(res.get('caught_by', []))}", flush=True)
    killed = sum(r["status"] == "killed" for r in results)
    print(f"seeded bugs killed: {killed}/{len(results)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"killed": killed, "total": len(results), "bugs": results}, indent=1) + "\n"
        )
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
