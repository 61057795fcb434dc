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
