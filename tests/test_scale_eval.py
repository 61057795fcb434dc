import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale.generator.evaluation import ProblemResult, majority_answer, pass_at_k, summarize


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_exhaustive_subset_average(nck):
    n, c, k = nck
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(32, 0, 1) == 0.0 and pass_at_k(32, 32, 32) == 1.0
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_majority_and_summary():
    assert majority_answer(["3", None, "4", "4", "3"]) == "3"  # tie: earliest to reach the top count
    assert majority_answer([None, None]) is None
    rs = [
        ProblemResult("4", ["4", "4", "1", None]),
        ProblemResult("7", ["1", "2", "7", "1"]),
        ProblemResult("9", ["0", "0", "0", "0"]),
    ]
    s = summarize(rs, ks=[1, 2, 4])
    assert s["eval/avg@4"] == pytest.approx((0.5 + 0.25 + 0) / 3)
    assert s["eval/pass@1"] == pytest.approx(s["eval/avg@4"])
    assert s["eval/pass@4"] == pytest.approx(2 / 3)
    assert s["eval/cons@4"] == pytest.approx(1 / 3)
    assert s["eval/avg@4_lo"] <= s["eval/avg@4"] <= s["eval/avg@4_hi"]
    assert not math.isnan(s["eval/pass@2"])


@pytest.mark.parametrize("chat", ["true", "false"])
def test_dapo_eval_deduplicates_aime_rows_and_uses_the_prepared_ids(chat, tmp_path, monkeypatch, capsys):
    """AIME-2024 ships each of its 30 problems 32 times: ``dapo eval`` samples k per unique
    problem (not 32k), says so, and generates from the prepared prompt ids."""
    from scale_support import need

    need("transformers", "pyarrow", "yaml")
    import json
    from types import SimpleNamespace

    import dapo_shaped
    from transformers import AutoTokenizer

    from dapo import cli
    from scale.generator.data import prepare_problems

    data = dapo_shaped.aime_2024(tmp_path / "aime-2024.parquet")
    model = dapo_shaped.model_dir(tmp_path / "model")
    seen = []

    def generate(args, tok, prompts, seeds=None):
        seen.append(prompts)
        return [[SimpleNamespace(token_ids=[])] * args.k for _ in prompts]

    monkeypatch.setattr("scale.ops.cli._generate", generate)
    monkeypatch.setattr("scale.ops.cli.quiet_engines", lambda verbose: None)
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(model), "--data", str(data), "--k", "4", "--chat-template", chat]
    assert cli.main([*argv, "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert f"dapo eval: 30 unique problems from 960 rows ({data})" in stderr
    assert "eval/avg@4" in stdout and "unique problems" not in stdout  # stdout: the results only
    want = prepare_problems(
        str(data), chat_template=chat == "true", tokenizer=AutoTokenizer.from_pretrained(model)
    )
    assert seen == [want.prompt_ids] and len(want.prompt_ids) == 30
    assert want.problems[0].prompt.startswith("<|im_start|>user\n") == (chat == "true")
    result = json.loads(out.read_text())
    assert result["summary"]["eval/problems"] == 30 and len(result["predictions"]) == 30
    assert [p["row"] for p in result["predictions"]] == [p.row for p in want.problems]
    assert result["data"].startswith("30 unique problems from 960 rows")
    assert result["trained_with"] is None  # a model dapo export did not write
    (model / "dapo_training.json").write_text(json.dumps({"step": 3, "algo": {"policy_loss": "mylosses:f"}}))
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["trained_with"]["algo"]["policy_loss"] == "mylosses:f"
    assert cli.main([*argv, "--limit", "8"]) == 0  # the first 8 problems, not the first 8 rows
    assert seen[-1] == want.prompt_ids[:8]
