import subprocess
import sys
from pathlib import Path

import pytest

from dapo import cli


def test_help_and_version(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    for name in ("toy", "diagnose", "train", "eval", "plan", "launch", "gate"):
        assert f"  {name}" in out
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip().startswith("dapo ")
    r = subprocess.run([sys.executable, "-m", "dapo.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "commands:" in r.stdout


def test_missing_optional_dependency_names_the_extra(monkeypatch, capsys, tmp_path):
    def missing(argv):
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    monkeypatch.setitem(cli.COMMANDS, "toy", ("toy", "tests_cli_probe:run", "tests_cli_probe:parser"))
    monkeypatch.setitem(sys.modules, "tests_cli_probe", type(sys)("tests_cli_probe"))
    sys.modules["tests_cli_probe"].run = missing
    monkeypatch.setattr(cli, "_available", lambda target: True)
    assert cli.main(["toy", "list"]) == 3
    assert "pip install 'dapo-repro[toy]'" in capsys.readouterr().err

    def broken(argv):
        raise ModuleNotFoundError("No module named 'dapo.nonexistent'", name="dapo.nonexistent")

    sys.modules["tests_cli_probe"].run = broken
    monkeypatch.chdir(tmp_path)
    # a real bug is not dressed up as a missing extra: one line, the traceback in a log
    assert cli.main(["toy", "list"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error: ModuleNotFoundError" in err
    log = Path(err.split("traceback in ")[1].split(";")[0])
    assert log.parent == (tmp_path / "runs/logs") and "Traceback (most recent call last)" in log.read_text()

    def no_engine(argv):
        raise ImportError("the vllm engine needs vLLM: pip install 'dapo-repro[vllm]' (GPU)")

    sys.modules["tests_cli_probe"].run = no_engine
    assert cli.main(["toy", "list"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == "dapo toy: the vllm engine needs vLLM: pip install 'dapo-repro[vllm]' (GPU)"
    sys.modules["tests_cli_probe"].run = broken
    monkeypatch.setenv("DAPO_DEBUG", "1")
    with pytest.raises(ModuleNotFoundError):  # DAPO_DEBUG=1 re-raises for a debugger
        cli.main(["toy", "list"])


def test_core_imports_without_any_extra():
    """The core needs only torch (and numpy): block every optional package and import it."""
    code = (
        "import sys, importlib.abc\n"
        "BLOCK = {'scipy', 'gymnasium', 'transformers', 'accelerate', 'datasets', 'vllm', 'yaml', 'seaborn',\n"
        "         'pandas', 'matplotlib', 'safetensors', 'tokenizers', 'toybench', 'scale'}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in BLOCK:\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import dapo, dapo.health, dapo.health.readers, dapo.health.cli, dapo.logprobs, dapo.update, dapo.cli\n"
        "assert not any(m.split('.')[0] in BLOCK for m in sys.modules)\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
