"""``rescale study``: the papers' studies as grids of ordinary ``rescale fit`` runs.

    rescale study depth    [--config C] [--depths 16 100 1000] [--schemes bn none ...] [--budget_epochs E]
    rescale study batch-lr [--config C] [--batch_sizes 64 256 ...] [--lrs ... | --lr_grid 0.025:3.2:2]
    rescale study seeds    --config C [--seeds N | --seed_list 0 1 2]
    rescale study aggregate STUDY_DIR        (the tables and plots again, e.g. after a cluster ran it)

Common: ``--out STUDY_DIR`` (default ``studies/<kind>``), ``--engine local|slurm|wandb``,
``--dry-run``, ``--wandb_run RUN`` (log the tables and plots), and ``rescale fit`` overrides after
``--``, applied to every point (``-- --trainer.max_epochs 2 --data.root /data/cifar10``).

- ``depth``: SkipInit's depth study: a network of several depths under ``bn``, the counter-examples
  (``bn_scaled``, ``bn_head``, ``bn_merge``), ``skipinit``, ``rescale``, ``fixup`` and ``none``,
  each with the same budget. Table: trained / diverged at step s / failed to learn / failed, final
  train loss, final validation loss and metric, best metric; plot: metric against depth.
- ``batch-lr``: for every batch size a grid of learning rates per scheme; the optimal and the
  largest stable learning rate per batch size (table), plotted against the batch size (log-log).
- ``seeds``: any config over N seeds; every final and best metric as mean, sample std (n-1), n,
  min and max, and the diverged runs.

The engines: ``local`` runs the points one after another here (each a ``rescale fit``
subprocess; running the command again skips finished points and resumes interrupted ones from
their ``last.ckpt``), then writes the tables; ``slurm`` writes ``STUDY_DIR/slurm.sbatch`` (a job
array, one task per point) and ``wandb`` writes ``STUDY_DIR/sweep.yaml`` (for ``wandb agent``),
and print how to submit them; ``rescale study aggregate STUDY_DIR`` then reads the results.
One study command at a time works in a folder (a second is refused in one line naming the first,
:mod:`..common.lock`); the points of a SLURM array share it, each point locking its own folder.
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
from collections import defaultdict
from typing import Any, Optional

from ..common.checkpointing import CheckpointError, peek_checkpoint
from ..common.errors import UserArgumentParser as _Parser, UserError
from .compare import METRICS, higher_is_better, mean_std, pick_metric
from .grid import (LOG_FILE, Grid, GridPoint, StudyInterrupted, rescale_command, run_grid, run_one, wandb_project,
                   write_slurm, write_sweep)
from ..common.lock import folder_lock
from .outputs import StudyOutputs, new_figure
from .seeded import collapse_seeds, format_mean_std, mean_curve, seed_suffix, steps_to_fraction

__all__ = ["main", "depth_points", "batch_lr_points", "seed_points", "point_rows", "depth_tables",
           "batch_lr_tables", "seed_table", "parse_lr_grid", "aggregate"]

DEPTH_SCHEMES = ("bn", "bn_scaled", "bn_head", "bn_merge", "skipinit", "rescale", "fixup", "none")
DEPTH_CONFIG = "experiments/cifar/wrn100-2_bn.yaml"      # Wide-ResNet n-2, SkipInit's depth study
DEPTH_DEPTHS = (16, 40, 100, 1000)
BATCH_LR_CONFIG = "experiments/cifar/wrn16-4_bn.yaml"    # SkipInit's batch-size study: WRN 16-4
BATCH_LR_SCHEMES = ("bn", "skipinit", "rescale")
BATCH_SIZES = (64, 256, 1024, 4096)
LR_GRID = "0.0125:6.4:2"
DEFAULT_SEEDS = 6                                          # the rebuttal's 6 runs
KEYS = {"depth": "model.init_args.network_options.depth", "scheme": "model.init_args.scheme",
        "batch": "data.init_args.batch_size", "lr": "model.init_args.optimizer.init_args.lr"}
AGGREGATE_PREFIXES = ("val/", "train/", "test/")


# --- grids ------------------------------------------------------------------------------------------
def _fmt(value: float) -> str:
    return f"{value:g}"


def _seeded(seeds: Optional[list[int]]) -> list[Optional[int]]:
    return list(seeds) if seeds else [None]


def _seed_args(seed: Optional[int]) -> list[str]:
    return [] if seed is None else ["--seed_everything", str(seed)]


def _params(coordinates: dict, recipe_name: Optional[str], seed: Optional[int]) -> dict:
    """A point's coordinates in the tables, with its recipe (when the study has ``--recipe``) and
    its seed (when it runs over seeds)."""
    return {**coordinates, **({"recipe": recipe_name} if recipe_name else {}),
            **({"seed": seed} if seed is not None else {})}


def _recipe(configs: list[str], template: Optional[str], scheme: str) -> tuple[list[str], str]:
    """The point's configs: the base ones, then the scheme's recipe (``template`` with ``{scheme}``
    filled in) where that file exists; and the recipe's name for the tables (``base`` otherwise)."""
    if not template:
        return configs, "base"
    path = template.format(scheme=scheme)
    if not os.path.isfile(path):
        return configs, "base"
    return [*configs, os.path.abspath(path)], os.path.splitext(os.path.basename(path))[0]


def depth_points(configs: list[str], depths: list[int], schemes: list[str], study: str,
                 depth_key: str = KEYS["depth"], scheme_key: str = KEYS["scheme"],
                 seeds: Optional[list[int]] = None, recipe: Optional[str] = None) -> list[GridPoint]:
    """One point per (scheme, depth[, seed]); W&B group ``<study>-d<depth>`` (the schemes of one
    depth). ``recipe``: a per-scheme config template (``experiments/cifar/recipes/{scheme}.yaml``)
    applied after the base configs where it exists."""
    points = []
    for scheme in schemes:
        mine, recipe_name = _recipe(configs, recipe, scheme)
        for depth in depths:
            for seed in _seeded(seeds):
                params = _params({"depth": depth, "scheme": scheme}, recipe and recipe_name, seed)
                points.append(GridPoint(f"d{depth}-{scheme}{seed_suffix(seed)}", mine,
                                        [f"--{scheme_key}", scheme, f"--{depth_key}", str(depth), *_seed_args(seed)],
                                        params, group=f"{study}-d{depth}"))
    return points


def batch_lr_points(configs: list[str], batch_sizes: list[int], lrs: list[float], schemes: list[str],
                    study: str, batch_key: str = KEYS["batch"], lr_key: str = KEYS["lr"],
                    scheme_key: str = KEYS["scheme"], seeds: Optional[list[int]] = None,
                    recipe: Optional[str] = None) -> list[GridPoint]:
    """One point per (scheme, batch size, learning rate[, seed]); W&B group ``<study>-b<batch>-lr<lr>``."""
    points = []
    for scheme in schemes:
        mine, recipe_name = _recipe(configs, recipe, scheme)
        for batch in batch_sizes:
            for lr in lrs:
                for seed in _seeded(seeds):
                    params = _params({"scheme": scheme, "batch_size": batch, "lr": float(lr)},
                                     recipe and recipe_name, seed)
                    points.append(GridPoint(
                        f"{scheme}-b{batch}-lr{_fmt(lr)}{seed_suffix(seed)}", mine,
                        [f"--{scheme_key}", scheme, f"--{batch_key}", str(batch), f"--{lr_key}", repr(float(lr)),
                         *_seed_args(seed)],
                        params, group=f"{study}-b{batch}-lr{_fmt(lr)}"))
    return points


def seed_points(configs: list[str], seeds: list[int], study: str) -> list[GridPoint]:
    """One point per seed (``--seed_everything``), all in W&B group ``<study>``."""
    return [GridPoint(f"seed{seed}", configs, ["--seed_everything", str(seed)], {"seed": seed}, group=study)
            for seed in seeds]


def parse_lr_grid(text: str) -> list[float]:
    """``start:stop:factor`` -> start, start*factor, ... up to stop (inclusive), 6 significant digits."""
    try:
        start, stop, factor = (float(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--lr_grid {text}: expected start:stop:factor, e.g. 0.0125:6.4:2") from None
    if start <= 0 or stop < start or factor <= 1:
        raise UserError(f"--lr_grid {text}: needs 0 < start <= stop and factor > 1")
    out, lr = [], start
    while lr <= stop * (1 + 1e-9):
        out.append(float(f"{lr:.6g}"))
        lr *= factor
    return out


# --- reading the results --------------------------------------------------------------------------
def _float(value: Any) -> Optional[float]:
    """A logged value as a float (inf and nan kept: the callers tell them apart), else None."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value


def _train_loss(summary: dict) -> Optional[float]:
    final = summary.get("final") or {}
    for key in ("train/loss_epoch", "train/loss", "train/loss_step"):
        if key in final:
            return _float(final[key])
    curve = (summary.get("curves") or {}).get("train/loss") or []
    return _float(curve[-1][1]) if curve else None


def _num_classes(grid: Grid, point: GridPoint, summary: dict) -> Optional[int]:
    """The run's class count: from its summary if recorded there, else its checkpoint's
    hyper-parameters (metadata only; the tensors are memory-mapped, not read)."""
    if summary.get("num_classes"):
        return int(summary["num_classes"])
    checkpoint = grid.last_checkpoint(point) or summary.get("checkpoint")
    if not checkpoint or not os.path.isfile(checkpoint):
        return None
    try:
        value = peek_checkpoint(checkpoint).hyper_parameters.get("num_classes")
    except (CheckpointError, OSError, ValueError):
        return None
    return int(value) if value else None


def point_rows(grid: Grid, metric: Optional[str] = None, margin: float = 0.05) -> tuple[list[dict], str]:
    """One row per grid point: its params, status and final/best values; and the metric used.

    status: ``trained``; ``diverged at step s``; ``failed to learn`` (finished, but an accuracy
    metric not above chance (1/classes) + ``margin``, or, where the chance level is unknown, a final
    training loss not below the first logged one); ``failed`` (the run stopped with an error,
    ``error`` says which); ``interrupted`` (a ``last.ckpt`` to resume from); ``not run``.
    Validation values of a diverged run are left empty (a non-finite model was validated).
    """
    states = [(point, grid.state(point)) for point in grid.points]
    metric = pick_metric([s.summary for _, s in states if s.summary], metric, default="val/loss")
    higher = higher_is_better(metric)
    rows = []
    for point, state in states:
        s = state.summary or {}
        final, best = s.get("final") or {}, s.get("best") or {}
        row: dict[str, Any] = dict(point.params)
        row.update({"status": None, "diverged_step": None, "steps": s.get("steps"), "train_loss": None,
                    "val_loss": None, f"final {metric}": None, f"best {metric}": None, "steps_to_90": None,
                    "train_seconds": s.get("train_seconds"), "error": None, "point": point.name})
        if state.state == "done":
            diverged = s.get("status") == "diverged"
            row["train_loss"] = _train_loss(s)
            if diverged:
                row["status"] = f"diverged at step {s.get('diverged_step')}"
                row["diverged_step"] = s.get("diverged_step")
            else:
                row["val_loss"] = _float(final.get("val/loss"))
                row[f"final {metric}"] = _float(final.get(metric))
                row[f"best {metric}"] = _float(best.get(metric))
                row["steps_to_90"] = steps_to_fraction((s.get("curves") or {}).get(metric) or [],
                                                       row[f"final {metric}"], 0.9, higher)
                row["status"] = "trained" if _learned(grid, point, s, metric, higher, margin) else "failed to learn"
        elif state.state == "partial":
            row["status"] = "interrupted"
            row["error"] = f"resumable from {state.checkpoint}"
        elif state.state == "failed":
            row["status"] = "failed"
            row["error"] = (state.outcome or {}).get("error") or s.get("error")
        else:
            row["status"] = "not run"
        rows.append(row)
    return rows, metric


def _learned(grid: Grid, point: GridPoint, summary: dict, metric: str, higher: bool, margin: float) -> bool:
    value = _float((summary.get("final") or {}).get(metric))
    if value is not None and not math.isfinite(value):
        return False
    last = metric.rsplit("/", 1)[-1]
    if higher and last.startswith("acc") and value is not None:
        classes = _num_classes(grid, point, summary)
        if classes:
            return value > 1.0 / classes + margin
    curve = [v for _, v in (summary.get("curves") or {}).get("train/loss", []) if v is not None]
    final = _train_loss(summary)
    if not curve or final is None:
        return value is not None
    return math.isfinite(final) and final < curve[0]


def _status_cell(row: dict, metric: str) -> str:
    status = row["status"]
    if status == "trained":
        return f"{row[f'final {metric}']:.4g}" if row[f"final {metric}"] is not None else "trained"
    if status.startswith("diverged"):
        return f"diverged@{row['diverged_step']}"
    if status == "failed to learn":
        value = row[f"final {metric}"]
        return "failed to learn" + (f" ({value:.3g})" if value is not None else "")
    return status


# --- depth ------------------------------------------------------------------------------------------
def depth_tables(rows: list[dict], metric: str) -> tuple[list[dict], list[dict]]:
    """The per-point table (scheme order of the grid, then depth) and the wide table: one row per
    scheme, one column per depth (the final metric, ``diverged@s``, ``failed to learn`` ...)."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    depths = sorted({r["depth"] for r in rows})
    ordered = sorted(rows, key=lambda r: (schemes.index(r["scheme"]), r["depth"], r.get("seed") or 0))
    wide = []
    for scheme in schemes:
        cells = {r["depth"]: _status_cell(r, metric) for r in rows if r["scheme"] == scheme}
        wide.append({"scheme": scheme, **{f"depth {d}": cells.get(d, "") for d in depths}})
    return ordered, wide


def _seeded_cell(row: dict, metric: str) -> str:
    """A (scheme, depth) cell over seeds: mean ± std of the final metric over the runs that did not
    diverge, how many diverged (and where), the mean steps to 90% of the final metric."""
    key = f"final {metric}"
    n, runs = row[f"{key} n"], row["seeds"]
    if row["status"] == "not run":
        return "not run"
    if row["status"] == "diverged":
        return f"diverged {row['diverged']}/{runs} (@{row['diverged_steps'].replace(' ', ',')})"
    cell = format_mean_std(row[key], row[f"{key} std"])
    notes = []
    if row["diverged"]:
        notes.append(f"{row['diverged']}/{runs} diverged")
    if row["failed_to_learn"]:
        notes.append(f"{row['failed_to_learn']}/{runs} failed to learn")
    if n < runs and not row["diverged"] and not row["failed_to_learn"]:
        notes.append(f"n={n}")
    if row["steps_to_90"] is not None:
        notes.append(f"90% at {row['steps_to_90']:.0f}")
    return cell + (f" ({'; '.join(notes)})" if notes else "")


def depth_seed_tables(rows: list[dict], metric: str) -> tuple[list[dict], list[dict]]:
    """With seeds: one row per (scheme, depth) (mean, std, n, diverged, steps to 90% ...) and the wide
    table of ``_seeded_cell`` s, one row per scheme."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    depths = sorted({r["depth"] for r in rows})
    keys = ["scheme", "depth"] + (["recipe"] if any("recipe" in r for r in rows) else [])
    collapsed = sorted(collapse_seeds(rows, keys, metric), key=lambda r: (schemes.index(r["scheme"]), r["depth"]))
    wide = []
    for scheme in schemes:
        cells = {r["depth"]: _seeded_cell(r, metric) for r in collapsed if r["scheme"] == scheme}
        recipe = next((r["recipe"] for r in collapsed if r["scheme"] == scheme and "recipe" in r), None)
        wide.append({"scheme": scheme, **({"recipe": recipe} if recipe else {}),
                     **{f"depth {d}": cells.get(d, "") for d in depths}})
    return collapsed, wide


def _curves_plot(outputs: StudyOutputs, grid: Grid, rows: list[dict], metric: str, panel_key: str,
                 name: str) -> None:
    """Learning curves: one panel per ``panel_key`` value (a depth), per scheme the mean over seeds
    of ``metric`` against the step (band: min to max), diverged runs left out."""
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
        ax.set(xlabel="step", ylabel=metric, title=f"{panel_key} {panel}")
    outputs.figure(name, fig)


def _depth_plot(outputs: StudyOutputs, rows: list[dict], metric: str) -> None:
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
    ax.set(xlabel="depth", ylabel=f"final {metric}",
           title=f"Depth study: final {metric} (x: diverged, hollow: failed to learn)")
    outputs.figure("depth", fig)


# --- batch size x learning rate ------------------------------------------------------------------------
def batch_lr_tables(rows: list[dict], metric: str) -> list[dict]:
    """Per (scheme, batch size): the optimal learning rate (best final metric among the finished,
    learning runs) and the largest stable one (the largest that did not diverge)."""
    higher = higher_is_better(metric)
    key = f"final {metric}"
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["scheme"], r["batch_size"])].append(r)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    out = []
    for (scheme, batch) in sorted(groups, key=lambda k: (schemes.index(k[0]), k[1])):
        group = sorted(groups[(scheme, batch)], key=lambda r: r["lr"])
        finished = [r for r in group if r["status"] in ("trained", "failed to learn")
                    and r[key] is not None and math.isfinite(r[key])]
        best = (max if higher else min)(finished, key=lambda r: r[key]) if finished else None
        ran = [r for r in group if r["status"] in ("trained", "failed to learn") or r["status"].startswith("diverged")]
        stable = [r for r in ran if not r["status"].startswith("diverged")]
        largest = max(stable, key=lambda r: r["lr"]) if stable else None
        # a run that stayed finite but collapsed to chance did not diverge, yet did not train either
        learned = [r for r in stable if r["status"] == "trained"]
        out.append({
            "scheme": scheme, "batch_size": batch,
            "optimal_lr": best["lr"] if best else None, f"optimal {metric}": best[key] if best else None,
            "largest_stable_lr": largest["lr"] if largest else None,
            "stable_at_grid_max": (largest["lr"] == max(r["lr"] for r in group)) if largest else None,
            "largest_learning_lr": max(r["lr"] for r in learned) if learned else None,
            "lrs": len(group), "diverged": sum(r["status"].startswith("diverged") for r in group),
            "not_done": sum(r["status"] in ("failed", "interrupted", "not run") for r in group),
        })
    return out


def _batch_lr_plots(outputs: StudyOutputs, rows: list[dict], summary: list[dict], metric: str) -> None:
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
            from matplotlib.ticker import NullFormatter

            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_formatter(NullFormatter())
    outputs.figure("batch_lr", fig)

    fig, axes = new_figure(max(len(schemes), 1))
    key = f"final {metric}"
    for ax, scheme in zip(axes, schemes):
        mine = [r for r in rows if r["scheme"] == scheme]
        for j, batch in enumerate(sorted({r["batch_size"] for r in mine})):
            pts = sorted((r["lr"], r[key]) for r in mine if r["batch_size"] == batch and r[key] is not None)
            color = f"C{j % 10}"
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color, label=f"batch {batch}")
            bad = [r["lr"] for r in mine if r["batch_size"] == batch and r["status"].startswith("diverged")]
            if bad:
                ax.scatter(bad, [0.0 if higher_is_better(metric) else ax.get_ylim()[1]] * len(bad),
                           marker="x", color=color, clip_on=False)
        ax.set(xscale="log", xlabel="learning rate", ylabel=f"final {metric}", title=f"{scheme} (x: diverged)")
    outputs.figure("batch_lr_metric", fig)


# --- seeds ------------------------------------------------------------------------------------------
def seed_table(summaries: list[dict]) -> list[dict]:
    """Every final and best metric (``val/``, ``train/``, ``test/``) over the runs: n (finite values),
    mean, sample std (n-1; empty for one value), min, max; runs and diverged runs. Diverged runs'
    values are left out of the statistics (they are counted in ``diverged``)."""
    runs = len(summaries)
    diverged = sum(s.get("status") == "diverged" for s in summaries)
    keys: dict[tuple[str, str], None] = {}
    kept = [s for s in summaries if s.get("status") != "diverged"] or summaries
    for use in ("final", "best"):
        for s in kept:
            for k in (s.get(use) or {}):
                if k.startswith(AGGREGATE_PREFIXES):
                    keys[(use, k)] = None
    rows = []
    for use, k in sorted(keys, key=lambda x: (x[1], x[0] != "final")):
        values = [_float((s.get(use) or {}).get(k)) for s in summaries if s.get("status") != "diverged"]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        mean, std, n = mean_std(finite)
        rows.append({"metric": k, "use": use, "n": n, "mean": mean, "std": std,
                     "min": min(finite) if finite else None, "max": max(finite) if finite else None,
                     "runs": runs, "diverged": diverged})
    return rows


def _seed_plot(outputs: StudyOutputs, summaries: list[tuple[str, dict]], metric: str) -> None:
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


# --- aggregation ------------------------------------------------------------------------------------
def aggregate(grid: Grid, out: Optional[str] = None, metric: Optional[str] = None,
              wandb_run: Optional[str] = None, wandb_project_name: Optional[str] = None) -> StudyOutputs:
    """Read every point's results and write the study's tables and plots into ``out`` (default:
    the study folder); log them to ``wandb_run`` when given."""
    settings = grid.settings
    metric = metric or settings.get("metric")
    margin = float(settings.get("learn_margin", 0.05))
    outputs = StudyOutputs(out or grid.study_dir)
    rows, metric = point_rows(grid, metric, margin)
    not_done = [r for r in rows if r["status"] in ("not run", "interrupted", "failed")]
    note = f"; {len(not_done)} of {len(rows)} points not done" if not_done else ""
    seeded = any("seed" in r for r in rows)
    if grid.kind == "depth" and seeded:
        collapsed, wide = depth_seed_tables(rows, metric)
        outputs.table("depth_runs", depth_tables(rows, metric)[0],
                      title=f"Depth study: one row per run (final values; steps_to_90: first step at 90% of "
                      f"the run's final {metric}){note}")
        outputs.table("depth", collapsed, title=f"Depth study over seeds: mean, std (n-1) and n of the runs that "
                      f"did not diverge, per scheme and depth{note}")
        outputs.table("depth_grid", wide, title=f"Depth study: final {metric}, mean ± std over seeds (diverged "
                      f"runs counted apart; 90% at s: mean first step at 90% of the final {metric}){note}")
        # the plot's marks: a mean where some seed trained (some others may have diverged), hollow
        # where none learned, a cross where every seed diverged
        _depth_plot(outputs, [{**r, "diverged_step": None,
                               "status": "trained" if r["status"] == "partly diverged" else r["status"]}
                              for r in collapsed], metric)
        _curves_plot(outputs, grid, rows, metric, "depth", "depth_curves")
        echo = ["depth_grid"]
    elif grid.kind == "depth":
        ordered, wide = depth_tables(rows, metric)
        outputs.table("depth", ordered, title=f"Depth study: one row per run (final values; failed to learn: "
                      f"final {metric} not above chance + {margin:g}){note}")
        outputs.table("depth_grid", wide, title=f"Depth study: final {metric} per scheme and depth "
                      f"(diverged@s: diverged at step s){note}")
        _depth_plot(outputs, ordered, metric)
        echo = ["depth_grid"]
    elif grid.kind == "batch-lr":
        if seeded:  # a setting is stable when none of its seeds diverged; optimal: the best mean
            outputs.table("batch_lr_runs", sorted(rows, key=lambda r: (r["scheme"], r["batch_size"], r["lr"],
                                                                       r["seed"])),
                          title=f"Batch size x learning rate: one row per run{note}")
            rows = [{**r, "status": "diverged" if r["diverged"] else r["status"], "diverged_step": None}
                    for r in collapse_seeds(rows, ["scheme", "batch_size", "lr"], metric)]
        summary = batch_lr_tables(rows, metric)
        outputs.table("batch_lr", summary, title=f"Optimal (best final {metric}), largest stable (did not "
                      f"diverge) and largest learning (trained, not collapsed to chance) learning rate per scheme "
                      f"and batch size{note}")
        outputs.table("batch_lr_points", sorted(rows, key=lambda r: (r["scheme"], r["batch_size"], r["lr"])),
                      title=f"Batch size x learning rate: one row per run{note}")
        _batch_lr_plots(outputs, rows, summary, metric)
        echo = ["batch_lr"]
    elif grid.kind == "seeds":
        done = [(p.name, s.summary) for p in grid.points if (s := grid.state(p)).state == "done"]
        table = seed_table([s for _, s in done])
        outputs.table("seeds", table, title=f"Over {len(done)} seeds: mean, std = sample standard deviation "
                      f"(ddof=1, n-1), n = finite values (diverged runs left out){note}")
        outputs.table("seeds_points", rows, title=f"One row per seed{note}")
        _seed_plot(outputs, done, metric)
        echo = ["seeds"]
    else:
        outputs.table("points", rows, title=f"{grid.kind}: one row per run{note}")
        echo = ["points"]
    outputs.finish(wandb_run, wandb_project_name, echo=echo)
    return outputs


# --- the command --------------------------------------------------------------------------------------
def _add_common(p: argparse.ArgumentParser, kind: str) -> None:
    g = p.add_argument_group("study")
    g.add_argument("--config", action="append", metavar="YAML",
                   help="run config (several: applied in order, e.g. a cluster overlay last)")
    g.add_argument("--out", default=os.path.join("studies", kind), help="study folder (default: %(default)s)")
    g.add_argument("--engine", choices=("local", "slurm", "wandb"), default="local",
                   help="local: run the points here, one after another (then the tables); slurm: write "
                        "slurm.sbatch (a job array); wandb: write sweep.yaml (for wandb agent)")
    g.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print each point's state and rescale fit command; run and write nothing")
    g.add_argument("--in_process", action="store_true",
                   help="local engine: run the points in this process instead of one subprocess each "
                        "(saves the start-up per point; tests and notebooks)")
    g.add_argument("--echo", action="store_true", help="local engine: show the runs' output (always in their log.txt)")
    g.add_argument("--seed", type=int, default=0, help="--seed_everything of every point (default: %(default)s)")
    g.add_argument("--budget_epochs", type=int, help="training budget of every point: --trainer.max_epochs")
    g.add_argument("--budget_steps", type=int,
                   help="training budget of every point: --trainer.max_steps (validation only runs at epoch "
                        "ends, and epoch-based schedules are sized by max_epochs: prefer --budget_epochs)")
    g.add_argument("--metric", help=f"the metric of the tables (default: the first logged of {', '.join(METRICS)})")
    g.add_argument("--learn_margin", type=float, default=0.05,
                   help="a finished run whose final accuracy is not above chance + this 'failed to learn' "
                        "(default: %(default)s)")
    g.add_argument("--wandb_run", help="log the tables and plots to this W&B run (folder or id)")
    g.add_argument("--wandb_project", help="the W&B project of --wandb_run given as an id")
    s = p.add_argument_group("slurm engine")
    s.add_argument("--partition", help="#SBATCH --partition (default: the cluster's)")
    s.add_argument("--gres", default="gpu:1", help="#SBATCH --gres per point (default: %(default)s; '' for none)")
    s.add_argument("--time", default="24:00:00", help="#SBATCH --time per point (default: %(default)s)")
    s.add_argument("--cpus_per_task", type=int, default=8, help="#SBATCH --cpus-per-task (default: %(default)s)")
    s.add_argument("--max_parallel", type=int, help="at most this many points at once (--array=0-N%%M)")
    s.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="another #SBATCH line, e.g. --sbatch=--account=abc (repeatable)")


def _budget(args) -> list[str]:
    out = []
    if args.budget_epochs is not None:
        out += ["--trainer.max_epochs", str(args.budget_epochs)]
    if args.budget_steps is not None:
        out += ["--trainer.max_steps", str(args.budget_steps)]
    return out


def _configs(args, default: Optional[str]) -> list[str]:
    """The run configs as absolute paths (every engine may start elsewhere); the default config
    is looked up in the repository of this installation when the current folder has none."""
    if args.config:
        configs = args.config
    elif default:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # <repo>/tasks/studies
        configs = [default if os.path.isfile(default) else os.path.join(repo, default)]
    else:
        raise UserError(f"rescale study {args.command}: give a run config with --config")
    missing = [c for c in configs if not os.path.isfile(c)]
    if missing:
        raise UserError(f"config file not found: {missing[0]} (--config)")
    return [os.path.abspath(c) for c in configs]


def _run_study(args, grid: Grid) -> int:
    if args.dry_run:
        print(f"study {grid.study_dir}: {len(grid.points)} points (dry run: nothing run or written)")
        run_grid(grid, dry_run=True)
        return 0
    with folder_lock(grid.study_dir):  # one study process per folder (common.lock)
        return _run_locked(args, grid)


def _run_locked(args, grid: Grid) -> int:
    grid.save()
    n = len(grid.points)
    if args.engine == "slurm":
        path = write_slurm(grid, args.partition, args.gres or None, args.time, args.cpus_per_task,
                           args.max_parallel, tuple(args.sbatch))
        print(f"wrote {grid.path} ({n} points) and {path}\nsubmit: sbatch {shlex.quote(path)}\n"
              f"results: rescale study aggregate {shlex.quote(grid.study_dir)}")
        return 0
    if args.engine == "wandb":
        logger = grid.logger_class(grid.points[0])
        if not logger or "wandb" not in logger.lower():
            print(f"warning: the points log with {logger or 'no logger'}, not W&B: the sweep's runs will "
                  f"report nothing to it (the results are still in {grid.study_dir})")
        project = wandb_project(grid)
        path = write_sweep(grid, project)
        print(f"wrote {grid.path} ({n} points) and {path}\n"
              f"submit: wandb sweep --project {shlex.quote(project)} {shlex.quote(path)}   (prints the sweep id)\n"
              f"then, on each machine: wandb agent <entity>/{project}/<sweep id>\n"
              f"results: rescale study aggregate {shlex.quote(grid.study_dir)}")
        return 0
    print(f"study {grid.study_dir}: {n} points, one after another "
          f"({'in this process' if args.in_process else 'each a rescale fit subprocess'})", flush=True)
    try:
        counts = run_grid(grid, in_process=args.in_process, echo=args.echo,
                          say=lambda line: print(line, flush=True))
    except StudyInterrupted as stop:
        print(f"error: study interrupted while running {stop.point} (its last.ckpt is kept); run the same "
              f"command again to resume it")
        return stop.returncode or 128 + signal.SIGTERM
    busy = f", {counts['busy']} running elsewhere" if counts["busy"] else ""
    print(f"points: {counts['ran']} run, {counts['resumed']} resumed, {counts['skipped']} already done, "
          f"{counts['failed']} failed{busy}", flush=True)
    aggregate(grid, metric=args.metric, wandb_run=args.wandb_run, wandb_project_name=args.wandb_project)
    if counts["failed"]:
        print(f"error: {counts['failed']} of {n} points failed (the table says which and why; their "
              f"{LOG_FILE} has the output); run the same command again to retry them")
        return 1
    return 0


def _study(args, points: list[GridPoint], settings: dict, overrides: list[str]) -> int:
    """The grid of ``args.command`` (the budget and fit overrides for every point) run by the engine."""
    settings = {**settings, "metric": args.metric, "learn_margin": args.learn_margin}
    grid = Grid(args.out, points, args.command, settings, [*_budget(args), *overrides], args.seed)
    return _run_study(args, grid)


def _name(args) -> str:
    """The study's name (the W&B groups of its points): its folder's."""
    return os.path.basename(os.path.abspath(args.out))


def _repeats(args) -> Optional[list[int]]:
    """The seeds of a depth or batch-lr study run over several (None: one run per point, --seed)."""
    if args.seed_list:
        return list(dict.fromkeys(args.seed_list))
    if args.seeds:
        if args.seeds < 1:
            raise UserError(f"--seeds {args.seeds}: give at least 1")
        return list(range(args.seed, args.seed + args.seeds))
    return None


def _recipe_template(args) -> Optional[str]:
    if not args.recipe:
        return None
    if "{scheme}" not in args.recipe:
        raise UserError(f"--recipe {args.recipe}: expected a path with {{scheme}} in it, "
                        "e.g. experiments/cifar/recipes/{scheme}.yaml")
    if not any(os.path.isfile(args.recipe.format(scheme=scheme)) for scheme in args.schemes):
        raise UserError(f"--recipe {args.recipe}: no recipe file for any of the schemes "
                        f"{' '.join(args.schemes)} (a scheme without one trains on the base config)")
    return args.recipe


def _cmd_depth(args, overrides: list[str]) -> int:
    seeds, recipe = _repeats(args), _recipe_template(args)
    points = depth_points(_configs(args, DEPTH_CONFIG), args.depths, args.schemes, _name(args), args.depth_key,
                          args.scheme_key, seeds, recipe)
    return _study(args, points, {"depths": args.depths, "schemes": args.schemes, "seeds": seeds,
                                 "recipe": recipe}, overrides)


def _cmd_batch_lr(args, overrides: list[str]) -> int:
    configs = _configs(args, BATCH_LR_CONFIG)
    lrs = args.lrs or parse_lr_grid(args.lr_grid)
    seeds, recipe = _repeats(args), _recipe_template(args)
    points = batch_lr_points(configs, args.batch_sizes, lrs, args.schemes, _name(args), args.batch_key, args.lr_key,
                             args.scheme_key, seeds, recipe)
    return _study(args, points, {"batch_sizes": args.batch_sizes, "lrs": lrs, "schemes": args.schemes,
                                 "seeds": seeds, "recipe": recipe}, overrides)


def _cmd_seeds(args, overrides: list[str]) -> int:
    configs = _configs(args, None)
    seeds = args.seed_list if args.seed_list else list(range(args.seed, args.seed + args.seeds))
    return _study(args, seed_points(configs, seeds, _name(args)), {"seeds": seeds}, overrides)


def _cmd_aggregate(args, overrides: list[str]) -> int:
    if overrides:
        raise UserError("rescale study aggregate takes no fit overrides (after --)")
    grid = Grid.load(args.study_dir)
    with folder_lock(grid.study_dir):
        aggregate(grid, args.out, args.metric, args.wandb_run, args.wandb_project)
    return 0


def _cmd_tables(args, overrides: list[str]) -> int:
    from .readme_tables import update_document

    if overrides:
        raise UserError("rescale study tables takes no fit overrides (after --)")
    return update_document(args.document, args.check)


def _cmd_run_point(args, overrides: list[str]) -> int:
    """One point by index, resumed from its last.ckpt if it has one; a point already done exits 0
    at once (SLURM requeues and resubmissions, sweep agents). Exit status: the run's (143: stopped
    by SIGTERM with its last.ckpt saved)."""
    if overrides:
        raise UserError("rescale study run-point takes no fit overrides (they are in the grid)")
    key = args.point if args.point is not None else args.index
    if key is None:
        raise UserError("rescale study run-point: give the point's index (or --point=<index>)")
    grid = Grid.load(args.study_dir)
    point = grid.point(key)
    state = grid.state(point)
    if state.state == "done":
        print(f"{point.name}: done ({state.summary.get('status')}), nothing to run")
        return 0
    print(f"{point.name}: {'resuming from ' + str(state.checkpoint) if state.state == 'partial' else 'running'}\n"
          f"$ {shlex.join([*rescale_command(), *grid.point_argv(point)])}", flush=True)
    try:
        code = run_one(grid, point, in_process=args.in_process, echo=not args.in_process)
    except StudyInterrupted as stop:
        return stop.returncode or 128 + signal.SIGTERM
    if code:
        print(f"error: {point.name} failed (exit status {code}): see {os.path.join(grid.point_dir(point), LOG_FILE)}")
    return code


def _add_repeats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, help="run every point over N seeds (from --seed on): tables of "
                   "mean ± std, learning curves averaged (default: one run per point)")
    p.add_argument("--seed_list", type=int, nargs="+", help="these seeds instead")
    p.add_argument("--recipe", metavar="TEMPLATE",
                   help="per-scheme recipe config applied after --config where it exists, "
                   "e.g. experiments/cifar/recipes/{scheme}.yaml (each scheme trained as its paper trains it)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rescale study", description="The papers' studies as grids of ordinary rescale fit runs.",
                epilog="rescale fit overrides for every point go after --, e.g. -- --data.root /data/cifar10")
    sub = p.add_subparsers(dest="command", metavar="{depth,batch-lr,seeds,aggregate,tables}", parser_class=_Parser)

    d = sub.add_parser("depth", help="SkipInit's depth study: schemes x depths, same budget")
    d.add_argument("--depths", type=int, nargs="+", default=list(DEPTH_DEPTHS),
                   help="network depths (default: %(default)s; Wide-ResNet 6n+4, CIFAR ResNet 6n+2)")
    d.add_argument("--schemes", nargs="+", default=list(DEPTH_SCHEMES), help="default: %(default)s")
    d.add_argument("--depth_key", default=KEYS["depth"], help="config key of the depth (default: %(default)s)")
    d.add_argument("--scheme_key", default=KEYS["scheme"], help="config key of the scheme (default: %(default)s)")
    _add_repeats(d)
    _add_common(d, "depth")
    d.set_defaults(func=_cmd_depth)

    b = sub.add_parser("batch-lr", help="learning rate grid per batch size and scheme")
    b.add_argument("--batch_sizes", type=int, nargs="+", default=list(BATCH_SIZES), help="default: %(default)s")
    b.add_argument("--lrs", type=float, nargs="+", help="learning rates (or --lr_grid)")
    b.add_argument("--lr_grid", default=LR_GRID, help="start:stop:factor (default: %(default)s)")
    b.add_argument("--schemes", nargs="+", default=list(BATCH_LR_SCHEMES), help="default: %(default)s")
    b.add_argument("--batch_key", default=KEYS["batch"], help="config key of the batch size (default: %(default)s)")
    b.add_argument("--lr_key", default=KEYS["lr"], help="config key of the learning rate (default: %(default)s)")
    b.add_argument("--scheme_key", default=KEYS["scheme"], help="config key of the scheme (default: %(default)s)")
    _add_repeats(b)
    _add_common(b, "batch-lr")
    b.set_defaults(func=_cmd_batch_lr)

    s = sub.add_parser("seeds", help="one config over N seeds: mean +- std")
    s.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="number of seeds, from --seed on (default: %(default)s)")
    s.add_argument("--seed_list", type=int, nargs="+", help="these seeds instead")
    _add_common(s, "seeds")
    s.set_defaults(func=_cmd_seeds)

    a = sub.add_parser("aggregate", help="write a study's tables and plots from its points' results")
    a.add_argument("study_dir")
    a.add_argument("--out", help="output folder (default: the study folder)")
    a.add_argument("--metric", help="the metric of the tables (default: the study's)")
    a.add_argument("--wandb_run", help="log the tables and plots to this W&B run (folder or id)")
    a.add_argument("--wandb_project", help="the W&B project of --wandb_run given as an id")
    a.set_defaults(func=_cmd_aggregate)

    t = sub.add_parser("tables", help="copy the study tables a document names into it (README.md)")
    t.add_argument("document", nargs="?", default="README.md", help="default: %(default)s")
    t.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its file")
    t.set_defaults(func=_cmd_tables)

    r = sub.add_parser("run-point")  # internal: the SLURM array task and the sweep agent run this
    r.add_argument("study_dir")
    r.add_argument("index", nargs="?", help="the point's index in grid.json (or its name)")
    r.add_argument("--point", help="the same, as a W&B sweep passes it (--point=<index>)")
    r.add_argument("--in_process", action="store_true", help="run in this process (tests)")
    r.set_defaults(func=_cmd_run_point)
    return p


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """The study's own arguments and the ``rescale fit`` overrides after ``--``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: Optional[list[str]] = None) -> int:
    import sys

    own, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    if not own or own[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if own else 2
    args = parser.parse_args(own)
    return args.func(args, overrides)
