"""The placement interface (scale/placement/interface.py): ``rollout.mode`` names a built-in or
``module:Class``; a placement of one's own, registered from outside ``scale/`` (tests/placement_example.py),
trains as the built-in it extends, every call the loop makes reaching it; a mode that names no
placement is one line and exit status 2 before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scale_support import need

need("transformers", "accelerate", "datasets", "safetensors", "yaml")


def test_the_configs_choices_are_the_built_in_placements():
    from scale.config import PLACEMENTS
    from scale.placement.interface import BUILT_IN, Placement, placement_class

    assert set(PLACEMENTS) == set(BUILT_IN)
    for mode in PLACEMENTS:
        cls = placement_class(mode)
        assert issubclass(cls, Placement) and cls.mode == mode
    assert (
        placement_class("colocated").learners_generate
        and not placement_class("disaggregated").learners_generate
    )


@pytest.mark.parametrize(
    "mode, said",
    [
        ("sideways", "neither a built-in (colocated, disaggregated) nor module:Class"),
        ("placement_example:Missing", "cannot import placement_example:Missing"),
        ("no_such_module_here:Thing", "cannot import no_such_module_here:Thing"),
        ("placement_example:NotAPlacement", "is not a subclass of scale.placement.interface.Placement"),
        ("json:dumps", "is not a subclass"),
        ("placement_example:Incomplete", "does not define collect, publish"),
    ],
)
def test_a_mode_that_names_no_placement_is_refused_in_one_line(mode, said):
    from scale.placement.interface import PlacementError, placement_class

    with pytest.raises(PlacementError) as err:
        placement_class(mode)
    assert said in str(err.value) and len(str(err.value).splitlines()) == 1


def test_the_config_refuses_a_mode_that_is_neither_built_in_nor_module_class():
    from dapo.config import ConfigError
    from scale.config import load

    with pytest.raises(ConfigError) as err:
        load("tiny-cpu", ["rollout.mode=sideways"])
    assert err.value.field == "rollout.mode" and "module:Class" in str(err.value)
    assert (
        load("tiny-cpu", ["rollout.mode=placement_example:Recorded"]).rollout.mode
        == "placement_example:Recorded"
    )


def test_a_placement_of_ones_own_trains_as_the_placement_it_extends(tiny, tmp_path):
    from test_scale_trainer import metrics, overrides, run_cli, same

    tests = {"PYTHONPATH": str(Path(__file__).parent)}  # the placement's module, outside scale/
    ref, own = tmp_path / "ref", tmp_path / "own"
    run = ["train", "--config", "tiny-cpu", "--quiet"]
    args = ("rollout.engine=hf", "train.steps=2", "eval.every=0")
    r = run_cli([*run, *overrides(tiny, ref, *args)])
    assert r.returncode == 0, r.stderr
    r = run_cli([*run, *overrides(tiny, own, *args, "rollout.mode=placement_example:Recorded")], tests)
    assert r.returncode == 0, r.stderr
    same(metrics(ref), metrics(own), tol=0.0)
    calls = [json.loads(x) for x in (own / "placement_calls.jsonl").read_text().splitlines()]
    assert [c["call"] for c in calls] == ["start", "collect", "publish", "collect", "publish", "close"]
    assert [c.get("step", c.get("version")) for c in calls[1:5]] == [0, 1, 1, 2]
    bad = run_cli(
        [*run, *overrides(tiny, tmp_path / "bad", *args, "rollout.mode=placement_example:NotAPlacement")]
    )
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("dapo train: rollout.mode='placement_example:NotAPlacement'")
    )
    assert "Traceback" not in bad.stderr and not (tmp_path / "bad" / "metrics.jsonl").exists()
