import json
from pathlib import Path

import pytest
from scale_support import need

need("datasets", "pyarrow")

import dapo_shaped  # noqa: E402

from scale.generator.data import (  # noqa: E402
    CACHE_VERSION,
    DAPO_TEMPLATE,
    ChatTemplateError,
    DataError,
    PromptStream,
    contamination,
    prepare_problems,
)


def load_problems(spec, **kwargs):
    """The problems as the run sees them, without a chat template."""
    return prepare_problems(spec, chat_template=False, **kwargs).problems


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


# ---- prepare_problems: unique problems, chat template, tokens, cache -----------------------


class Counting:
    """A tokenizer that counts its encode and chat-template calls (everything else delegated)."""

    def __init__(self, tok):
        self.tok, self.calls, self.renders = tok, 0, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tok(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.tok.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    d = tmp_path_factory.mktemp("shaped")
    return {
        "dapo.parquet": dapo_shaped.dapo_math(d / "dapo-math-17k.parquet"),
        "dapo.jsonl": dapo_shaped.dapo_math(d / "dapo-math-17k.jsonl"),
        "aime.parquet": dapo_shaped.aime_2024(d / "aime-2024.parquet"),
        "aime.jsonl": dapo_shaped.aime_2024(d / "aime-2024.jsonl"),
    }


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_dapo_math_17k_and_aime_2024_shapes_report_their_unique_counts(shaped, fmt):
    tok = dapo_shaped.tokenizer()
    for name, unique, rows in (("dapo", 170, 17000), ("aime", 30, 960)):
        path = shaped[f"{name}.{fmt}"]
        records = dapo_shaped.rows(unique, rows // unique, kind=name, seed=0 if name == "dapo" else 1)
        first = dapo_shaped.first_rows(records)
        for kwargs in ({"chat_template": False}, {"chat_template": True, "tokenizer": tok}):
            ps = prepare_problems(str(path), **kwargs)
            assert ps.summary() == f"{unique} unique problems from {rows} rows ({path})"
            assert ps.summary().startswith(f"{unique} unique problems from {rows} rows")
            assert (len(ps), ps.rows, ps.conflicts) == (unique, rows, [])
            # the first row of each problem, in the order of first rows, its own ground truth
            assert [p.row for p in ps.problems] == sorted(first.values())
            assert [p.row for p in ps.problems] == [first[p.question] for p in ps.problems]
            for p in ps.problems:
                assert p.answer == str(dapo_shaped.answer(_index(p.question))) and p.source == str(path)
            # the content already holds the instruction: the dapo template leaves it as it is
            assert all(p.question.startswith("Solve the following math problem") for p in ps.problems)
        assert ps.prompt_ids is not None and len(ps.prompt_ids) == unique


def _index(question: str) -> int:
    return int(question.split("[", 1)[1].split("]", 1)[0].split()[1])


def test_chat_template_is_applied_as_apply_chat_template_gives(tmp_path):
    tok = dapo_shaped.tokenizer()
    f = _write(
        tmp_path / "c.jsonl",
        [
            {"prompt": "What is 6 * 7 ?", "answer": 42},
            {
                "prompt": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "Find x ."},
                ],
                "reward_model": {"ground_truth": "34", "style": "rule-lang"},
            },
        ],
    )
    ps = prepare_problems(str(f), chat_template=True, tokenizer=tok)
    plain = DAPO_TEMPLATE.format(problem="What is 6 * 7 ?")
    want0 = tok.apply_chat_template(
        [{"role": "user", "content": plain}], add_generation_prompt=True, tokenize=False
    )
    want1 = tok.apply_chat_template(
        [
            {"role": "system", "content": "be brief"},  # every message kept, the system one too
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": DAPO_TEMPLATE.format(problem="Find x .")},  # the last user one
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert [p.prompt for p in ps.problems] == [want0, want1]
    assert want1.startswith("<|im_start|>system\nbe brief<|im_end|>\n") and want1.endswith("assistant\n")
    assert [p.question for p in ps.problems] == ["What is 6 * 7 ?", "Find x ."]
    # the ids as verl's RLHFDataset makes them: the rendered text already holds its special tokens
    assert ps.prompt_ids == [tok(w, add_special_tokens=False).input_ids for w in (want0, want1)]
    # chat_template false: the instruction-templated text, encoded as the tokenizer does by default
    ps = prepare_problems(str(f), chat_template=False, tokenizer=tok)
    assert ps.problems[0].prompt == plain and ps.prompt_ids[0] == tok(plain).input_ids
    assert ps.problems[1].prompt == DAPO_TEMPLATE.format(problem="Find x .")


def test_chat_template_from_a_file(tmp_path):
    tok = dapo_shaped.tokenizer()
    jinja = tmp_path / "plain.jinja"
    jinja.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]")
    f = _write(tmp_path / "d.jsonl", [{"prompt": "What is 6 * 7 ?", "answer": 42}])
    ps = prepare_problems(str(f), chat_template=str(jinja), tokenizer=tok, template="none")
    assert ps.problems[0].prompt == "[user] What is 6 * 7 ?\n[assistant]"
    assert ps.problems[0].prompt == tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 * 7 ?"}],
        add_generation_prompt=True,
        tokenize=False,
        chat_template=jinja.read_text(),
    )
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template: no such file"):
        prepare_problems(str(f), chat_template=str(tmp_path / "none.jinja"), tokenizer=tok)


def test_missing_chat_template_is_one_clear_error(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"prompt": "p", "answer": 1}])
    with pytest.raises(ChatTemplateError) as err:
        prepare_problems(str(f), chat_template=True, tokenizer=dapo_shaped.tokenizer(chat_template=None))
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("data.chat_template: true, but the tokenizer")
    assert "false" in msg and "Jinja" in msg
    assert isinstance(err.value, DataError)  # the commands report data errors in one line
    with pytest.raises(ValueError, match="needs a tokenizer"):
        prepare_problems(str(f), chat_template=True)
    with pytest.raises(ChatTemplateError, match="must be true, false or the path"):
        prepare_problems(str(f), chat_template=1, tokenizer=dapo_shaped.tokenizer())


def test_conflicting_ground_truths_are_kept_and_reported(tmp_path):
    f = _write(
        tmp_path / "c.jsonl",
        [
            {"prompt": "p1", "answer": 1},
            {"prompt": "p2", "answer": 2},
            {"prompt": "p1", "answer": "2"},
            {"prompt": "p1", "answer": "001"},  # the same answer, canonically: a duplicate
            {"prompt": "p3", "answer": 3},
            {"prompt": "p2", "answer": 5},
        ],
    )
    ps = prepare_problems(str(f), chat_template=False)
    assert [(p.row, p.answer) for p in ps.problems] == [(1, "1"), (2, "2"), (3, "2"), (5, "3"), (6, "5")]
    assert ps.conflicts == [(1, 3), (2, 6)]
    assert ps.summary() == (
        f"5 unique problems from 6 rows ({f}); warning: 2 prompt(s) appear with different "
        "answers, each kept (rows 1/3, 2/6)"
    )


def test_prompts_the_same_after_the_templates_are_one_problem(tmp_path):
    """De-duplication is by the final prompt text: records that differ only in what the
    templates remove (surrounding space; a system message without a chat template) merge."""
    f = _write(
        tmp_path / "d.jsonl",
        [
            {"prompt": "Find x.", "answer": 1},
            {"prompt": " Find x.\n", "answer": 1},
            {
                "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Find x."}],
                "answer": 1,
            },
        ],
    )
    assert prepare_problems(str(f), chat_template=False).summary().startswith("1 unique problems from 3 rows")
    ps = prepare_problems(str(f), chat_template=True, tokenizer=dapo_shaped.tokenizer())
    assert [p.row for p in ps.problems] == [1, 3]  # with the chat template, the system message counts


def test_malformed_rows_and_too_long_prompts_are_all_reported(tmp_path):
    records = [{"prompt": "What is 6 * 7 ?", "answer": 42}] * 3 + [{"prompt": "x", "answer": "1/2"}]
    f = _write(tmp_path / "d.jsonl", records)
    with pytest.raises(DataError) as err:
        prepare_problems(str(f), chat_template=False)
    assert [(row, fld) for _, row, fld, _ in err.value.problems] == [(4, "answer")]
    f = _write(tmp_path / "e.jsonl", [*records[:3], {"prompt": "a", "answer": 1}])
    tok = dapo_shaped.tokenizer()
    kw = dict(chat_template=True, tokenizer=tok, template="none")
    with pytest.raises(DataError) as err:
        prepare_problems(str(f), max_prompt_tokens=10, **kw)
    assert [row for _, row, _, _ in err.value.problems] == [1, 2, 3]  # every row holding it
    assert "11 tokens > max_prompt_tokens=10" in str(err.value)
    assert len(prepare_problems(str(f), max_prompt_tokens=11, **kw)) == 2
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="not a readable parquet file"):
        prepare_problems(str(bad), chat_template=False)
    with pytest.raises(FileNotFoundError):
        prepare_problems(str(tmp_path / "missing.parquet"), chat_template=False)


def test_cache_hit_reads_without_tokenising(shaped, tmp_path):
    tok = Counting(dapo_shaped.tokenizer())
    kw = dict(chat_template=True, tokenizer=tok, max_prompt_tokens=512, cache_dir=tmp_path / "cache")
    first = prepare_problems(str(shaped["dapo.parquet"]), **kw)
    assert not first.from_cache and tok.calls > 0 and tok.renders == 170  # rendered once per problem
    assert first.cache is not None and Path(first.cache).parent == tmp_path / "cache"
    calls, renders = tok.calls, tok.renders
    again = prepare_problems(str(shaped["dapo.parquet"]), **kw)
    assert again.from_cache and (tok.calls, tok.renders) == (calls, renders)  # no tokenising, no templating
    assert again.problems == first.problems and again.prompt_ids == first.prompt_ids
    assert (
        again.summary()
        == first.summary()
        == f"170 unique problems from 17000 rows ({shaped['dapo.parquet']})"
    )
    # the same bytes elsewhere: the same key, reported under the new path
    copy = tmp_path / "elsewhere.parquet"
    copy.write_bytes(shaped["dapo.parquet"].read_bytes())
    moved = prepare_problems(str(copy), **kw)
    assert moved.from_cache and moved.source == str(copy) and moved.problems[0].source == str(copy)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # no temporary files left behind


def test_cache_key_changes_with_every_input(tmp_path):
    cache = tmp_path / "cache"
    records = dapo_shaped.rows(20, 3)
    f = dapo_shaped.write(tmp_path / "d.parquet", records)
    jinja = tmp_path / "t.jinja"
    jinja.write_text(dapo_shaped.CHAT_TEMPLATE.replace("assistant", "bot"))
    base = dict(chat_template=True, tokenizer=dapo_shaped.tokenizer(), max_prompt_tokens=512, cache_dir=cache)

    def hit(**changes):
        return prepare_problems(str(f), **{**base, **changes}).from_cache

    assert not hit() and hit()
    variants = [
        dict(tokenizer=dapo_shaped.tokenizer(extra_words=("zebra",))),  # another vocabulary
        dict(tokenizer=dapo_shaped.tokenizer(chat_template=dapo_shaped.CHAT_TEMPLATE + " ")),  # its template
        dict(chat_template=str(jinja)),
        dict(chat_template=False),
        dict(template="none"),
        dict(max_prompt_tokens=400),
        dict(prompt_key="prompt"),
        dict(answer_key="reward_model.ground_truth"),
        dict(tokenizer=None, chat_template=False, max_prompt_tokens=None),
    ]
    for changes in variants:
        assert not hit(**changes), changes
        assert hit(**changes), changes
    assert len(list(cache.iterdir())) == len(variants) + 1
    jinja.write_text(dapo_shaped.CHAT_TEMPLATE.replace("assistant", "model"))  # the file's text, not its name
    assert not hit(chat_template=str(jinja))
    dapo_shaped.write(f, records[:-1])  # the data's bytes
    assert not hit() and hit()
    assert len(list(cache.iterdir())) == len(variants) + 3


def test_corrupt_cache_is_rebuilt_with_one_warning(tmp_path):
    f = dapo_shaped.aime_2024(tmp_path / "a.parquet")
    logged = []
    kw = dict(
        chat_template=True, tokenizer=dapo_shaped.tokenizer(), cache_dir=tmp_path / "c", log=logged.append
    )
    good = prepare_problems(str(f), **kw)
    path = Path(good.cache)
    text = path.read_text()
    assert f'"cache_version":{CACHE_VERSION}' in text and '"prompt_ids":[[' in text
    for corrupt in (
        text[: len(text) // 2].encode(),  # cut short (a full disk; os.replace never leaves half a file)
        b"",
        b"[1, 2]",
        text.replace('"rows":960', '"rows":"x"').encode(),
        text.replace('"prompt_ids":[[', '"prompt_ids":[7,[', 1).encode(),
        text.replace(f'"cache_version":{CACHE_VERSION}', '"cache_version":0').encode(),
        b"\xff\xfe\x00 not text",
    ):
        path.write_bytes(corrupt)
        ps = prepare_problems(str(f), **kw)
        assert not ps.from_cache and ps.problems == good.problems and ps.prompt_ids == good.prompt_ids
        assert len(logged) == 1 and len(logged[0].splitlines()) == 1, logged
        assert logged[0].startswith(f"warning: data cache {path} is unreadable") and "rebuilding" in logged[0]
        logged.clear()
        assert prepare_problems(str(f), **kw).from_cache and not logged  # rewritten whole


def test_cache_writers_racing_on_one_key_leave_one_whole_file(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    f = dapo_shaped.aime_2024(tmp_path / "a.jsonl")
    cache = tmp_path / "c"
    with ThreadPoolExecutor(4) as pool:
        sets = list(
            pool.map(lambda _: prepare_problems(str(f), chat_template=False, cache_dir=cache), range(8))
        )
    assert {s.summary() for s in sets} == {f"30 unique problems from 960 rows ({f})"}
    assert [p.name for p in cache.iterdir()] == [Path(sets[0].cache).name]
    assert prepare_problems(str(f), chat_template=False, cache_dir=cache).from_cache


def test_unwritable_cache_dir_is_a_warning_not_a_failure(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"prompt": "p", "answer": 1}])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    logged = []
    ps = prepare_problems(str(f), chat_template=False, cache_dir=blocker / "sub", log=logged.append)
    assert len(ps) == 1 and ps.cache is None
    assert len(logged) == 1 and "cannot write the data cache" in logged[0]


def test_eval_rows_are_deduplicated_and_limit_counts_problems(shaped):
    tok = dapo_shaped.tokenizer()
    ps = prepare_problems(str(shaped["aime.parquet"]), chat_template=True, tokenizer=tok)
    assert len(ps) == 30 and len({p.prompt for p in ps.problems}) == 30
    head = ps.head(8)
    assert len(head) == 8 and head.problems == ps.problems[:8] and head.prompt_ids == ps.prompt_ids[:8]
    assert ps.head(None) is ps


def test_contamination_compares_questions_not_the_chat_wrapping(tmp_path):
    tok = dapo_shaped.tokenizer()
    train = _write(tmp_path / "t.jsonl", [{"prompt": "alpha beta gamma delta", "answer": 1}])
    ev = _write(
        tmp_path / "e.jsonl",
        [
            {"prompt": "epsilon zeta eta theta", "answer": 2},
            {"prompt": "alpha beta gamma delta", "answer": 3},
        ],
    )
    kw = dict(chat_template=True, tokenizer=tok)
    hits = contamination(
        prepare_problems(str(train), **kw).problems, prepare_problems(str(ev), **kw).problems, n=3
    )
    assert [(h.train_row, h.eval_row) for h in hits] == [(1, 2)]  # not row 1: the wrapping is no overlap


def test_a_datasets_directory_is_read_in_batches_and_keyed_by_its_fingerprint(tmp_path, monkeypatch):
    """A spec that is no data file goes to ``datasets.load_dataset`` (a hub id, or as here a
    local directory of parquet files); the cache key then holds the dataset's fingerprint."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    (tmp_path / "aime").mkdir()
    dapo_shaped.aime_2024(tmp_path / "aime" / "train.parquet")
    kw = dict(chat_template=False, cache_dir=tmp_path / "cache")
    ps = prepare_problems(str(tmp_path / "aime"), **kw)
    assert ps.summary() == f"30 unique problems from 960 rows ({tmp_path / 'aime'}[train])"
    assert not ps.from_cache and prepare_problems(str(tmp_path / "aime"), **kw).from_cache


def test_a_tokenizer_that_cannot_be_fingerprinted_is_not_cached(tmp_path):
    class Words:  # encodes, but shows nothing a cache key could hold
        def __call__(self, text, **kwargs):
            return type("E", (), {"input_ids": [len(w) for w in text.split()]})()

    f = _write(tmp_path / "d.jsonl", [{"prompt": "a bb ccc", "answer": 1}] * 2)
    logged = []
    ps = prepare_problems(
        str(f),
        chat_template=False,
        tokenizer=Words(),
        template="none",
        cache_dir=tmp_path / "c",
        log=logged.append,
    )
    assert ps.prompt_ids == [[1, 2, 3]] and ps.cache is None and not (tmp_path / "c").exists()
    assert logged == [f"warning: Words cannot be fingerprinted; {f} is not cached"]


def test_the_longest_prompt_of_the_whole_set_sets_the_context_and_one_that_cannot_fit_is_named(tmp_path):
    """The engine's context comes from every prompt, not the first 2,000: a long prompt at row
    2,501 counts; with an explicit ``rollout.max_model_len`` a prompt that leaves less than the
    response ceiling is refused by file and row, never silently cut short."""

    class Tok:
        def __call__(self, text):
            return type("E", (), {"input_ids": text.split()})()

    rows = [{"prompt": f"p{i}", "answer": i} for i in range(2500)] + [{"prompt": "w " * 40, "answer": 7}]
    f = _write(tmp_path / "long.jsonl", rows)
    ps = prepare_problems(str(f), template="none", chat_template=False, tokenizer=Tok())
    assert ps.longest_prompt() == 40
    ps.check_context(24, 64, "algo.max_len")  # 40 + 24 fits exactly
    with pytest.raises(DataError) as err:
        ps.check_context(25, 64, "algo.max_len")
    assert err.value.problems == [
        (str(f), 2501, "prompt", "40 prompt tokens + algo.max_len=25 exceed rollout.max_model_len=64")
    ]
    assert f"{f}:2501: prompt: 40 prompt tokens" in str(err.value)


@pytest.mark.parametrize(
    "raised",
    [
        ConnectionError("Couldn't reach 'org/set' on the Hub (LocalEntryNotFoundError)"),
        TimeoutError("read timed out"),
    ],
)
def test_a_hub_dataset_that_cannot_be_fetched_is_one_line_naming_it(monkeypatch, raised):
    """Offline, or a name the Hub does not know: the reader says which source and what to do
    (a FileNotFoundError, which `dapo train` reports in one line with exit 2), not a traceback."""
    import datasets

    from scale.generator.data import _Reader

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(FileNotFoundError, match=r"data source 'org/set': not a local .*could not provide it"):
        _Reader("org/set", "train")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: 1 / 0)  # a bug stays a bug
    with pytest.raises(ZeroDivisionError):
        _Reader("org/set", "train")


def test_dapo_train_with_a_missing_data_file_is_one_line_and_exit_2(tmp_path):
    """Issue 51's rough edge: a missing ``data.train`` was "internal error" (exit 70)."""
    import os
    import subprocess
    import sys

    from scale.ops.tiny import build_tiny_data, build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    _, ev = build_tiny_data(tmp_path / "data")
    data = [f"data.train={tmp_path / 'no_such.jsonl'}", f"data.eval={ev}", f"output.dir={tmp_path / 'run'}"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo.cli",
            "train",
            "--config",
            "tiny-cpu",
            "--quiet",
            f"model.path={model}",
            *data,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        cwd=Path(__file__).resolve().parents[1],
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[-1] == f"dapo train: data.train: no such data file: '{tmp_path / 'no_such.jsonl'}'", lines
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()  # a failed start leaves nothing


def test_the_tiny_presets_first_run_says_what_it_builds(tmp_path, capsys):
    """`dapo train --config tiny-cpu` builds the model and data on first use: a line before
    each build (no silent stretch), none once they exist."""
    from scale.config import load
    from scale.ops.tiny import ensure_tiny

    cfg = load(
        "tiny-cpu",
        [
            f"model.path={tmp_path / 'tiny-model'}",
            f"data.train={tmp_path / 'tiny-data' / 'train.jsonl'}",
            f"data.eval={tmp_path / 'tiny-data' / 'eval.jsonl'}",
        ],
    )
    ensure_tiny(cfg)
    captured = capsys.readouterr()
    assert "building" not in captured.err  # stderr stays for the one line of a refusal
    out = [line for line in captured.out.splitlines() if line.startswith("building")]
    assert out == [
        f"building the tiny random model {tmp_path / 'tiny-model'} (once)",
        f"building the tiny data {tmp_path / 'tiny-data'} (once)",
    ]
    assert (tmp_path / "tiny-model" / "config.json").is_file()
    ensure_tiny(cfg)
    assert "building" not in capsys.readouterr().out
