"""The probes' table rows and figures: the signal propagation of a network's residual blocks
(per-block variances and ``eta_k``) and its learned branch multipliers. ``rescale analyze`` writes
them as tables and PNGs; :class:`~.analysis_logger.AnalysisPlotsLogger` logs the same figures to W&B
while a run trains.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from matplotlib.ticker import MaxNLocator

from rescale_core.analysis import full_parameters, residual_blocks, stage_of

from .figures import finish_figure, new_figure

__all__ = ["SIGNAL_COLUMNS", "SCALAR_COLUMNS", "signal_rows", "gain_rows", "signal_figure", "scalars_figure",
           "rows_by_run", "log_scale_if_positive"]

SIGNAL_COLUMNS = ["run", "block", "stage", "k", "var_skip", "var_branch", "var_sum", "var_out", "eta", "gain",
                  "chan_mean_sq_out", "chan_var_out"]
SCALAR_COLUMNS = ["run", "step", "block", "stage", "k", "gain", "gain_min", "gain_max", "gain_std"]


def signal_rows(records: Sequence[dict], run: str) -> list[dict]:
    """Table rows of :func:`rescale_core.analysis.signal_propagation` records."""
    return [{"run": run, "block": r["name"], "stage": r["stage"], "k": r["k"], "var_skip": r["var_skip"],
             "var_branch": r["var_branch"], "var_sum": r["var_sum"], "var_out": r["var_out"], "eta": r["eta"],
             "gain": r["gain"], "chan_mean_sq_out": r["chan_mean_sq_out"], "chan_var_out": r["chan_var_out"]}
            for r in records]


def gain_rows(net: torch.nn.Module, run: str = "", step: int = 0) -> list[dict]:
    """The learned branch multiplier of every residual block that has one: its mean, and for a
    vector (per-channel) gain its min, max and std (empty for a scalar gain). Under FSDP every
    rank must call it (:func:`rescale_core.analysis.full_parameters`)."""
    with full_parameters(net):
        return _gain_rows(net, run, step)


def _gain_rows(net: torch.nn.Module, run: str, step: int) -> list[dict]:
    rows = []
    for name, block in residual_blocks(net):
        gain = block.merge.gain
        if gain is None:
            continue
        w = gain.weight.detach().double().flatten()
        vector = w.numel() > 1
        rows.append({"run": run, "step": step, "block": name, "stage": stage_of(name), "k": block.merge.k,
                     "gain": float(w.mean()),
                     "gain_min": float(w.min()) if vector else None, "gain_max": float(w.max()) if vector else None,
                     "gain_std": float(w.std(unbiased=False)) if vector else None})
    return rows


def rows_by_run(rows: Sequence[dict], key: str = "run") -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row[key], []).append(row)
    return out


def log_scale_if_positive(ax, values, mask: bool = False) -> None:
    """Log scale when every value is positive, or (``mask``) when some are (the others not drawn:
    a SkipInit branch is exactly 0 at initialisation)."""
    values = [v for v in values if v is not None]
    if values and (all(v > 0 for v in values) or (mask and any(v > 0 for v in values))):
        ax.set_yscale("log", nonpositive="mask")


def signal_figure(rows: Sequence[dict], title: Optional[str] = None):
    """Three panels over the block index k (forward order): Var[x_k] (block outputs), eta_k, and
    the variances of the skip and branch terms (solid/dashed: the SkipInit view); dotted lines at
    the stage boundaries (grey when the runs share them, else each run's in its colour)."""
    fig, (ax_var, ax_eta, ax_terms) = new_figure(3, width=4.6)
    runs = rows_by_run(rows)
    for i, (run, rs) in enumerate(runs.items()):
        color = f"C{i % 10}"
        k = list(range(1, len(rs) + 1))
        ax_var.plot(k, [r["var_out"] for r in rs], "o-", ms=3, color=color, label=run)
        ax_eta.plot(k, [r["eta"] for r in rs], "o-", ms=3, color=color, label=run)
        ax_terms.plot(k, [r["var_skip"] for r in rs], "-", color=color, label=f"{run} skip")
        ax_terms.plot(k, [r["var_branch"] for r in rs], "--", color=color, label=f"{run} branch")
    # stage boundaries: grey when every run has the same, else each run's own in its colour
    # (a 20-layer and a 56-layer ResNet change stage at different k)
    boundaries = [[j + 0.5 for j in range(1, len(rs)) if rs[j]["stage"] != rs[j - 1]["stage"]]
                  for rs in runs.values()]
    shared = all(b == boundaries[0] for b in boundaries)
    for ax in (ax_var, ax_eta, ax_terms):
        for i, at in enumerate(boundaries[:1] if shared else boundaries):
            for x in at:
                ax.axvline(x, color="0.7" if shared else f"C{i % 10}", lw=0.8, ls=":")
        ax.set_xlabel("block k")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    log_scale_if_positive(ax_var, [r["var_out"] for r in rows], mask=True)
    log_scale_if_positive(ax_eta, [r["eta"] for r in rows])
    log_scale_if_positive(ax_terms, [v for r in rows for v in (r["var_skip"], r["var_branch"])], mask=True)
    ax_var.set_ylabel("Var[x_k] (block output)")
    ax_eta.set_ylabel("eta_k")
    ax_terms.set_ylabel("Var of skip (solid), branch (dashed)")
    ax_var.set_title(title or "signal propagation")
    ax_eta.set_title("relative error of Eq. 1")
    ax_terms.set_title("skip and branch terms")
    return finish_figure(fig)


def scalars_figure(rows: Sequence[dict], title: Optional[str] = None):
    """Bars: every block's multiplier at the last step of each run (min-max range for vector
    gains); lines: the multipliers over training when a run has several steps."""
    runs = rows_by_run(rows)
    over_time = any(len({r["step"] for r in rs}) > 1 for rs in runs.values())
    fig, axes = new_figure(2 if over_time else 1, width=max(5.0, 0.3 * len({r["block"] for r in rows}) * len(runs) + 3))
    ax = axes[0]
    width = 0.8 / max(len(runs), 1)
    # every run's blocks, the deepest run's order first (a 20-layer and a 56-layer run side by side)
    deepest = sorted(runs.values(), key=lambda rs: -len({r["block"] for r in rs}))
    blocks = list(dict.fromkeys(r["block"] for rs in deepest for r in rs))
    for i, (run, rs) in enumerate(runs.items()):
        last = max(r["step"] for r in rs)
        rs = [r for r in rs if r["step"] == last]
        x = [blocks.index(r["block"]) + (i - (len(runs) - 1) / 2) * width for r in rs]
        ranges = [[r["gain"] - r["gain_min"] if r["gain_min"] is not None else 0 for r in rs],
                  [r["gain_max"] - r["gain"] if r["gain_max"] is not None else 0 for r in rs]]
        vector = any(r["gain_min"] is not None for r in rs)
        ax.bar(x, [r["gain"] for r in rs], width=width, color=f"C{i % 10}", label=f"{run} (step {last})",
               yerr=ranges if vector else None, capsize=2)
    ax.set_xticks(range(len(blocks)), blocks, rotation=90, fontsize=7)
    ax.set_ylabel("learned multiplier (mean)")
    ax.set_title(title or "learned branch multipliers")
    if over_time:
        ax = axes[1]
        styles = ["-", "--", ":", "-."]
        for i, (run, rs) in enumerate(runs.items()):
            names = list(dict.fromkeys(r["block"] for r in rs))
            for j, block in enumerate(names):
                points = sorted((r["step"], r["gain"]) for r in rs if r["block"] == block)
                ax.plot([p[0] for p in points], [p[1] for p in points], styles[i % 4], marker="o", ms=3,
                        color=f"C{j % 10}", label=block if len(runs) == 1 else f"{run} {block}")
        ax.set_xlabel("global step")
        ax.set_ylabel("learned multiplier (mean)")
        ax.set_title("over training")
    return finish_figure(fig)
