"""benchmarks/gpu_check.py must be ready when a GPU is lent: its code path (FSDP2 with bf16
compute over 2 processes, the packed update, the streaming sync into a bf16 engine,
generation and the log-prob gap) runs here on CPU processes at a small shape."""

import json
from pathlib import Path

import pytest
from multiproc import run_script
from scale_support import need

need("transformers", "accelerate", "safetensors", "yaml")

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_its_code_path_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    args = ["--allow-cpu", "--layers", "2", "--vocab", "2048", "--response", "48", "--prompt", "16"]
    run_script(
        [str(ROOT / "benchmarks/gpu_check.py"), *args, "--max-tokens", "192", "--out", str(out)], nproc=2
    )
    r = json.loads(out.read_text())
    assert "error" not in r, r.get("traceback")
    assert r["sharded"] == "FSDPPolicy" and r["update"]["optimizer_steps"] == 1
    assert r["update"]["fraction_of_weights_moved_lr_1e-6"] > 0.99  # fp32 masters, bf16 compute
    assert r["sync"]["within_2x_bucket_or_largest"] and r["sync"]["bytes_gib"] > 0
    assert r["generation"]["tokens"] > 0 and r["generation"]["logp_gap_max"] < 0.1  # bf16 both sides
