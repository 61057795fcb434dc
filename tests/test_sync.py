"""The streaming weight sync (scale/learner/sync.py) and the vLLM engine's two load paths, on one
process. The multi-process FSDP2 sync is exercised by `nox -s rehearsal`."""

import importlib.util

import pytest
import torch
from scale_support import need

need("transformers", "safetensors")

from scale.generator.engines.base import EngineError  # noqa: E402
from scale.generator.engines.vllm_engine import VLLMEngine, load_path  # noqa: E402
from scale.learner.sync import SyncStats, stream_weights, sync  # noqa: E402


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from scale.ops.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("sync") / "m", format_steps=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_every_tensor_once_in_order_with_the_tied_output_layer(lm):
    state = lm.state_dict()
    got = list(stream_weights(lm, dtype=torch.float32, device="cpu", bucket_bytes=1 << 16))
    names = [n for n, _ in got]
    assert "lm_head.weight" in names and len(names) == len(set(names))
    assert [n for n in names if n != "lm_head.weight"] == [n for n in state if n != "lm_head.weight"]
    out = dict(got)
    for n, t in state.items():
        assert torch.equal(out[n], t), n
    assert torch.equal(out["lm_head.weight"], lm.get_input_embeddings().weight)


def test_no_copy_when_the_engine_takes_the_trainers_dtype(lm):
    stats = SyncStats()
    for _ in stream_weights(lm, dtype=torch.float32, device="cpu", bucket_bytes=1 << 16, stats=stats):
        pass
    state = lm.state_dict()
    assert stats.peak_bytes == 0 and stats.tensors == len(state) + ("lm_head.weight" not in state)
    assert stats.largest_tensor_bytes == max(t.numel() * 4 for t in lm.state_dict().values())


@pytest.mark.parametrize("bucket", [1, 40_000, 1 << 30])
def test_extra_memory_is_one_bucket_at_a_time(lm, bucket):
    """bf16 engine: every tensor is a fresh cast. At each tensor the consumer sees, the sync
    holds at most one bucket (or one tensor larger than the bucket); the whole model only when
    the bucket is larger than the model."""
    stats = SyncStats()
    largest = max(t.numel() * 2 for t in lm.state_dict().values())
    total = sum(t.numel() * 2 for t in lm.state_dict().values())
    seen = []
    for name, t in stream_weights(lm, dtype=torch.bfloat16, device="cpu", bucket_bytes=bucket, stats=stats):
        assert t.dtype == torch.bfloat16
        seen.append(stats.live)
        assert stats.live <= max(bucket, largest), (name, stats.live)
    assert stats.peak_bytes == max(seen) and stats.live == 0
    if bucket == 1:
        assert stats.peak_bytes == largest
    if bucket >= total:
        assert stats.peak_bytes == total
    m = stats.metrics()
    assert m["sync/largest_tensor_bytes"] == largest and m["sync/peak_bytes"] == stats.peak_bytes


def test_nothing_is_gathered_before_the_engine_asks(lm):
    stats = SyncStats()
    stream = stream_weights(lm, dtype=torch.bfloat16, device="cpu", bucket_bytes=1, stats=stats)
    assert stats.peak_bytes == 0  # a generator: no work until consumed
    next(stream)
    assert 0 < stats.live <= max(t.numel() * 2 for t in lm.state_dict().values())


class FakeWorker:
    def __init__(self, streaming: bool):
        self.loaded: list[str] = []
        self.calls = 0
        runner = type("Runner", (), {})()
        model = type("Model", (), {})()
        model.load_weights = lambda weights: self.loaded.extend(n for n, _ in weights)
        runner.model = model
        if streaming:

            def reload_weights(weights_iterator=None, weights_path=None):
                self.calls += 1
                self.loaded.extend(n for n, _ in weights_iterator)

            runner.reload_weights = reload_weights
            self.reload_weights = reload_weights  # vLLM's Worker forwards to its model runner
        self.model_runner = runner


class FakeLLM:
    def __init__(self, worker):
        self.worker = worker
        self.events: list[str] = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if callable(method):
            return [method(self.worker, *args, **(kwargs or {}))]
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self):
        self.events.append("reset")

    def sleep(self, level=1):
        self.events.append("sleep")

    def wake_up(self, tags=None):
        self.events.append(f"wake:{','.join(tags) if tags else 'all'}")


def engine(llm):
    eng = object.__new__(VLLMEngine)
    eng.llm, eng.on_gpu, eng.sync_timeout_s, eng.asleep = llm, False, 10.0, False
    eng.sleep_during_training = True
    eng.path = load_path(llm)
    return eng


@pytest.mark.parametrize("streaming", [True, False], ids=["reload_weights", "load_weights"])
def test_both_vllm_load_paths_get_every_tensor(lm, streaming):
    w = FakeWorker(streaming)
    eng = engine(FakeLLM(w))
    assert eng.path == ("reload" if streaming else "load_weights")
    stats = sync(eng, lm, dtype=torch.bfloat16, device="cpu", bucket_mb=0.01)
    assert w.loaded == [n for n, _ in stream_weights(lm, dtype=torch.float32, device="cpu", bucket_bytes=1)]
    assert w.calls == (1 if streaming else 0)  # the layerwise reload takes the whole model in one call
    assert stats.tensors == len(w.loaded) and stats.seconds > 0


def test_a_sleeping_engine_wakes_weights_first_and_kv_cache_after_the_sync(lm):
    llm = FakeLLM(FakeWorker(True))
    eng = engine(llm)
    eng.sleep()
    sync(eng, lm, dtype=torch.float32, device="cpu", bucket_mb=1)
    assert llm.events == ["sleep", "wake:weights", "reset", "wake:kv_cache"] and not eng.asleep


def test_a_stream_without_the_output_layer_is_refused():
    eng = engine(FakeLLM(FakeWorker(True)))
    with pytest.raises(EngineError, match="lm_head"):
        eng.sync_weights(iter([("model.embed_tokens.weight", torch.zeros(2))]))


def test_cpu_tensor_parallel_shared_memory_is_named_per_run(monkeypatch):
    """vLLM-CPU names its TP shared memory the same for every external_launcher run; a run
    resumed after a SIGKILL then fails on the segments the killed one left. The engine prefixes
    the names with the run's rendezvous address."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM")
    from vllm.distributed.device_communicators import cpu_communicator as cc

    from scale.generator.engines.vllm_engine import _name_cpu_shm, cpu_shm_ident

    # restored after the test as it was (a staticmethod)
    monkeypatch.setattr(
        cc._CPUSHMDistributed, "make_group_name", vars(cc._CPUSHMDistributed)["make_group_name"]
    )
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")  # what vLLM's CPU worker sets under external_launcher
    comm = type("C", (), {"unique_name": "tp:0", "ranks": [2, 3]})()
    assert cpu_shm_ident().startswith("dapo-") and "/" not in cpu_shm_ident()  # from the rendezvous address
    _name_cpu_shm("dapo-10.0.0.7_29511")
    _name_cpu_shm("dapo-other")  # idempotent: the first run's name stays
    assert cc._CPUSHMDistributed.make_group_name(comm) == "dapo-10.0.0.7_29511-tp:0-[2-3]-cpushm"
