"""dapo.prompt_selection: the promises a run relies on. No prompt is kept with less than its
policy's stated floor, so none starves; decisions are a pure function of the seed, the step,
the prompt and the history, so every rank (and a resumed run) decides the same; the history's
streaks and the policies' adaptation follow their definitions."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.prompt_selection import (
    POLICIES,
    DifficultyPools,
    Greso,
    NoSelection,
    PromptRecord,
    PromptSelection,
    RetireSolved,
    make_policy,
    select,
    uniform,
)

G = 8
records = st.builds(
    PromptRecord,
    groups=st.integers(0, 50),
    last_step=st.integers(-1, 100),
    last_correct=st.integers(0, G),
    last_size=st.just(G),
    streak=st.integers(-30, 30),
)


def floor_of(policy) -> float:
    if isinstance(policy, Greso):
        return policy.floor
    if isinstance(policy, RetireSolved):
        return policy.revisit
    if isinstance(policy, DifficultyPools):
        w = (policy.hard, policy.normal, policy.easy, policy.unseen)
        return min(w) / max(w)
    return 1.0


def all_policies():
    return [NoSelection(), Greso(), RetireSolved(), DifficultyPools()]


@given(st.integers(0, 2**31), st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 50))
def test_uniform_is_a_fixed_number_in_the_unit_interval(seed, step, key, draw):
    u = uniform(seed, step, key, draw)
    assert 0.0 <= u < 1.0 and u == uniform(seed, step, key, draw)


def test_uniform_is_uniform_and_independent_of_neighbouring_arguments():
    us = [uniform(0, step, key, 0) for step in range(100) for key in range(100)]
    assert abs(sum(us) / len(us) - 0.5) < 0.01
    for q in (0.1, 0.25, 0.5, 0.9):  # the empirical CDF at a few points
        assert abs(sum(u < q for u in us) / len(us) - q) < 0.015
    pairs = [(uniform(0, s, 7, 0), uniform(0, s + 1, 7, 0)) for s in range(5000)]
    mx = sum(a for a, _ in pairs) / len(pairs)
    my = sum(b for _, b in pairs) / len(pairs)
    cov = sum((a - mx) * (b - my) for a, b in pairs) / len(pairs)
    assert abs(cov / (1 / 12)) < 0.05  # consecutive steps: uncorrelated


@given(records, st.sampled_from(range(4)), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_no_policy_keeps_a_prompt_with_less_than_its_floor(record, which, easy, hard):
    policy = all_policies()[which]
    for _ in range(3):  # after adaptation too, however far it went
        policy.adapt(easy, hard)
    p, cls = policy.keep_probability(record)
    assert floor_of(policy) - 1e-12 <= p <= 1.0 and isinstance(cls, str)
    assert policy.keep_probability(None)[0] >= floor_of(policy)


def test_a_skipped_prompt_is_revisited_with_at_least_the_stated_probability():
    """GRESO at its floor (a prompt all-correct 40 times running): kept on >= 1% of offers."""
    sel = PromptSelection(Greso(), seed=3)
    for step in range(40):
        sel.observe([5], [G], G, step)
    assert sel.policy.keep_probability(sel.history[5])[0] == pytest.approx(0.01)
    kept = sum(sel.decide(5, step).keep for step in range(40, 40_040))
    # binomial(40000, 0.01): mean 400, sd ~20
    assert kept >= 400 - 4 * 20


@given(st.lists(st.floats(0.02, 0.98), min_size=5, max_size=5))
@settings(max_examples=10, deadline=None)
def test_decisions_keep_at_the_rate_the_policy_states(probs):
    """Whatever probability a policy states, the hashed draws keep at that rate."""

    class Fixed(NoSelection):
        def keep_probability(self, record):
            return probs[0] if record is None else probs[record.groups % 5], "fixed"

    sel = PromptSelection(Fixed(), seed=11)
    n = 4000
    kept = sum(sel.decide(key, 1).keep for key in range(n))
    sd = math.sqrt(n * probs[0] * (1 - probs[0]))
    assert abs(kept - n * probs[0]) <= 4.5 * sd


@given(st.sampled_from(sorted(POLICIES)), st.integers(0, 1000))
@settings(max_examples=12, deadline=None)
def test_no_prompt_starves_even_when_every_group_is_uniform(name, seed):
    """Every group all correct (the worst case for skipping): every prompt of the stream is
    still generated again within a bounded number of offers."""
    sel = PromptSelection(make_policy(name), seed=seed)
    prompts = 16
    last_kept = dict.fromkeys(range(prompts), 0)
    longest = 0
    for step in range(1, 3001):
        offers = list(range(prompts))
        kept, used = select(sel, iter(offers), prompts, step, prompts)
        assert used == prompts and set(kept) <= set(offers)
        sel.observe(kept, [G] * len(kept), G, step)
        sel.end_step()
        for k in kept:
            longest = max(longest, step - last_kept[k])
            last_kept[k] = step
    # the floor is 1% (GRESO), 5% (retire) or 20% (pools): a gap of 2,000 offers has
    # probability < 0.99 ** 2000 ~ 2e-9 per prompt
    assert longest < 2000


outcomes = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, G)), min_size=1, max_size=60
)  # (prompt, correct) per generated group


def _replay(sel: PromptSelection, history, steps_from: int = 0):
    decisions = []
    for i, (key, c) in enumerate(history):
        step = steps_from + i // 4
        decisions.append(sel.decide(key, step).keep)
        sel.observe([key], [c], G, step)
        if i % 4 == 3:
            sel.end_step()
    return decisions


@given(outcomes, st.sampled_from(sorted(POLICIES)), st.integers(0, 99))
@settings(max_examples=40, deadline=None)
def test_every_rank_decides_the_same_and_a_resumed_run_continues_exactly(history, name, seed):
    """Two ranks fed the same global outcomes make the same decisions; a run restored from a
    JSON round trip of the state after the first half makes the second half's decisions."""
    a, b = PromptSelection(make_policy(name), seed), PromptSelection(make_policy(name), seed)
    assert _replay(a, history) == _replay(b, history)
    half = (len(history) // 8) * 4  # at a step boundary
    c = PromptSelection(make_policy(name), seed)
    _replay(c, history[:half])
    state = json.loads(json.dumps(c.state_dict()))
    d = PromptSelection(make_policy(name), seed=seed + 1)  # the seed comes from the state
    d.load_state_dict(state)
    e = PromptSelection(make_policy(name), seed)
    _replay(e, history[:half])
    assert _replay(d, history[half:], half // 4) == _replay(e, history[half:], half // 4)


def test_a_checkpoint_of_another_policy_is_refused():
    state = PromptSelection(Greso()).state_dict()
    with pytest.raises(ValueError, match="'greso', this run's 'retire'"):
        PromptSelection(RetireSolved()).load_state_dict(state)


@given(st.lists(st.integers(0, G), min_size=1, max_size=40))
def test_the_streak_counts_the_trailing_uniform_groups_of_one_kind(corrects):
    sel = PromptSelection(NoSelection())
    for step, c in enumerate(corrects):
        sel.observe([0], [c], G, step)
    rec = sel.history[0]
    last = corrects[-1]
    if 0 < last < G:
        assert rec.streak == 0
    else:
        n = 0
        for c in reversed(corrects):
            if c != last:
                break
            n += 1
        assert rec.streak == (n if last == G else -n)
    assert rec.groups == len(corrects) and rec.last_correct == last
    assert 0.0 <= rec.informative_probability() <= 1.0


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=200))
def test_greso_exploration_stays_in_bounds_and_moves_toward_its_targets(shares):
    g = Greso()
    for easy, hard in shares:
        before = (g.p_easy, g.p_hard)
        g.adapt(easy, hard)
        assert g.p_min <= g.p_easy <= g.p_max and g.p_min <= g.p_hard <= g.p_max
        # more zero-variance groups of a kind than its target: explore that kind less
        if easy >= g.target_zero_variance / 3:
            assert g.p_easy <= before[0]
        else:
            assert g.p_easy >= before[0]
        if hard >= g.target_zero_variance * 2 / 3:
            assert g.p_hard <= before[1]


def test_greso_keeps_with_probability_p_to_the_streak():
    g = Greso(p_init=0.5)
    assert g.keep_probability(PromptRecord(groups=3, streak=3, last_size=G, last_correct=G)) == (
        0.125,
        "easy",
    )
    assert g.keep_probability(PromptRecord(groups=2, streak=-2, last_size=G))[0] == 0.25
    assert g.keep_probability(PromptRecord(groups=2, streak=0, last_size=G, last_correct=3)) == (
        1.0,
        "informative",
    )
    assert g.keep_probability(None) == (1.0, "unseen")


def test_retire_when_solved_retires_at_the_pass_rate_and_brings_back_what_fails_again():
    sel = PromptSelection(RetireSolved(pass_rate=1.0, revisit=0.05))
    sel.observe([1, 2], [G, G - 1], G, 0)
    assert sel.policy.keep_probability(sel.history[1]) == (0.05, "retired")
    assert sel.policy.keep_probability(sel.history[2]) == (1.0, "informative")
    assert sel.end_step()["sampling/retired_prompts"] == 1.0
    sel.observe([1], [3], G, 5)  # revisited, and no longer solved
    assert sel.policy.keep_probability(sel.history[1]) == (1.0, "informative")
    assert sel.end_step()["sampling/retired_prompts"] == 0.0


def test_difficulty_pools_follow_prime_rls_thresholds():
    pools = DifficultyPools()
    rec = lambda c: PromptRecord(groups=1, last_correct=c, last_size=G)  # noqa: E731
    assert pools.keep_probability(rec(2)) == (0.2, "hard")  # 0.25 is hard (inclusive)
    assert pools.keep_probability(rec(3)) == (1.0, "normal")
    assert pools.keep_probability(rec(6)) == (1.0, "normal")  # 0.75 inclusive
    assert pools.keep_probability(rec(7)) == (0.2, "easy")
    assert pools.keep_probability(None) == (1.0, "unseen")


def test_select_takes_no_offer_it_does_not_decide_on():
    stream = iter(range(100))
    sel = PromptSelection(NoSelection())
    kept, used = select(sel, stream, 5, 0, 50)
    assert kept == [0, 1, 2, 3, 4] and used == 5 and next(stream) == 5
    kept, used = select(sel, stream, 0, 0, 50)
    assert kept == [] and used == 0 and next(stream) == 6
    retired = PromptSelection(RetireSolved(revisit=1e-9))
    retired.observe(list(range(10)), [G] * 10, G, 0)
    kept, used = select(retired, iter(range(10)), 3, 1, 4)  # all retired: stops at max_offers
    assert kept == [] and used == 4


def test_metrics_account_for_every_offer_and_group():
    sel = PromptSelection(RetireSolved(revisit=1e-9), seed=0)
    sel.observe([0, 1, 2, 3], [G, 0, 4, 4], G, 0)
    m = sel.end_step()
    assert m["sampling/informative_groups"] == 2.0 and m["sampling/realised_informative_rate"] == 0.5
    assert math.isnan(m["sampling/predicted_informative_rate"])  # nothing known before step 0
    kept, used = select(sel, iter([0, 1, 2, 3]), 4, 1, 4)
    assert kept == [1, 2, 3] and used == 4
    sel.observe(kept, [0, 4, 4], G, 1)
    m = sel.end_step()
    assert m["sampling/offered_prompts"] == 4.0 and m["sampling/skipped_prompts"] == 1.0
    assert m["sampling/skipped_retired"] == 1.0 and m["sampling/retired_prompts"] == 1.0
    assert 0.0 < m["sampling/predicted_informative_rate"] < 1.0


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("gresso", {}, "unknown prompt selection 'gresso'"),
        ("greso", {"floor": 0.0}, "floor"),
        ("greso", {"target": 0.3}, "no option 'target'"),
        ("retire", {"revisit": 0.0}, "revisit"),
        ("pools", {"easy": 0.0}, "weights"),
    ],
)
def test_bad_selection_settings_are_named(name, options, message):
    with pytest.raises(ValueError, match=message):
        make_policy(name, **options)


def test_observe_refuses_outcomes_that_cannot_be():
    sel = PromptSelection(NoSelection())
    with pytest.raises(ValueError, match="9 correct of a group of 8"):
        sel.observe([0], [9], G, 0)
    with pytest.raises(ValueError, match="2 keys for 1 outcomes"):
        sel.observe([0, 1], [1], G, 0)


def test_fill_completes_a_short_round_with_the_streams_next_prompts_undecided():
    sel = PromptSelection(RetireSolved(revisit=1e-9))
    sel.observe(list(range(10)), [G] * 10, G, 0)  # every prompt retired
    stream = iter(range(100))
    kept, used = select(sel, stream, 3, 1, 4, fill=True)
    assert kept == [4, 5, 6] and used == 7 and next(stream) == 7
    assert sel.end_step()["sampling/forced_prompts"] == 3.0


@pytest.mark.parametrize(
    "spec, ok",
    [
        ("none", True),
        ("greso", True),
        ("greso:target_zero_variance=0.3, floor=0.02", True),
        ("retire:revisit=0.1", True),
        ("greso:floor", False),
        ("greso:floor=abc", False),
        ("pool", False),
    ],
)
def test_algo_config_validates_the_selection_spec(spec, ok):
    from dapo import AlgoConfig
    from dapo.config import ConfigError

    if ok:
        assert AlgoConfig(prompt_selection=spec).prompt_selection == spec
    else:
        with pytest.raises(ConfigError, match="prompt_selection"):
            AlgoConfig(prompt_selection=spec)
