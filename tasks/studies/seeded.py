"""Studies over several seeds: the points of one setting collapsed into mean +- std, and how fast a
run got where it ended (steps to reach a fraction of its final metric, from its learning curve).

A study point records its learning curves in ``run_summary.json`` (``curves``: ``[step, value]``
pairs per logged metric); a short budget that stops a slow starter early shows here as a large
"steps to 90%" next to a final value still rising, not as a method that fails.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Optional, Sequence

from .compare import mean_std

__all__ = ["steps_to_fraction", "collapse_seeds", "mean_curve", "format_mean_std", "seed_suffix"]


def seed_suffix(seed: Optional[int]) -> str:
    """A point name's seed part: ``-s<seed>`` (nothing for a study without seeds)."""
    return "" if seed is None else f"-s{seed}"


def steps_to_fraction(curve: Sequence[Sequence[float]], final: Optional[float], fraction: float = 0.9,
                      higher: bool = True) -> Optional[int]:
    """The first step of ``curve`` at which the metric reached ``fraction`` of ``final`` (higher is
    better: value >= fraction * final; lower is better: value <= final / fraction). None without a
    curve or a finite final value."""
    if final is None or not math.isfinite(final) or not curve:
        return None
    target = fraction * final if higher else final / fraction
    for step, value in curve:
        if value is None or not math.isfinite(value):
            continue
        if (value >= target) if higher else (value <= target):
            return int(step)
    return None


def format_mean_std(mean: Optional[float], std: Optional[float], digits: int = 3) -> str:
    if mean is None:
        return ""
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def collapse_seeds(rows: Sequence[dict], keys: Sequence[str], metric: str) -> list[dict]:
    """One row per setting (the values of ``keys``) from the per-seed rows of a study.

    Each row: the setting, ``seeds`` (runs), ``diverged`` (runs that diverged, with their steps in
    ``diverged_steps``), ``failed_to_learn``, ``not_done``; mean, std (n-1) and n of the final and best
    metric (and ``last<k> <metric>`` where the rows have it: :func:`.results.point_rows`), final train loss and steps to 90% over the runs that trained (diverged runs left out), and
    of the throughput over every run that ran (a diverged run's speed is measured all the same);
    ``status``: ``trained`` (every run trained), ``diverged`` (every run that ran diverged),
    ``partly diverged`` (some did), ``failed to learn`` (no run learned) or ``not run``.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    out = []
    for setting, mine in groups.items():
        ran = [r for r in mine if r["status"] in ("trained", "failed to learn") or r["status"].startswith("diverged")]
        diverged = [r for r in ran if r["status"].startswith("diverged")]
        finished = [r for r in ran if not r["status"].startswith("diverged")]
        learned = [r for r in finished if r["status"] == "trained"]
        row: dict[str, Any] = dict(zip(keys, setting))
        recent = [k for k in mine[0] if k.startswith("last") and k.endswith(f" {metric}")]  # last<k> <metric>
        for name in (f"final {metric}", f"best {metric}", *recent, "train_loss", "steps_to_90"):
            mean, std, n = mean_std(r.get(name) for r in finished)
            row[name], row[f"{name} std"], row[f"{name} n"] = mean, std, n
        row["throughput"], row["throughput std"], row["throughput n"] = mean_std(r.get("throughput") for r in ran)
        if not ran:
            status = "not run"
        elif len(diverged) == len(ran):
            status = "diverged"
        elif diverged:
            status = "partly diverged"
        elif not learned:
            status = "failed to learn"
        else:
            status = "trained"
        row.update({"status": status, "seeds": len(mine), "diverged": len(diverged),
                    "diverged_steps": " ".join(str(r.get("diverged_step")) for r in diverged),
                    "failed_to_learn": len(finished) - len(learned),
                    "not_done": len(mine) - len(ran)})
        out.append(row)
    return out


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[tuple[float, float, float, float]]:
    """(step, mean, min, max) at the steps every curve has (the runs of one setting log at the same
    steps); an empty list when they share none."""
    if not curves:
        return []
    maps = [{int(s): float(v) for s, v in c if v is not None and math.isfinite(float(v))} for c in curves]
    common = sorted(set.intersection(*(set(m) for m in maps))) if maps else []
    return [(s, statistics.fmean(m[s] for m in maps), min(m[s] for m in maps), max(m[s] for m in maps))
            for s in common]
