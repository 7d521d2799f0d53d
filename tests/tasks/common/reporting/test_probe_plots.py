"""The probes' figures: what each bar and line stands for."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from rescale_tasks.common.reporting import scalars_figure, signal_figure


def _gains(run: str, blocks: int, gain: float) -> list[dict]:
    return [{"run": run, "step": 0, "block": f"layer1.{i}", "gain": gain, "gain_min": None, "gain_max": None}
            for i in range(blocks)]


def test_scalars_of_runs_of_other_depths_each_have_their_own_bar():
    """A 2-block and a 4-block run side by side: the deeper run's last blocks were drawn on one spot
    past the shallower run's blocks, without a name. Every block has its place and its tick."""
    fig = scalars_figure(_gains("shallow", 2, 1.0) + _gains("deep", 4, 2.0))
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"layer1.{i}" for i in range(4)]
        assert [p.get_x() + p.get_width() / 2 for p in ax.patches] == pytest.approx([-0.2, 0.8, 0.2, 1.2, 2.2, 3.2])
        assert [p.get_height() for p in ax.patches] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    finally:
        plt.close(fig)


def _signal(run: str, per_stage: int) -> list[dict]:
    return [{"run": run, "stage": f"layer{s}", "var_out": 1.0 + k, "eta": 0.1, "var_skip": 1.0, "var_branch": 0.5}
            for k, s in enumerate(s for s in (1, 2, 3) for _ in range(per_stage))]


def _boundaries(ax) -> list[tuple[float, str]]:
    """(k, colour) of every vertical line."""
    return sorted((line.get_xdata()[0], line.get_color()) for line in ax.lines
                  if len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2 and line.get_linestyle() == ":")


def test_signal_figure_draws_every_runs_stage_boundaries():
    """A 3-block-a-stage and a 9-block-a-stage network on one figure: only the first run's stage
    boundaries were drawn (the deeper one's stages seemed to change at k 3.5 and 6.5). Each run now
    has its own, in its colour; runs of one depth share grey ones."""
    fig = signal_figure(_signal("r20", 3) + _signal("r56", 9))
    try:
        for ax in fig.axes:
            assert _boundaries(ax) == [(3.5, "C0"), (6.5, "C0"), (9.5, "C1"), (18.5, "C1")]
    finally:
        plt.close(fig)
    fig = signal_figure(_signal("bn", 3) + _signal("rescale", 3))
    try:
        assert all(_boundaries(ax) == [(3.5, "0.7"), (6.5, "0.7")] for ax in fig.axes)
    finally:
        plt.close(fig)
