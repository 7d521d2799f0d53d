"""The plots of the studies: the final metric against depth (diverged runs marked), learning
curves per depth averaged over seeds, the optimal and largest stable learning rate against the batch
size, and the curves of every seed.
"""
from __future__ import annotations

import math

from matplotlib.ticker import NullFormatter

from ..common.reporting import new_figure
from ..common.run import higher_is_better
from .grid import Grid
from .outputs import StudyOutputs
from .seeded import mean_curve
from .tables import unstable

__all__ = ["curves_plot", "depth_plot", "batch_lr_plots", "seed_plot"]


def curves_plot(outputs: StudyOutputs, grid: Grid, rows: list[dict], metric: str, panel_key: str,
                 name: str, panel_label: str | None = None) -> None:
    """Learning curves: one panel per ``panel_key`` value (a depth), per scheme the mean over seeds
    of ``metric`` against the step (band: min to max), diverged runs left out; each panel titled
    ``{panel_label} {value}`` (default: the key)."""
    by_name = {p.name: p for p in grid.points}
    panels = sorted({r[panel_key] for r in rows})
    if not panels:
        return
    fig, axes = new_figure(len(panels), width=4.2, height=3.4)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    for ax, panel in zip(axes, panels):
        for i, scheme in enumerate(schemes):
            mine = [r for r in rows if r[panel_key] == panel and r["scheme"] == scheme and r["status"] != "not run"]
            curves = []
            for r in mine:
                if r["status"].startswith("diverged") or r["point"] not in by_name:
                    continue
                summary = grid.state(by_name[r["point"]]).summary or {}
                curve = (summary.get("curves") or {}).get(metric)
                if curve:
                    curves.append(curve)
            pts = mean_curve(curves)
            color = f"C{i % 10}"
            if pts:
                steps, mean, low, high = zip(*pts)
                ax.plot(steps, mean, color=color, marker=".", label=f"{scheme} (n={len(curves)})")
                if len(curves) > 1:
                    ax.fill_between(steps, low, high, color=color, alpha=0.2)
            elif mine:
                ax.plot([], [], color=color, label=f"{scheme} (diverged)")
        ax.set(xlabel="step", ylabel=metric, title=f"{panel_label or panel_key} {panel}")
    outputs.figure(name, fig)


def depth_plot(outputs: StudyOutputs, rows: list[dict], metric: str, axis: str = "depth") -> None:
    """The final metric against depth (or what ``axis`` names: ``tables.depth_axis``) per scheme."""
    fig, (ax,) = new_figure(1, width=6.0, height=4.0)
    higher = higher_is_better(metric)
    key = f"final {metric}"
    values = [r[key] for r in rows if r[key] is not None and math.isfinite(r[key])]
    bottom = 0.0 if higher else (max(values) * 1.1 if values else 1.0)
    labelled = False
    for i, scheme in enumerate(dict.fromkeys(r["scheme"] for r in rows)):
        mine = sorted((r for r in rows if r["scheme"] == scheme), key=lambda r: r["depth"])
        color = f"C{i % 10}"
        ok = [(r["depth"], r[key]) for r in mine
              if r["status"] in ("trained", "failed to learn") and r[key] is not None]
        if ok:
            ax.plot(*zip(*ok), marker="o", color=color, label=scheme)
        else:
            ax.plot([], [], marker="o", color=color, label=scheme)
        failed = [(r["depth"], r[key]) for r in mine if r["status"] == "failed to learn" and r[key] is not None]
        if failed:
            ax.scatter(*zip(*failed), s=90, facecolors="none", edgecolors=color)
        diverged = [r["depth"] for r in mine if r["status"].startswith("diverged")]
        if diverged:
            ax.scatter(diverged, [bottom] * len(diverged), marker="x", s=70, color=color, clip_on=False)
            labelled = True
    if labelled:
        ax.scatter([], [], marker="x", color="0.3", label="diverged")
    depths = sorted({r["depth"] for r in rows})
    if depths and depths[-1] / max(depths[0], 1) >= 10:
        ax.set_xscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set(xlabel=axis, ylabel=f"final {metric}",
           title=f"Depth study: final {metric} (x: diverged, hollow: failed to learn)")
    outputs.figure("depth", fig)


def batch_lr_plots(outputs: StudyOutputs, rows: list[dict], summary: list[dict], metric: str) -> None:
    fig, (ax_opt, ax_stable) = new_figure(2)
    schemes = list(dict.fromkeys(r["scheme"] for r in summary))
    for i, scheme in enumerate(schemes):
        mine = [r for r in summary if r["scheme"] == scheme]
        for ax, key in ((ax_opt, "optimal_lr"), (ax_stable, "largest_stable_lr")):
            pts = [(r["batch_size"], r[key]) for r in mine if r[key] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{i % 10}", label=scheme)
    for ax, what in ((ax_opt, "optimal"), (ax_stable, "largest stable")):
        ref = [(r["batch_size"], r["optimal_lr" if what == "optimal" else "largest_stable_lr"]) for r in summary]
        ref = [p for p in ref if p[1] is not None]
        if ref:  # linear scaling through the smallest batch's value, for reference
            b0, lr0 = min(ref)
            bs = sorted({b for b, _ in ref})
            ax.plot(bs, [lr0 * b / b0 for b in bs], ls="--", color="0.6", label="lr ∝ batch")
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="learning rate",
               title=f"{what} learning rate ({metric})")
        batches = sorted({r["batch_size"] for r in summary})
        if batches:
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_formatter(NullFormatter())
    outputs.figure("batch_lr", fig)

    fig, axes = new_figure(max(len(schemes), 1))
    key = f"final {metric}"
    for ax, scheme in zip(axes, schemes):
        mine = [r for r in rows if r["scheme"] == scheme]
        for j, batch in enumerate(sorted({r["batch_size"] for r in mine})):
            # a learning rate at which a seed diverged is marked diverged, not by the others' mean
            pts = sorted((r["lr"], r[key]) for r in mine
                         if r["batch_size"] == batch and r[key] is not None and not unstable(r))
            color = f"C{j % 10}"
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color, label=f"batch {batch}")
            bad = [r["lr"] for r in mine if r["batch_size"] == batch and unstable(r)]
            if bad:
                ax.scatter(bad, [0.0 if higher_is_better(metric) else ax.get_ylim()[1]] * len(bad),
                           marker="x", color=color, clip_on=False)
        ax.set(xscale="log", xlabel="learning rate", ylabel=f"final {metric}", title=f"{scheme} (x: diverged)")
    outputs.figure("batch_lr_metric", fig)


def seed_plot(outputs: StudyOutputs, summaries: list[tuple[str, dict]], metric: str) -> None:
    fig, (ax_loss, ax_metric) = new_figure(2)
    for i, (name, s) in enumerate(summaries):
        curves = s.get("curves") or {}
        loss = [(st, v) for st, v in curves.get("train/loss", []) if v is not None and math.isfinite(v)]
        if loss:
            ax_loss.plot(*zip(*loss), color=f"C{i % 10}", alpha=0.8, label=name)
        pts = curves.get(metric, [])
        if pts:
            ax_metric.plot(*zip(*pts), color=f"C{i % 10}", marker="o", alpha=0.8, label=name)
    ax_loss.set(xlabel="step", ylabel="train loss", yscale="log", title="training loss per seed")
    ax_metric.set(xlabel="step", ylabel=metric, title=f"{metric} per seed")
    outputs.figure("seeds", fig)
