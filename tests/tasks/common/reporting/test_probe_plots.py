"""The probes' figures: what each bar and line stands for."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from rescale_tasks.common.reporting import scalars_figure


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
