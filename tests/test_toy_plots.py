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
    assert {t.get_text() for t in fig.legends[0].get_texts()} == set(result.logs)
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
