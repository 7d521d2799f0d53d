"""Figures drawn without a display (matplotlib's Agg backend), finished the same way everywhere."""
from __future__ import annotations

__all__ = ["new_figure", "finish_figure"]


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib figure on the Agg backend (no display needed) and its list of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def finish_figure(fig):
    """Grid, legends and layout of a figure shown or logged as it is (a saved one:
    :func:`rescale_tasks.studies.outputs.save_figure`)."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
