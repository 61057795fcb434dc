"""The 32B preset's scaled copy (scale/rehearsal/preset_copy.py), which `nox -s rehearsal` trains: it
differs from the preset only where the table says why, so every setting the preset gains is
rehearsed (or the rehearsal fails until the table names it)."""

import inspect
from pathlib import Path

import pytest
import yaml
from scale_support import need

from scale.config import load, resolve_path
from scale.rehearsal import preset_copy as pc


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flat(v, f"{key}.") if isinstance(v, dict) else {key: v})
    return out


@pytest.fixture(scope="module")
def preset():
    return flat(yaml.safe_load(resolve_path(pc.PRESET).read_text()))


@pytest.fixture(scope="module")
def copy():
    cfg = load(pc.PRESET, pc.overrides(Path("m"), Path("t.jsonl"), Path("e.jsonl"), Path("o")))
    return flat(cfg.to_dict())


def test_every_preset_setting_is_kept_unless_the_table_says_why(preset, copy):
    for key, value in preset.items():
        if key in pc.SCALED:
            assert pc.SCALED[key][1].strip(), key
            continue
        got = copy[key]
        assert (list(got) if isinstance(got, tuple) else got) == value, (key, got, value)


def test_the_table_only_names_preset_settings_it_really_changes(preset, copy):
    for key, (value, why) in pc.SCALED.items():
        assert key in preset, f"{key} is not a setting of {pc.PRESET}: remove it from SCALED"
        assert why.strip()
        if not str(value).startswith("<"):
            assert copy[key] == value != preset[key], key
    for key, (value, why) in pc.EXTRA.items():
        assert key not in preset and key in copy and copy[key] == value and why.strip(), key


def test_the_code_paths_the_preset_selects_are_on_in_the_copy(copy):
    """What the issue's crash came from must be in the rehearsal: offload, rank-0 loading,
    bf16 compute and engine, FSDP2, the chat template, the tracker, the diagnosis."""
    assert copy["train.fsdp_offload"] and copy["train.cpu_ram_efficient_loading"]
    assert copy["train.sharding"] == "fsdp2" and copy["train.mixed_precision"] == "bf16"
    assert copy["rollout.dtype"] == "bfloat16" and copy["model.gradient_checkpointing"]
    assert copy["data.chat_template"] is True and copy["data.template"] == "dapo"
    assert list(copy["output.trackers"]) == ["tensorboard"] and copy["diagnose.every_steps"] == 10
    assert (
        copy["train.steps"] >= copy["diagnose.every_steps"] and copy["train.steps"] >= 2 * copy["eval.every"]
    )


def test_the_rehearsal_trains_the_copy():
    from scale.rehearsal import run as rehearsal

    assert "preset_copy(" in inspect.getsource(rehearsal.rehearse)


def test_the_copys_data_takes_the_presets_template_and_chat_template_paths(tmp_path):
    need("transformers", "tokenizers", "datasets")
    from transformers import AutoTokenizer

    from scale.generator.data import prepare_problems

    model = pc.build_model(tmp_path / "m")
    train, _ = pc.build_data(tmp_path / "d")
    tok = AutoTokenizer.from_pretrained(model)
    ps = prepare_problems(str(train), template="dapo", chat_template=True, tokenizer=tok, cache_dir=None)
    raw = prepare_problems(str(train), template="dapo", chat_template=False, tokenizer=tok, cache_dir=None)
    assert ps.rows > len(ps.problems)  # duplicated rows, as in DAPO-Math-17k
    prompt_end = tok.convert_tokens_to_ids(",")  # the tiny chat template's generation prompt
    assert all(c == [*r, prompt_end] for c, r in zip(ps.prompt_ids, raw.prompt_ids))
    assert tok.unk_token_id not in {i for ids in ps.prompt_ids for i in ids}  # in the tiny words


PRESETS = sorted(
    p.stem for p in (Path(pc.__file__).parents[1] / "configs").glob("*.yaml") if not p.stem.startswith("tiny")
)


def test_every_full_scale_preset_has_a_rehearsed_copy():
    """A preset added to scale/configs/ without a copy table (and the processes it runs on) is
    a preset no rehearsal exercises."""
    assert PRESETS == sorted(pc.COPIES) == sorted(pc.PROCESSES), (PRESETS, sorted(pc.COPIES))
    from scale.rehearsal import run as rehearsal

    assert "pc.PROCESSES.items()" in inspect.getsource(rehearsal.rehearse)  # every copy is trained


@pytest.mark.parametrize("name", PRESETS)
def test_each_copy_keeps_every_setting_of_its_preset_unless_its_table_says_why(name):
    preset = flat(yaml.safe_load(resolve_path(name).read_text()))
    copy = flat(
        load(name, pc.overrides(Path("m"), Path("t.jsonl"), Path("e.jsonl"), Path("o"), name)).to_dict()
    )
    table = pc.COPIES[name]
    for key, value in preset.items():
        if key in table:
            continue
        got = copy[key]
        assert (list(got) if isinstance(got, tuple) else got) == value, (name, key, got, value)
    for key, (value, why) in table.items():
        assert key in preset, f"{key} is not a setting of {name}: remove it from its table"
        assert why.strip(), key
        if not str(value).startswith("<"):
            assert copy[key] == value != preset[key], (name, key)
    # the copy reaches what the preset does periodically: evaluation, diagnosis, a checkpoint
    steps = copy["train.steps"]
    assert steps >= copy["eval.every"] and steps >= copy["diagnose.every_steps"]
    assert steps >= copy["output.checkpoint_every"]
    nodes, per_node = pc.PROCESSES[name]
    assert (nodes * per_node) % copy["rollout.tensor_parallel"] == 0
    assert copy["algo.train_groups"] % (nodes * per_node) == 0


def test_every_preset_passes_validate_only_with_its_data_in_the_real_shape(tmp_path, monkeypatch, capsys):
    """`dapo train --config PRESET --validate-only` (model and data in the real sets' shape, the
    tokenizer with a chat template, as the preset applies it): exit 0 for every rung."""
    need("transformers", "tokenizers", "datasets")
    from scale.ops.cli import train_main

    monkeypatch.setenv("HOME", str(tmp_path))  # data.cache_dir: ~/.cache/dapo/data
    model = pc.build_model(tmp_path / "m")
    train, ev = pc.build_data(tmp_path / "d")
    for name in PRESETS:
        argv = ["--config", name, "--validate-only", f"model.path={model}", f"data.train={train}"]
        argv += [f"data.eval={ev}", f"output.dir={tmp_path / name}"]
        assert train_main(argv) == 0, (name, capsys.readouterr().err)
