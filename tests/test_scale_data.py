import json

import pytest
from scale_support import need

need("datasets", "pyarrow")

from scale.data import DAPO_TEMPLATE, DataError, PromptStream, contamination, load_problems  # noqa: E402


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_flat_and_dapo_formats(tmp_path):
    f = _write(
        tmp_path / "a.jsonl",
        [
            {"prompt": "What is 6*7?", "answer": 42},
            {"problem": "Sum?", "answer": "1,000"},
            {
                "prompt": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "Find x. Answer: later"},
                ],
                "reward_model": {"ground_truth": "34", "style": "rule-math"},
                "data_source": "math_dapo",
            },
        ],
    )
    ps = load_problems(str(f))
    assert [p.answer for p in ps] == ["42", "1000", "34"]
    assert ps[0].prompt == DAPO_TEMPLATE.format(problem="What is 6*7?")
    assert ps[2].prompt == "Find x. Answer: later"  # already carries the instruction
    assert [p.row for p in ps] == [1, 2, 3]
    assert load_problems(str(f), template="none")[0].prompt == "What is 6*7?"


def test_every_malformed_row_is_reported_with_file_and_line(tmp_path):
    f = _write(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "ok", "answer": 1},
            "{not json",
            {"prompt": "", "answer": 2},
            {"prompt": "x", "answer": "1/2"},
            {"answer": 3},
            {"prompt": "y"},
            [1, 2],
            {"prompt": "z", "answer": True},
        ],
    )
    with pytest.raises(DataError) as err:
        load_problems(str(f))
    # JSON errors are reported first (parsing), then nothing else is trusted
    assert err.value.problems == [(str(f), 2, "<json>", err.value.problems[0][3])]
    f2 = _write(
        tmp_path / "bad2.jsonl",
        [
            {"prompt": "ok", "answer": 1},
            {"prompt": "", "answer": 2},
            {"prompt": "x", "answer": "1/2"},
            {"answer": 3},
            {"prompt": "y"},
            [1, 2],
            {"prompt": "z", "answer": True},
        ],
    )
    with pytest.raises(DataError) as err:
        load_problems(str(f2))
    rows = [(row, field) for _, row, field, _ in err.value.problems]
    assert rows == [
        (2, "prompt"),
        (3, "answer"),
        (4, "prompt"),
        (5, "answer"),
        (6, "<record>"),
        (7, "answer"),
    ]
    assert f"{f2}:3: answer" in str(err.value)


def test_parquet_and_token_limit(tmp_path):
    import pandas as pd

    f = tmp_path / "d.parquet"
    pd.DataFrame({"prompt": ["a b c", "d"], "answer": [1, 2]}).to_parquet(f)
    assert len(load_problems(str(f))) == 2

    class Tok:
        def __call__(self, text):
            return type("E", (), {"input_ids": text.split()})()

    with pytest.raises(DataError, match="max_prompt_tokens"):
        load_problems(str(f), template="none", tokenizer=Tok(), max_prompt_tokens=2)
    with pytest.raises(FileNotFoundError):
        load_problems(str(tmp_path / "missing.jsonl"))


def test_contamination_finds_shared_ngrams_not_the_template(tmp_path):
    train = _write(
        tmp_path / "t.jsonl",
        [
            {
                "prompt": "Let x be the number of ways to tile a 2 by 10 board with dominoes today",
                "answer": 89,
            },
            {"prompt": "Completely unrelated question about primes below one hundred", "answer": 25},
        ],
    )
    ev = _write(
        tmp_path / "e.jsonl",
        [
            {"prompt": "Let x be the number of ways to tile a 2 by 10 board with dominoes now", "answer": 89},
            {"prompt": "Something else entirely", "answer": 1},
        ],
    )
    hits = contamination(load_problems(str(train)), load_problems(str(ev)), n=8)
    assert [(h.train_row, h.eval_row) for h in hits] == [(1, 1)]
    assert hits[0].fraction_of_eval > 0.5


def test_prompt_stream_resumes_exactly(tmp_path):
    f = _write(tmp_path / "s.jsonl", [{"prompt": f"p{i}", "answer": i} for i in range(7)])
    ps = load_problems(str(f))
    a = PromptStream(ps, seed=3)
    a.take(5)
    state = a.state_dict()
    rest = [p.row for p in a.take(12)]
    b = PromptStream(ps, seed=3)
    b.load_state_dict(state)
    assert [p.row for p in b.take(12)] == rest
    with pytest.raises(ValueError):
        PromptStream(ps, seed=4).load_state_dict(state)
