import pytest
from scale_support import need

need("yaml")

from dapo.config import ConfigError  # noqa: E402
from scale.config import PRESET_DIR, load  # noqa: E402


def test_presets_load_and_the_paper_setup_is_encoded():
    c = load("qwen2.5-32b-dapo")
    a = c.algo
    assert (a.eps_low, a.eps_high, a.group_size, a.train_groups) == (0.2, 0.28, 16, 512)
    assert a.train_groups // a.mini_batch_groups == 16
    assert (a.expected_len, a.cache_len, a.max_len) == (16384, 4096, 20480)
    assert a.loss_agg == "token-mean" and a.dynamic_sampling and a.soft_overlong
    assert c.train.lr == 1e-6 and c.train.warmup_steps == 20
    assert (c.eval.k, c.eval.temperature, c.eval.top_p) == (32, 1.0, 0.7)
    assert c.rollout.tensor_parallel == 4 and c.model.path == "Qwen/Qwen2.5-32B"
    tiny = load("tiny-cpu")
    assert tiny.model.dtype == "float32"


def test_data_presets_chat_template_and_cache():
    # the paper's numbers come from verl's DAPO recipe, which applies the tokenizer's chat template
    c = load("qwen2.5-32b-dapo")
    assert c.data.chat_template is True and c.data.cache_dir == "~/.cache/dapo/data"
    for name in ("tiny-cpu", "tiny-cpu-fsdp"):  # the tiny word-level tokenizer has no template
        assert load(name).data.chat_template is False


def test_data_chat_template_path_and_cache_dir(tmp_path):
    jinja = tmp_path / "chat.jinja"
    jinja.write_text("{{ messages[0]['content'] }}")
    c = load("tiny-cpu", [f"data.chat_template={jinja}", "data.cache_dir=null"])
    assert c.data.chat_template == str(jinja) and c.data.cache_dir is None
    assert load("tiny-cpu", ["data.chat_template=true"]).data.chat_template is True
    for override, words in [
        (f"data.chat_template={tmp_path / 'none.jinja'}", ["no such file", "none.jinja"]),
        ("data.chat_template=1", ["true, false or the path"]),
        ("data.chat_template=''", ["true, false or the path"]),
        ("data.cache_dir=''", ["null"]),
        ("data.cache_dir=[a]", ["string"]),
    ]:
        with pytest.raises(ConfigError) as err:
            load("tiny-cpu", [override])
        assert err.value.field == override.split("=")[0], override
        assert len(str(err.value).splitlines()) == 1 and all(w in str(err.value) for w in words), str(
            err.value
        )


@pytest.mark.parametrize(
    "override,field",
    [
        ("algo.eps_low=1.5", "algo.eps_low"),
        ("algo.eps_lo=0.1", "algo.eps_lo"),
        ("rollout.temprature=0.7", "rollout.temprature"),
        ("rollout.temperature=0.7", "rollout.temperature"),
        ("rollout.engine=sglang", "rollout.engine"),
        ("train.lr=2", "train.lr"),
        ("train.micro_batch_size=0", "train.micro_batch_size"),
        ("eval.top_p=0", "eval.top_p"),
        ("output.trackers=[mlflow]", "output.trackers"),
        ("model.dtype=int8", "model.dtype"),
        ("diagnose.every_steps=-1", "diagnose.every_steps"),
        ("diagnose.every=5", "diagnose.every"),
        ("rollout.mode=async", "rollout.mode"),
        ("rollout.max_staleness=2", "rollout.max_staleness"),  # colocated: nothing to overlap
        ("rollout.max_staleness=-1", "rollout.max_staleness"),
        ("rollout.correction=tis", "rollout.correction"),
        ("rollout.partial=true", "rollout.partial"),  # needs max_staleness >= 1
        ("rollout.partial_tokens=0", "rollout.partial_tokens"),
    ],
)
def test_bad_values_name_the_field(override, field):
    """The field, and where its value came from: an override is blamed on the command line,
    never on the preset's file (issue 30); a value the file holds, on the file."""
    with pytest.raises(ConfigError) as err:
        load("tiny-cpu", [override])
    assert err.value.field == field
    assert f"command-line override {override!r}" in str(err.value)
    assert "tiny-cpu.yaml" not in str(err.value)


def test_a_bad_value_in_the_file_is_blamed_on_the_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text((PRESET_DIR / "tiny-cpu.yaml").read_text().replace("lr: 1.0e-3", "lr: 2.0"))
    with pytest.raises(ConfigError) as err:
        load(str(f), ["train.steps=5"])
    assert err.value.field == "train.lr" and str(f) in str(err.value)
    assert "command-line" not in str(err.value)


def test_unknown_section_missing_section_and_bad_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("algo: {}\nmodel: {path: x}\ndata: {train: y}\nextra: {}\n")
    with pytest.raises(ConfigError) as err:
        load(str(f))
    assert err.value.field == "extra"
    f.write_text("algo: {}\nmodel: {path: x}\n")
    with pytest.raises(ConfigError, match="data"):
        load(str(f))
    f.write_text("algo: [\n")
    with pytest.raises(ConfigError, match="YAML"):
        load(str(f))
    f.write_text("algo: !!python/object/apply:os.system ['echo hi']\nmodel: {path: x}\ndata: {train: y}\n")
    with pytest.raises(ConfigError):  # safe_load refuses arbitrary objects
        load(str(f))
    with pytest.raises(ConfigError, match="preset"):
        load("no-such-preset")


def test_overrides_apply():
    c = load("tiny-cpu", ["algo.eps_high=0.3", "rollout.engine=hf", "train.betas=[0.9, 0.95]"])
    assert c.algo.eps_high == 0.3 and c.rollout.engine == "hf" and c.train.betas == (0.9, 0.95)
    with pytest.raises(ConfigError):
        load("tiny-cpu", ["noequals"])


def test_the_config_reaches_trackers_as_flat_scalars():
    """tensorboard's add_hparams refuses nested dicts, lists and None: the 32B preset's tracker
    crashed the run at start before the config was flattened."""
    from scale.config import load
    from scale.records import tracker_config

    flat = tracker_config(load("qwen2.5-32b-dapo").to_dict())
    assert flat["train.fsdp_offload"] is True and flat["algo.eps_high"] == 0.28
    assert flat["output.trackers"] == '["tensorboard"]' and flat["rollout.max_model_len"] == "null"
    assert all(isinstance(v, (int, float, str, bool)) for v in flat.values())
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard.summary import hparams

    hparams(flat, {})  # what accelerate's tensorboard tracker calls


def test_disaggregated_placement_rules_and_default_correction():
    dis = ["rollout.mode=disaggregated", "eval.every=0"]
    with pytest.raises(ConfigError, match="generators hold older policy versions") as err:
        load("tiny-cpu", ["rollout.mode=disaggregated"])
    assert err.value.field == "eval.every"
    with pytest.raises(ConfigError, match="not divisible by rollout.generators=4") as err:
        load("tiny-cpu", [*dis, "rollout.generators=4"])  # 6 prompts per round
    assert err.value.field == "rollout.gen_groups"
    with pytest.raises(ConfigError) as err:
        load("tiny-cpu", [*dis, "rollout.generators=0"])
    assert err.value.field == "rollout.generators"
    # a tensor-parallel generator (the fsdp preset's TP 2) is accepted with the vLLM engine only
    assert load("tiny-cpu-fsdp", [*dis]).rollout.tensor_parallel == 2
    with pytest.raises(ConfigError, match="needs rollout.engine: vllm") as err:
        load("tiny-cpu-fsdp", [*dis, "rollout.engine=hf"])
    assert err.value.field == "rollout.tensor_parallel"
    # k > 0: the algo section's own correction stays (the tiny preset: token TIS at 2) ...
    cfg = load("tiny-cpu", [*dis, "rollout.max_staleness=2"])
    assert (cfg.algo.tis_cap, cfg.algo.is_level) == (2.0, "token")
    # ... without one, token-level TIS (what the toys' table tolerates furthest); a preset name
    # replaces it; keep leaves it as written
    cfg = load("tiny-cpu", [*dis, "rollout.max_staleness=2", "algo.tis_cap=null"])
    assert (cfg.algo.tis_cap, cfg.algo.is_level) == (2.0, "token")
    cfg = load("tiny-cpu", [*dis, "rollout.max_staleness=1", "rollout.correction=icepop"])
    assert (cfg.algo.tis_cap, cfg.algo.is_lower) == (5.0, 0.5)
    cfg = load("tiny-cpu", [*dis, "rollout.max_staleness=1", "algo.tis_cap=null", "rollout.correction=keep"])
    assert cfg.algo.tis_cap is None and cfg.algo.rejection is None
    cfg = load("tiny-cpu", [*dis, "algo.tis_cap=null"])  # k = 0: on-policy, nothing to correct
    assert cfg.algo.tis_cap is None
