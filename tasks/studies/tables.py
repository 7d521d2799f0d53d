"""The tables of the studies, from the points' rows (:func:`.results.point_rows`): the depth study
per run and as the wide scheme x depth grid (over seeds: mean ± std), the optimal and largest stable
learning rate per scheme and batch size, and every metric over seeds.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Optional

from ..common.run import higher_is_better
from .compare import last_k_column, last_k_mean, mean_std
from .points import KEYS
from .results import as_float
from .seeded import collapse_seeds, format_mean_std

__all__ = ["depth_tables", "depth_seed_tables", "batch_lr_tables", "seed_table", "AGGREGATE_PREFIXES", "unstable"]

AGGREGATE_PREFIXES = ("val/", "train/", "test/")


def _status_cell(row: dict, metric: str) -> str:
    status = row["status"]
    if status == "trained":
        return f"{row[f'final {metric}']:.4g}" if row[f"final {metric}"] is not None else f"trained, no {metric}"
    if status.startswith("diverged"):
        return f"diverged@{row['diverged_step']}"
    if status == "failed to learn":
        value = row[f"final {metric}"]
        return "failed to learn" + (f" ({value:.3g})" if value is not None else "")
    return status


# --- depth ------------------------------------------------------------------------------------------
def depth_tables(rows: list[dict], metric: str, axis: str = "depth") -> tuple[list[dict], list[dict]]:
    """The per-point table (scheme order of the grid, then depth) and the wide table: one row per
    scheme, one column per depth (the final metric, ``diverged@s``, ``failed to learn`` ...), each
    headed ``{axis} {value}`` (:func:`depth_axis`)."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    depths = sorted({r["depth"] for r in rows})
    ordered = sorted(rows, key=lambda r: (schemes.index(r["scheme"]), r["depth"], r.get("seed") or 0))
    wide = []
    for scheme in schemes:
        cells = {r["depth"]: _status_cell(r, metric) for r in rows if r["scheme"] == scheme}
        wide.append({"scheme": scheme, **{f"{axis} {d}": cells.get(d, "") for d in depths}})
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
    if row["not_done"]:
        notes.append(f"{row['not_done']}/{runs} not done")
    unmeasured = runs - row["not_done"] - row["diverged"] - n  # finished without the metric
    if unmeasured:
        notes.append(f"{unmeasured}/{runs} without {metric}")
    if row["steps_to_90"] is not None:
        notes.append(f"90% at {row['steps_to_90']:.0f}")
    return " ".join(part for part in (cell, f"({'; '.join(notes)})" if notes else "") if part)


def depth_seed_tables(rows: list[dict], metric: str, axis: str = "depth") -> tuple[list[dict], list[dict]]:
    """With seeds: one row per (scheme, depth) (mean, std, n, diverged, steps to 90% ...) and the wide
    table of ``_seeded_cell`` s, one row per scheme, its columns headed ``{axis} {value}``."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    depths = sorted({r["depth"] for r in rows})
    keys = ["scheme", "depth"] + (["recipe"] if any("recipe" in r for r in rows) else [])
    collapsed = sorted(collapse_seeds(rows, keys, metric), key=lambda r: (schemes.index(r["scheme"]), r["depth"]))
    wide = []
    for scheme in schemes:
        cells = {r["depth"]: _seeded_cell(r, metric) for r in collapsed if r["scheme"] == scheme}
        recipe = next((r["recipe"] for r in collapsed if r["scheme"] == scheme and "recipe" in r), None)
        wide.append({"scheme": scheme, **({"recipe": recipe} if recipe else {}),
                     **{f"{axis} {d}": cells.get(d, "") for d in depths}})
    return collapsed, wide


def depth_axis(depth_key: str | None) -> str:
    """What a depth study's columns vary: ``depth``, or the last part of another ``--depth_key``
    (``trainer.max_epochs``: a study of budgets, headed ``max_epochs 3``, ``max_epochs 5`` ...)."""
    return "depth" if not depth_key or depth_key == KEYS["depth"] else depth_key.rsplit(".", 1)[-1]


# --- batch size x learning rate ------------------------------------------------------------------------
def unstable(row: dict) -> bool:
    """Whether a run diverged, or, a setting over seeds (:func:`~.seeded.collapse_seeds`), any of
    its seeds did (``partly diverged``: the mean of the others is no result of that learning rate)."""
    return row["status"].startswith("diverged") or row["status"] == "partly diverged"


def batch_lr_tables(rows: list[dict], metric: str) -> list[dict]:
    """Per (scheme, batch size): the optimal learning rate (best final metric, over seeds its mean,
    among the learning rates whose runs all finished without diverging: one at which any seed
    diverged is neither optimal nor stable, however good the others' mean) and the largest stable
    one (the largest at which no run diverged); ``diverged``: the learning rates at which a run
    diverged; over seeds, ``diverged_seeds``: at each of them, how many of its seeds
    (``0.2: 1/3; 0.4: 3/3``); ``not_done``: the runs (of every seed) that have not finished."""
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
        ran = [r for r in group if r["status"] in ("trained", "failed to learn") or unstable(r)]
        stable = [r for r in ran if not unstable(r)]
        largest = max(stable, key=lambda r: r["lr"]) if stable else None
        # a run that stayed finite but collapsed to chance did not diverge, yet did not train either
        learned = [r for r in stable if r["status"] == "trained"]
        out.append({
            "scheme": scheme, "batch_size": batch,
            "optimal_lr": best["lr"] if best else None, f"optimal {metric}": best[key] if best else None,
            "largest_stable_lr": largest["lr"] if largest else None,
            "stable_at_grid_max": (largest["lr"] == max(r["lr"] for r in group)) if largest else None,
            "largest_learning_lr": max(r["lr"] for r in learned) if learned else None,
            "lrs": len(group), "diverged": sum(unstable(r) for r in group),
            **({"diverged_seeds": "; ".join(f"{r['lr']:g}: {r['diverged']}/{r['seeds']}" for r in group
                                            if r["diverged"])} if "seeds" in group[0] else {}),
            "not_done": sum(_not_done(r) for r in group),
        })
    return out


def _not_done(row: dict) -> int:
    """The runs of a row that have not finished: a point's row is one run; a setting collapsed over
    seeds (:func:`~.seeded.collapse_seeds`) counts its seeds not done, also where the others trained
    (its mean is then of fewer seeds than the other learning rates')."""
    if "not_done" in row:
        return int(row["not_done"])
    return int(row["status"] in ("failed", "running", "interrupted", "not run"))


# --- seeds ------------------------------------------------------------------------------------------
def seed_table(summaries: list[dict], last_k: Optional[int] = None) -> list[dict]:
    """Every final and best metric (``val/``, ``train/``, ``test/``) over the runs: n (finite values),
    mean, sample std (n-1; empty for one value), min, max; runs and diverged runs. Diverged runs'
    values are left out of the statistics (they are counted in ``diverged``). ``last_k``: also, per
    validation metric, each run's mean of its last ``last_k`` epoch-end validations (use
    ``last<k>``; a run with fewer left out: :func:`~.results.point_rows` names it)."""
    runs = len(summaries)
    diverged = sum(s.get("status") == "diverged" for s in summaries)
    keys: dict[tuple[str, str], None] = {}
    kept = [s for s in summaries if s.get("status") != "diverged"] or summaries
    for use in ("final", "best"):
        for s in kept:
            for k in (s.get(use) or {}):
                if k.startswith(AGGREGATE_PREFIXES):
                    keys[(use, k)] = None
    if last_k:
        for s in kept:
            for k in (s.get("curves") or {}):
                if k.startswith("val/"):
                    keys[(last_k_column(last_k), k)] = None
    rows = []
    for use, k in sorted(keys, key=lambda x: (x[1], x[0] != "final", x[0] != "best")):
        values = [(last_k_mean(s, k, last_k)[0] if last_k and use == last_k_column(last_k)
                   else as_float((s.get(use) or {}).get(k))) for s in summaries if s.get("status") != "diverged"]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        mean, std, n = mean_std(finite)
        rows.append({"metric": k, "use": use, "n": n, "mean": mean, "std": std,
                     "min": min(finite) if finite else None, "max": max(finite) if finite else None,
                     "runs": runs, "diverged": diverged})
    return rows
