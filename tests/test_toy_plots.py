"""The toy figures are read by people: the legend never covers a panel, and arms that
coincide (the two one-update controls of entropy_collapse give the same curve) stay
distinguishable by their dashes and widths."""

from __future__ import annotations

import pytest

pytest.importorskip("seaborn")
pytest.importorskip("matplotlib")

from toybench.experiment import run_experiments
from toybench.experiments import REGISTRY


@pytest.fixture(scope="module")
def result():
    return run_experiments(
        [REGISTRY["entropy_collapse"]], seeds=2, jobs=1, steps=4, confirm=False, progress=False
    )[0]


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legend_is_outside_every_panel(result):
    import matplotlib.pyplot as plt

    from toybench.plots import experiment_figure

    fig = experiment_figure(result)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not _overlap(box, ax.get_window_extent(renderer)), ax.get_title()
        assert not _overlap(box, ax.get_tightbbox(renderer)), f"legend over {ax.get_title()!r}'s labels"
    # each arm by its readable label (the experiment's), never its internal name
    labels = REGISTRY["entropy_collapse"].labels
    assert set(labels) == set(result.logs)
    assert {t.get_text() for t in fig.legends[0].get_texts()} == set(labels.values())
    plt.close(fig)


def test_every_arm_has_its_own_style_so_coinciding_arms_stay_visible(result):
    import matplotlib.pyplot as plt

    from toybench.plots import experiment_figure

    fig = experiment_figure(result)
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        styles = {(str(ln.get_linestyle()), ln.get_linewidth(), ln.get_color()) for ln in lines}
        widths = [ln.get_linewidth() for ln in lines]
        assert len(styles) == len(lines) == len(result.logs)
        assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)
    plt.close(fig)


def test_every_toy_arm_has_a_readable_label():
    from toybench.experiments import BEYOND
    from toybench.off_policy import protection_experiments

    for e in [*REGISTRY.values(), *BEYOND.values(), *protection_experiments()]:
        assert set(e.labels) == set(e.arms), e.name


def test_the_off_policy_figure_is_small_multiples_with_readable_labels(tmp_path):
    """Every DAPO configuration of the grid is drawn, at most four per panel, each correction
    by its readable label and in the same colour in every panel."""
    import matplotlib.image

    from toybench import off_policy as O
    from toybench.off_policy_report import _figure
    from toybench.stats import Interval

    iv = Interval(0.0, -0.01, 0.01, 10)
    rows = [
        {"config": c.label, "k": k, "accuracy": {"discovery": iv}, "entropy": {"discovery": iv}}
        for c in O.configs()
        for k in O.STALENESS
        if k
    ]
    import matplotlib.pyplot as plt

    from toybench.off_policy_report import off_policy_figure

    fig = off_policy_figure(rows)
    drawn: dict[str, set[str]] = {}
    for ax in fig.axes:
        assert 0 < len(ax.containers) <= 4, ax.get_title()
        for h in ax.containers:
            drawn.setdefault(h.get_label(), set()).add(str(h.lines[0].get_color()))
    plt.close(fig)
    assert _figure(rows, tmp_path) == "off_policy.png"
    assert matplotlib.image.imread(tmp_path / "off_policy.png").size
    dapo_corrections = {c.correction for c in O.configs() if c.base == "dapo"}
    assert set(drawn) == {O.CORRECTION_LABELS[c] for c in dapo_corrections}
    assert all(len(colours) == 1 for colours in drawn.values())
