"""A study's tables and plots from its points' results (``rescale study aggregate``, and the local
engine when its points are done)."""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Optional

from ..common.system import CODE_KEY, describe_code
from .compare import check_last_k
from .grid import Grid
from .outputs import StudyOutputs
from .plots import batch_lr_plots, curves_plot, depth_plot, seed_plot
from .results import point_rows
from .seeded import collapse_seeds
from .tables import batch_lr_tables, depth_axis, depth_seed_tables, depth_tables, seed_table

__all__ = ["aggregate"]

log = logging.getLogger(__name__)


def aggregate(grid: Grid, out: Optional[str] = None, metric: Optional[str] = None,
              wandb_run: Optional[str] = None, wandb_project_name: Optional[str] = None,
              last_k: Optional[int] = None) -> StudyOutputs:
    """Read every point's results and write the study's tables and plots into ``out`` (default:
    the study folder); log them to ``wandb_run`` when given. ``last_k`` (default: the study's
    ``--last_k``): the tables also give each run's mean of its last ``last_k`` epoch-end validations
    (``last<k> <metric>``; over seeds, its mean, std and n)."""
    settings = grid.settings
    metric = metric or settings.get("metric")
    last_k = last_k or settings.get("last_k")  # the study's --last_k, unless given again
    check_last_k(last_k, metric)
    grid.check_one_definition()  # before anything is written
    margin = float(settings.get("learn_margin", 0.05))
    outputs = StudyOutputs(out or grid.study_dir)
    rows, metric = point_rows(grid, metric, margin, last_k)
    _warn_mixed_code(grid)
    unmeasured = [r["point"] for r in rows if r["status"] in ("trained", "failed to learn")
                  and r[f"final {metric}"] is None]
    if unmeasured:
        log.warning(f"warning: {len(unmeasured)} finished point(s) logged no {metric} ({', '.join(unmeasured[:3])}"
                    f"{', ...' if len(unmeasured) > 3 else ''}): their training ended before a validation; give "
                    f"them a budget past their first validation (trainer.val_check_interval), or another --metric")
    not_done = [r for r in rows if r["status"] in ("not run", "running", "interrupted", "failed")]
    note = f"; {len(not_done)} of {len(rows)} points not done" if not_done else ""
    seeded = any("seed" in r for r in rows)
    unit = next((r["throughput_unit"] for r in rows if r.get("throughput_unit")), "samples")
    speed = f"; throughput: training {unit} per second"
    axis = depth_axis(settings.get("depth_key"))
    if grid.kind == "depth" and seeded:
        collapsed, wide = depth_seed_tables(rows, metric, axis)
        outputs.table("depth_runs", depth_tables(rows, metric, axis)[0],
                      title=f"Depth study: one row per run (final values; steps_to_90: first step at 90% of "
                      f"the run's final {metric}{speed}){note}")
        outputs.table("depth", collapsed, title=f"Depth study over seeds: mean, std (n-1) and n of the runs that "
                      f"did not diverge (throughput: of every run; {unit} per second), per scheme and depth{note}")
        outputs.table("depth_grid", wide, title=f"Depth study: final {metric}, mean ± std over seeds (diverged "
                      f"runs counted apart; 90% at s: mean first step at 90% of the final {metric}){note}")
        # the plot's marks: a mean where some seed trained (some others may have diverged), hollow
        # where none learned, a cross where every seed diverged
        depth_plot(outputs, [{**r, "diverged_step": None,
                               "status": "trained" if r["status"] == "partly diverged" else r["status"]}
                              for r in collapsed], metric, axis)
        curves_plot(outputs, grid, rows, metric, "depth", "depth_curves", axis)
        echo = ["depth_grid"]
    elif grid.kind == "depth":
        ordered, wide = depth_tables(rows, metric, axis)
        outputs.table("depth", ordered, title=f"Depth study: one row per run (final values; failed to learn: "
                      f"final {metric} not above chance + {margin:g}{speed}){note}")
        outputs.table("depth_grid", wide, title=f"Depth study: final {metric} per scheme and depth "
                      f"(diverged@s: diverged at step s){note}")
        depth_plot(outputs, ordered, metric, axis)
        echo = ["depth_grid"]
    elif grid.kind == "batch-lr":
        points = rows
        if seeded:  # a setting is stable when none of its seeds diverged; optimal: the best mean of those
            outputs.table("batch_lr_runs", sorted(rows, key=lambda r: (r["scheme"], r["batch_size"], r["lr"],
                                                                       r["seed"])),
                          title=f"Batch size x learning rate: one row per run{note}")
            rows = [{**r, "diverged_step": None} for r in collapse_seeds(rows, ["scheme", "batch_size", "lr"], metric)]
            points = [{**r, "diverged": f"{r['diverged']}/{r['seeds']}"} for r in rows]  # 1/3: seeds diverged
        summary = batch_lr_tables(rows, metric)
        over = (" (over seeds: the best mean among the learning rates at which no seed diverged; diverged_seeds: "
                "how many did at each)" if seeded else "")
        outputs.table("batch_lr", summary, title=f"Optimal (best final {metric}{over}), largest stable (did not "
                      f"diverge) and largest learning (trained, not collapsed to chance) learning rate per scheme "
                      f"and batch size{note}")
        outputs.table("batch_lr_points", sorted(points, key=lambda r: (r["scheme"], r["batch_size"], r["lr"])),
                      title=f"Batch size x learning rate: one row per {'learning rate over seeds' if seeded else 'run'}"
                      f"{note}")
        batch_lr_plots(outputs, rows, summary, metric)
        echo = ["batch_lr"]
    elif grid.kind == "seeds":
        done = [(p.name, s.summary) for p in grid.points if (s := grid.state(p)).state == "done"]
        table = seed_table([s for _, s in done], last_k)
        outputs.table("seeds", table, title=f"Over {len(done)} seeds: mean, std = sample standard deviation "
                      f"(ddof=1, n-1), n = finite values (diverged runs left out){note}")
        outputs.table("seeds_points", rows, title=f"One row per seed{note}")
        seed_plot(outputs, done, metric)
        echo = ["seeds"]
    else:
        outputs.table("points", rows, title=f"{grid.kind}: one row per run{note}")
        echo = ["points"]
    outputs.finish(wandb_run, wandb_project_name, echo=echo)
    return outputs


def _warn_mixed_code(grid: Grid) -> None:
    """One warning line when the finished points ran on several versions of the suite (a study
    resumed after a pull or an edit): their differences may come from the code, not only from the
    study's settings (each point's run_summary.json says which it ran on)."""
    versions: dict[str, list[str]] = defaultdict(list)
    for point in grid.points:
        state = grid.state(point)
        code = (state.summary or {}).get(CODE_KEY) if state.state == "done" else None
        if isinstance(code, dict) and code.get("version"):
            versions[describe_code({"commit": None, "dirty": None, **code})].append(point.name)
    if len(versions) > 1:
        log.warning("warning: the points of this study ran on %d versions of the code (%s): their results may "
                    "differ by the code as well as by the study's settings", len(versions), "; ".join(
                        f"{version}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''} ({len(names)})"
                        for version, names in versions.items()))
