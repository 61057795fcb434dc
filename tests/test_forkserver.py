"""tests/forkserver.py: a command forked from the server is the process ``python -m dapo.cli``
would be (what it sees, what it prints, its exit status), a timeout leaves nothing running, an
environment changed in the pytest worker gets a server of its own (not a fresh process for every
later command), and what a fork cannot reproduce runs as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
from forkserver import run_dapo
from scale_support import need

need("transformers", "accelerate")

# A user's loss module in the working directory (`-m` puts it first on sys.path): at import it
# writes down what the process sees, then sleeps if asked to
PROBE = """
import json, os, sys, time
with open(os.environ["PROBE_OUT"] if "PROBE_OUT" in os.environ else os.environ["DAPO_PROBE_OUT"], "w") as f:
    json.dump({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "main": sys.modules["__main__"].__name__,
        "main_file": sys.modules["__main__"].__file__, "cli_imported": "dapo.cli" in sys.modules,
        "env": os.environ.get("DAPO_PROBE_VALUE"), "pid": os.getpid(), "ppid": os.getppid(),
    }, f)
time.sleep(float(os.environ.get("DAPO_PROBE_SLEEP", "0")))
print("probe: on stdout")
print("probe: on stderr", file=sys.stderr)

def loss(logp, old_logp, advantages, mask, clip, *, is_weights=None):
    raise RuntimeError("not called by --validate-only")
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", **extra}


def _args(out: Path) -> list[str]:
    # the registry imports the loss before --validate-only reads any data: the nowhere paths
    # are refused after it, in both kinds of process alike
    return [
        "train",
        "--config",
        "tiny-cpu",
        "rollout.engine=hf",
        "algo.policy_loss=probe:loss",
        f"output.dir={out}",
        "--validate-only",
    ]


def test_a_forked_command_sees_says_and_exits_as_a_fresh_interpreter(tmp_path):
    """Each in a folder of its own (the tiny preset builds its data there once), compared with
    the folder's name replaced."""
    seen = {}
    for how in ("fresh", "forked"):
        here = tmp_path / how
        here.mkdir()
        (here / "probe.py").write_text(PROBE)
        report = here / "probe.json"
        env = _env(DAPO_PROBE_OUT=str(report), DAPO_PROBE_VALUE=how)
        if how == "fresh":
            r = subprocess.run(
                [sys.executable, "-m", "dapo.cli", *_args(here / "run")],
                capture_output=True,
                text=True,
                env=env,
                cwd=here,
                timeout=300,
            )
        else:
            r = run_dapo(_args(here / "run"), env=env, cwd=here, timeout=300)
        text = (r.stdout + "\0" + r.stderr).replace(str(here), "HERE")
        seen[how] = (r.returncode, text, json.loads(report.read_text().replace(str(here), "HERE")))
    (code_a, text_a, a), (code_b, text_b, b) = seen["fresh"], seen["forked"]
    assert (code_b, text_b) == (code_a, text_a)
    assert "probe: on stdout" in text_b and "probe: on stderr" in text_b
    assert a["ppid"] == os.getpid()
    assert b["ppid"] != os.getpid(), forkserver.FRESH[-1:]  # the second one was forked
    assert (a["env"], b["env"]) == ("fresh", "forked")  # a DAPO_* variable is the request's own
    for key in ("argv", "cwd", "path0", "main", "main_file", "cli_imported"):
        assert a[key] == b[key], key
    assert a["main"] == "__main__" and a["main_file"].endswith(os.path.join("dapo", "cli.py"))


def test_a_command_past_its_timeout_is_killed_with_its_process_group(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    report = tmp_path / "probe.json"
    env = _env(DAPO_PROBE_OUT=str(report), DAPO_PROBE_SLEEP="120")
    with pytest.raises(subprocess.TimeoutExpired):
        run_dapo(_args(tmp_path / "run"), env=env, cwd=tmp_path, timeout=20)
    pid = json.loads(report.read_text())["pid"]
    end = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    assert json.loads(report.read_text())["ppid"] != os.getpid(), forkserver.FRESH[-1:]  # it had been forked


def _probe(tmp_path: Path, name: str, args: list[str] | None = None, **env: str) -> dict:
    here = tmp_path / name
    here.mkdir()
    (here / "probe.py").write_text(PROBE)
    report = here / "probe.json"
    r = run_dapo(
        args or _args(here / "run"), env=_env(DAPO_PROBE_OUT=str(report), **env), cwd=here, timeout=300
    )
    assert "probe: on stderr" in r.stderr, r.stderr[-2000:]
    return json.loads(report.read_text())


def test_an_environment_changed_in_the_worker_gets_a_server_of_its_own(tmp_path):
    """What a library's import in the pytest worker does (vLLM sets seven variables, among them
    LD_LIBRARY_PATH): the requests after it differ from the server's environment in a variable
    read at import. They are forked from a second server that imported in that environment,
    not run fresh, and the first server still serves the first environment."""
    before = forkserver.FRESH[:]
    a = _probe(tmp_path, "a")
    changed = _probe(tmp_path, "changed", VLLM_STYLE_IMPORT_SETTING="1")
    again = _probe(tmp_path, "again")
    assert forkserver.FRESH == before  # nothing ran fresh
    assert os.getpid() not in {a["ppid"], changed["ppid"], again["ppid"]}
    assert changed["ppid"] != a["ppid"]  # another server: it imported under the new variable
    assert again["ppid"] == a["ppid"]  # the first one is still there and serves its environment


def test_what_a_fork_cannot_reproduce_runs_as_a_fresh_process(tmp_path):
    """``--verbose`` (the engines' loggers are set before they import, and the servers imported
    quietly): the command runs as a subprocess of this process, and says why."""
    here = tmp_path / "verbose"
    seen = _probe(tmp_path, "verbose", args=[*_args(here / "run"), "--verbose"])
    assert seen["ppid"] == os.getpid()
    assert forkserver.FRESH[-1] == "--verbose"
