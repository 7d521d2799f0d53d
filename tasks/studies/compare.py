"""``rescale compare``: each normalization-free run against its normalized baseline.

    rescale compare runs/ studies/depth/ [--metric val/acc1] [--baseline bn] [--out compare]
    rescale compare --wandb_project <entity>/<project> [--wandb_dir runs]   (a W&B project's runs)

Runs are read from the ``run_summary.json`` every ``rescale fit`` writes (found under the given
folders, wherever the runs ran), or from a W&B project: through its API when logged in, else the
summaries of the project's runs under ``--wandb_dir`` (the suite logger's ``save_dir``: an offline
run keeps its summary in ``wandb/offline-run-*/files``); W&B's own run files are never read
(``wandb sync`` uploads offline runs). They are grouped by experiment (the W&B group, e.g.
``imagenet-resnet50``; else the network) and, inside one, by variant: the scheme plus its options
and the training settings that change the method (adaptive gradient clipping: ``nf[agc_clip=0.01]``;
its ``agc_eps`` and ``agc_clip_classifier`` too where they are not the defaults). A run whose
summary records another definition of its scheme (``scheme_fields``) than its name and options give
in this code is named by the options that would build that network now (a ``rezero`` run trained
before its gain was shared per Transformer layer: ``rezero[layer_gain=False]``), a variant apart
from the scheme as defined now; a summary without the record counts as the scheme it names.
Several runs of a variant are seeds, shown as mean +- std (sample std, n-1); runs of one variant
that differ in another recorded setting (network, network options, learning rate, batch size, the
data read: run_summary.json's ``data``, unknown in older summaries), in
the steps they trained (a run stopped early among finished ones) or share a seed are still pooled, but named in one warning line per variant (one for the experiment
where each of its variants was pooled over the same settings, as in a sweep's folder) and marked in
the table's ``mixed`` column. A run resumed after an interruption is one run however many segments it has (one
per run id: :func:`latest_segments`).
Each variant is set against the experiment's baseline: the variant named by ``--baseline`` or, by
default, the first of bn, gn, post_ln, pre_ln present, else another scheme with BatchNorm, GroupNorm
or LayerNorm under its options (never a LayerNorm-free one: dyt, derf, post_ln[norm=None]); an
experiment without one is named in one warning line, its rows compared to nothing; a variant that
shares no network (architecture and network options), or no data read, with its baseline is named in
one warning line and marked in the ``mixed`` column. A variant is better than the baseline when its metric
is higher (accuracy, box AP, BLEU) or lower (a loss); a tie is not better.

Writes ``compare.csv/.md`` (one row per experiment and variant: its runs, the task's metric mean and
std and ``n``, the runs they are of (a diverged run, or one that logged no finite value, left out),
its difference to the baseline, final train loss, throughput and its ratio to the
baseline's (each of the runs that did not diverge: the metric, loss and speed of a diverged run
are the blow-up's), diverged runs, what its pooled runs differ in besides their seed; with
``--last_k K``, ``last<K> mean``/``std``/``n``: over its runs, each run's mean of its last K
epoch-end validations, :func:`last_k_mean`) and, per
experiment, ``<experiment>_curves.png`` (training loss and validation metric of every run) and
``<experiment>_metric.png`` (the metric per variant, error bars over seeds).
"""
from __future__ import annotations

import logging
import math
import operator
import os
import re
import json
import statistics
from collections import Counter, defaultdict
from typing import Iterable, Optional

from rescale_core import agc, get_scheme
from rescale_core.registry import model_entry

from ..common.data import describe_fingerprint, same_data
from ..common.errors import UserArgumentParser, UserError
from ..common.reporting import new_figure, wandb_mode
from ..common.run import MalformedSummary, find_summaries, higher_is_better, read_summary
from ..common.run.summary import scheme_changes
from .outputs import StudyOutputs, check_wandb_run

__all__ = ["main", "compare_rows", "mean_std", "variant_of", "scheme_options_of", "experiment_of", "pick_metric", "METRICS",
           "latest_segments", "run_identity", "bar_label", "last_k_mean", "last_k_column", "check_last_k"]

log = logging.getLogger(__name__)

# the task's metric, by what the runs logged: classification, detection, translation
METRICS = ("val/acc1", "val/bbox_AP", "val/map", "val/bleu", "val/acc")


def pick_metric(runs: list[dict], metric: Optional[str], default: Optional[str] = None) -> str:
    """``metric``, else the first of :data:`METRICS` some run logged, else ``default`` (None: a
    one-line error)."""
    if metric:
        return metric
    for name in METRICS:
        if any(name in (r.get("best") or {}) or name in (r.get("final") or {}) for r in runs):
            return name
    if default is not None:
        return default
    raise UserError("the runs logged none of the known task metrics " + ", ".join(METRICS) +
                    "; name one with --metric (e.g. --metric val/loss)")
BASELINES = ("bn", "gn", "post_ln", "pre_ln")
# training settings that change the method: part of the variant's name, as the scheme's options are,
# where they differ from the value given (None: whenever recorded). AGC's eps and whether it clips
# the classifier are named only beside an agc_clip: without one they change nothing
METHOD_SETTINGS = {"agc_clip": None, "agc_eps": agc.DEFAULT_EPS, "agc_clip_classifier": False}
_AGC_DETAILS = ("agc_eps", "agc_clip_classifier")
# recorded settings the seeds of one variant are expected to share
RUN_SETTINGS = ("network", "network_options", "lr", "batch_size", "global_batch", "data")


def mean_std(values: Iterable[float]) -> tuple[Optional[float], Optional[float], int]:
    """Mean, sample standard deviation (n-1; None for one value) and count of the finite values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None, None, 0
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else None), len(finite)


def last_k_column(k: int) -> str:
    """The name of the statistic: ``last5``."""
    return f"last{k}"


def check_last_k(k: Optional[int], metric: Optional[str] = None) -> None:
    """Refuse a ``--last_k`` below 1, or one with a ``metric`` that no validation logs (``val/...``)."""
    if k is not None and k < 1:
        raise UserError(f"--last_k {k}: give the number of last epochs to average, 1 or more (e.g. --last_k 5)")
    if k and metric and not metric.startswith("val/"):
        raise UserError(f"--last_k {k} averages the last epoch-end validations, and {metric} is not a validation "
                        "metric: give a val/ metric with --metric (e.g. --metric val/acc1), or leave out --last_k")


def last_k_mean(run: dict, metric: str, k: int) -> tuple[Optional[float], Optional[str]]:
    """The mean of ``metric`` at the run's last ``k`` epoch-end validations (the validations at an
    epoch's last batch, ``val_epoch_ends``; one per epoch, a resumed run's re-run validation once),
    and why there is none: None for a diverged run (counted apart), else a phrase for a run that
    validated at the end of fewer than ``k`` epochs, or recorded no epoch ends (an older summary).
    A non-finite value among the ``k`` makes the mean non-finite (left out of the mean over seeds)."""
    if run.get("status") == "diverged":
        return None, None
    ends = run.get("val_epoch_ends")
    if ends is None:
        return None, ("recorded no epoch-end validations (a run_summary.json written before they were kept, or a "
                      "W&B history without the epochs' train/loss_epoch)")
    ends = set(int(step) for step in ends)
    values = [float(v) for step, v in (run.get("curves") or {}).get(metric, []) if int(step) in ends]
    if len(values) < k:
        return None, (f"validated {metric} at the end of {len(values)} epoch{'s' if len(values) != 1 else ''}, "
                      f"fewer than --last_k {k}")
    return statistics.fmean(values[-k:]), None


def _run_name(run: dict) -> str:
    return str(run.get("name") or run.get("path") or run.get("run_id") or "a run")


def experiment_of(run: dict) -> str:
    return run.get("group") or run.get("network") or "runs"


def scheme_options_of(run: dict) -> dict:
    """The options that give the run's scheme, in this code, the definition the run recorded
    (``scheme_fields``): its ``scheme_options``, and each field the code defines otherwise since
    at the run's value (a ``rezero`` run trained before its gain was shared per Transformer layer:
    ``{"layer_gain": False}``). A run without the record: its ``scheme_options``."""
    return {**(run.get("scheme_options") or {}), **{key: old for key, (old, _) in scheme_changes(run).items()}}


def variant_of(run: dict) -> str:
    """``rescale``, ``rescale[c=10,gain=vector]``, ``nf[agc_clip=0.01]`` or
    ``nf[agc_clip=0.01,agc_clip_classifier=True]``: the scheme, the options that change it and the
    training settings that change the method (:data:`METHOD_SETTINGS`). The options are those that
    build the network the run recorded (:func:`scheme_options_of`): a run of an earlier definition
    of its scheme is the variant this code would run with them (``rezero[layer_gain=False]``), never
    a seed of the scheme as the code defines it now."""
    settings = {key: run.get(key) for key in METHOD_SETTINGS
                if not (key in _AGC_DETAILS and run.get("agc_clip") is None)}
    options = {**scheme_options_of(run),
               **{key: value for key, value in settings.items()
                  if value is not None and value != METHOD_SETTINGS[key]}}
    extra = ",".join(f"{k}={options[k]}" for k in sorted(options))
    return f"{run.get('scheme') or _registered_scheme(run.get('network')) or 'unknown'}" + (f"[{extra}]" if extra else "")


def _registered_scheme(network: Optional[str]) -> Optional[str]:
    """The scheme a paper model's name fixes (``rescale50`` -> ``rescale``): a W&B run of such a
    network records ``scheme: null``."""
    if not network:
        return None
    try:
        scheme = model_entry(str(network)).defaults.get("scheme")
    except KeyError:
        return None
    return scheme if isinstance(scheme, str) else getattr(scheme, "name", None)


# the normalization layers of a baseline: BatchNorm, GroupNorm, LayerNorm (dyt and derf replace
# LayerNorm by an element-wise function: normalization-free)
NORMS = ("bn", "gn", "ln")


def _is_normalized(scheme: str, options: Optional[dict] = None) -> bool:
    """Whether ``scheme`` under its ``options`` (a run's ``scheme_options``: ``norm`` may replace
    or remove the scheme's) normalizes with BatchNorm, GroupNorm or LayerNorm."""
    try:
        return get_scheme(scheme, **(options or {})).norm in NORMS
    except (KeyError, TypeError, ValueError):  # an unknown scheme, or options it does not take
        return False


def _shown(value) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def pooled_differences(runs: list[dict]) -> dict[str, list[str]]:
    """What the runs pooled as one variant's seeds differ in besides their seed: each setting of
    :data:`RUN_SETTINGS` recorded with more than one value (runs that did not record it left out),
    ``steps`` when they trained different numbers of steps (a run stopped or still training among
    finished ones; diverged runs left out), and ``seed`` when two runs share one; each with the
    values concerned."""
    found: dict[str, list[str]] = {}
    for key in RUN_SETTINGS:
        values = list(dict.fromkeys(_shown(_setting(r, key)) for r in runs if _setting(r, key) is not None))
        if key == "data":  # other data as same_data judges it, as against the baseline (a split more is the same)
            prints = [d for d, _ in filter(None, map(_data, runs))]
            if all(same_data(a, b) for a in prints for b in prints):
                continue
        if len(values) > 1:
            found[key] = values
    lengths = _lengths(runs)
    if len({steps for steps, _ in lengths}) > 1:
        found["steps"] = [f"{steps}" + (f" {status}" if status else "") for steps, status in lengths]
    seeds = Counter(r["seed_everything"] for r in runs if r.get("seed_everything") is not None)
    shared = [str(seed) for seed, n in sorted(seeds.items()) if n > 1]
    if shared:
        found["seed"] = shared
    return found


def _setting(run: dict, key: str):
    """A run's recorded ``key``; of its data fingerprint the module and each split's count and hash
    (``DigitsDataModule[train 1257 #3f2a...; val 270 #9c1b...]``), not where the root lies (the same
    data read from another folder is the same data)."""
    value = run.get(key)
    if key == "data" and isinstance(value, dict):
        value = describe_fingerprint(value)
    return value


def _lengths(runs: list[dict]) -> list[tuple[int, str]]:
    """The optimizer steps each run trained, with its status when it did not finish (``interrupted``:
    stopped, or still training and summarised by an earlier segment), in order; a diverged run
    stops early by design (the ``diverged`` column counts it) and is left out."""
    found = {(int(r["steps"]), "" if r.get("status") in (None, "finished") else str(r["status"]))
             for r in runs if r.get("steps") is not None and r.get("status") != "diverged"}
    return sorted(found)


def _and(items: list[str]) -> str:
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def _pooled_over(found: dict[str, list[str]]) -> str:
    """``differ in lr (0.1, 0.4) and batch_size (64, 256), and share seed 0``"""
    settings = [f"{key} ({', '.join(values)})" for key, values in found.items() if key != "seed"]
    what = f"differ in {_and(settings)}" if settings else ""
    if "seed" in found:
        seeds = found["seed"]
        what += (", and " if what else "") + f"share seed{'s' if len(seeds) > 1 else ''} {_and(seeds)}"
    return what


_POOLED_ADVICE = ("(marked in the mixed column); give such runs different W&B groups, or compare their folders "
                  "apart")


_UNFINISHED_ADVICE = "; resume a run that did not finish to its end (rescale fit ... --ckpt_path <its last.ckpt>)"


def _unfinished(found: dict[str, list[str]]) -> bool:
    """Whether the lengths a variant's runs differ in include a run that did not finish."""
    return any(" " in value for value in found.get("steps", ()))


def _warn_pooled(experiment: str, pooled: list[tuple[str, list[dict], dict[str, list[str]]]]) -> None:
    """One warning line per variant whose runs were pooled over other settings or shared seeds; one
    line for the experiment when several variants were pooled over the same settings (a sweep's
    folder, such as a batch-size / learning-rate study's, where each variant would repeat it)."""
    if len(pooled) > 1 and len({tuple(found) for _, _, found in pooled}) == 1:
        found = {key: sorted({v for _, _, f in pooled for v in f[key]}, key=_number_first) for key in pooled[0][2]}
        names = ", ".join(variant for variant, _, _ in pooled)
        log.warning(f"warning: {experiment}: the runs of each of its {len(pooled)} variants ({names}) "
                    f"{_pooled_over(found)}, yet are pooled as their seeds {_POOLED_ADVICE}"
                    f"{_UNFINISHED_ADVICE if _unfinished(found) else ''}")
        return
    for variant, runs, found in pooled:
        log.warning(f"warning: {experiment}: the {len(runs)} runs of {variant} {_pooled_over(found)}, yet are pooled "
                    f"as its seeds {_POOLED_ADVICE}{_UNFINISHED_ADVICE if _unfinished(found) else ''}")


def _number_first(value: str) -> tuple:
    """Sort key: numbers by value, before other text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _metric_value(run: dict, metric: str, use: str) -> Optional[float]:
    if run.get("status") == "diverged":
        return None
    value = (run.get(use) or {}).get(metric)
    return None if value is None else float(value)


def _train_loss(runs: list[dict]) -> Optional[float]:
    """Mean final training loss of the runs that did not diverge: a diverged run's last loss (finite
    until the monitor stopped it) is the blow-up's, not what the method trained to; the ``diverged``
    column counts it."""
    return mean_std((r.get("final") or {}).get("train/loss_epoch") for r in runs if r.get("status") != "diverged")[0]


def _speed(runs: list[dict]) -> Optional[float]:
    """Mean training throughput of the runs that did not diverge: a diverged run stopped after a few
    steps (its rate is the warm-up's, not the method's); the ``diverged`` column counts it."""
    return mean_std(r.get("samples_per_second") for r in runs if r.get("status") != "diverged")[0]


def _baseline(variants: dict[str, list[dict]], wanted: Optional[str]) -> Optional[str]:
    if wanted:  # the variant so named, else the scheme's first variant with options
        return wanted if wanted in variants else next((v for v in sorted(variants) if v.split("[")[0] == wanted), None)
    normalized = [v for v, runs in variants.items()
                  if _is_normalized(v.split("[")[0], (scheme_options_of(runs[0]) if runs else None))]
    # bn, gn, post_ln, pre_ln as such, then with options, then any other normalized variant
    rank = {scheme: i for i, scheme in enumerate(BASELINES)}
    return min(normalized, key=lambda v: (rank.get(v.split("[")[0], len(BASELINES)), "[" in v, v), default=None)


def _warn_no_baseline(experiment: str, variants: Iterable[str], wanted: Optional[str]) -> None:
    which = (f"no runs of the baseline {wanted} (--baseline)" if wanted else
             f"no normalized baseline (none of {', '.join(BASELINES)}, nor another scheme with BatchNorm, GroupNorm "
             "or LayerNorm)")
    log.warning(f"warning: {experiment}: {which} among its variants {', '.join(sorted(variants))}; its rows have no "
                "comparison to a baseline (name one of its variants with --baseline)")


def compare_rows(runs: list[dict], metric: Optional[str] = None, baseline: Optional[str] = None,
                 use: str = "best", last_k: Optional[int] = None) -> tuple[list[dict], str]:
    """One row per (experiment, variant), baseline first; and the metric used (without ``metric``,
    each experiment's own task metric: accuracy, box AP, BLEU; the first of them overall is returned).
    With ``last_k``, also ``last<k> mean``, ``std`` and ``n``: over the variant's runs, each run's
    :func:`last_k_mean` (a run without one named in one warning line)."""
    requested, first = metric, pick_metric(runs, metric)
    check_last_k(last_k, requested or first)
    if requested:
        _check_logged(runs, requested, use)
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        groups[experiment_of(run)][variant_of(run)].append(run)
    rows = []
    for experiment in sorted(groups):
        variants = groups[experiment]
        mine = pick_metric([r for group in variants.values() for r in group], requested, default=first)
        logged = any(mine in (r.get(use) or {}) for group in variants.values() for r in group)
        if not logged:
            log.warning(f"warning: {experiment}: none of its runs logged {mine} (as a {use} value); its rows have "
                        f"no {mine} (its runs' {use} values: {_logged(variants.values(), use)})")
        higher = higher_is_better(mine)
        base = _baseline(variants, baseline)
        if base is None:
            _warn_no_baseline(experiment, variants, baseline)
        base_mean = mean_std(_metric_value(r, mine, use) for r in variants[base])[0] if base else None
        if base and base_mean is None and logged and len(variants) > 1:
            runs_of = variants[base]
            diverged = sum(r.get("status") == "diverged" for r in runs_of)
            why = (f"its {len(runs_of)} run{'s' if len(runs_of) > 1 else ''} diverged" if diverged == len(runs_of)
                   else f"{diverged} of its {len(runs_of)} runs diverged, the others logged no finite {mine}"
                   if diverged else f"its runs logged no finite {mine} ({use} value)")
            log.warning(f"warning: {experiment}: the baseline {base} has no {mine}: {why}; its variants' rows have "
                        "no comparison to a baseline (name another of its variants with --baseline)")
        base_speed = _speed(variants[base]) if base else None
        order = ([base] if base else []) + sorted(v for v in variants if v != base)
        checks = (("network", _network, operator.eq, "ran another network"),
                  ("data", _data, same_data, "read other data"))
        # the baseline's networks and data, read once for all its variants
        theirs = {what: [n for n in map(read, variants[base]) if n] if base else [] for what, read, _, _ in checks}
        pooled: list[tuple[str, list[dict], dict[str, list[str]]]] = []
        for variant in order:
            group = variants[variant]
            mean, std, n = mean_std(_metric_value(r, mine, use) for r in group)
            recent = {}
            if last_k:
                values = []
                for run in group:
                    value, why = last_k_mean(run, mine, last_k)
                    values.append(value)
                    if why:
                        log.warning(f"warning: {experiment}: {variant}: run {_run_name(run)} {why}: left out of "
                                    f"{last_k_column(last_k)}")
                column = last_k_column(last_k)
                recent = dict(zip((f"{column} mean", f"{column} std", f"{column} n"), mean_std(values)))
            loss = _train_loss(group)
            speed = _speed(group)
            diverged = sum(r.get("status") == "diverged" for r in group)
            mixed = pooled_differences(group)
            if mixed:
                pooled.append((variant, group, mixed))
            against = {}  # what the variant's runs share none of with its baseline's: network, data
            for what, read, same, ran in checks:
                other = _other_than_baseline(group, theirs[what], read, same) if base and variant != base else None
                if other:
                    against[what] = other
                    log.warning(f"warning: {experiment}: {variant} {ran} than its baseline {base} ({other}), yet is "
                                "compared with it (marked in the mixed column); give such runs different W&B groups, "
                                "or compare their folders apart")
            rows.append({
                "experiment": experiment, "variant": variant,
                "role": "baseline" if variant == base else "",
                "runs": len(group), "metric": mine, "mean": mean, "std": std, "n": n, **recent,
                "vs_baseline": (mean - base_mean) if mean is not None and base_mean is not None else None,
                "better": (None if mean is None or base_mean is None or variant == base
                           else (mean > base_mean if higher else mean < base_mean)),
                "train_loss": loss, "samples_per_s": speed,
                "speed_vs_baseline": speed / base_speed if speed and base_speed else None,
                "diverged": f"{diverged}/{len(group)}",
                "mixed": ", ".join([*(k if k != "seed" else f"shared seed {', '.join(v)}" for k, v in mixed.items()),
                                    *(f"{what} vs baseline" for what in against)]),
            })
        _warn_pooled(experiment, pooled)
    return rows, first


def _network(run: dict) -> Optional[tuple[str, str]]:
    """(what the run's network is, how it is shown): a registered network by its family and the
    defaults its name fixes besides the scheme (``rescale50`` is ``resnet50`` under rescale), with
    the run's network options; None when the run recorded no network."""
    network = run.get("network")
    if not network:
        return None
    options = run.get("network_options") or {}
    shown = f"{network}" + (f" {_shown(options)}" if options else "")
    try:
        entry = model_entry(str(network))
    except KeyError:
        return json.dumps([network, options], sort_keys=True, default=str), shown
    fixed = {k: v for k, v in entry.defaults.items() if k != "scheme"}
    return json.dumps([entry.family, fixed, options], sort_keys=True, default=str), shown


def _data(run: dict) -> Optional[tuple[dict, str]]:
    """(which data the run read: its data fingerprint, how it is shown: :func:`_setting`); None when
    the run recorded none (an older summary)."""
    value = run.get("data")
    return (value, _setting(run, "data")) if isinstance(value, dict) else None


def _other_than_baseline(runs: list[dict], theirs: list[tuple], what, same=operator.eq) -> Optional[str]:
    """``cifar_resnet {"depth": 56} against cifar_resnet {"depth": 20}`` when the runs of a variant
    and of its baseline share no ``what`` (:func:`_network`: architecture and network options; or
    :func:`_data` under :func:`same_data`: the data read): a variant compared with a baseline of
    another depth or width, or trained and validated on other data. None when they share one, or
    either recorded none. ``theirs``: what the baseline's runs recorded (``what`` of each, None left
    out), read once for all its variants."""
    mine = [n for n in map(what, runs) if n]
    if not mine or not theirs or any(same(a, b) for a, _ in mine for b, _ in theirs):
        return None
    return f"{', '.join(sorted({s for _, s in mine}))} against {', '.join(sorted({s for _, s in theirs}))}"


def _logged(groups: Iterable[list[dict]], use: str) -> str:
    """The metrics the runs of ``groups`` hold as ``use`` values, sorted: ``val/acc1, val/loss``."""
    names = sorted({key for group in groups for r in group for key in (r.get(use) or {})})
    return ", ".join(names) or "none"


def _check_logged(runs: list[dict], metric: str, use: str) -> None:
    """A ``--metric`` no run holds as a ``use`` value is one line naming the metrics they hold (a
    training metric has no best value: the best values are the validations')."""
    if any(metric in (r.get(use) or {}) for r in runs):
        return
    hint = ("; it is among their final values: --use final" if use == "best" and
            any(metric in (r.get("final") or {}) for r in runs) else "")
    raise UserError(f"--metric {metric}: no run logged it as a {use} value (--use {use}); their {use} values: "
                    f"{_logged([runs], use)}{hint}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "runs"


def bar_label(row: dict) -> str:
    """A variant's name under its bar, and why it has no bar: ``(diverged)`` when every run of it
    diverged, ``(no value)`` when the others logged no finite value of the metric."""
    if row["mean"] is not None:
        return row["variant"]
    diverged, runs = row["diverged"].split("/")
    return f"{row['variant']} ({'diverged' if diverged == runs else 'no value'})"


def _plots(outputs: StudyOutputs, runs: list[dict], rows: list[dict], metric: str) -> None:
    by_experiment: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_experiment[experiment_of(run)].append(run)
    metric_of = {r["experiment"]: r["metric"] for r in rows}
    stems: dict[str, str] = {}  # experiment -> its files' stem, distinct ("en de" and "en_de" both slug to en_de)
    for experiment in sorted(by_experiment):
        stem = name = _slug(experiment)
        n = 1
        while name in stems.values():
            n += 1
            name = f"{stem}-{n}"
        stems[experiment] = name
    for experiment, group in sorted(by_experiment.items()):
        metric = metric_of.get(experiment, metric)
        fig, (ax_loss, ax_metric) = new_figure(2)
        colors: dict[str, str] = {}
        for run in sorted(group, key=variant_of):
            variant = variant_of(run)
            first = variant not in colors
            color = colors.setdefault(variant, f"C{len(colors) % 10}")
            curves = run.get("curves") or {}
            label = variant if first else None
            loss = [(s, v) for s, v in curves.get("train/loss", []) if math.isfinite(v)]
            if loss:
                ax_loss.plot(*zip(*loss), color=color, alpha=0.8, label=label)
            points = curves.get(metric, [])
            if points:
                ax_metric.plot(*zip(*points), color=color, marker="o", alpha=0.8, label=label)
        ax_loss.set(xlabel="step", ylabel="train loss", yscale="log", title=f"{experiment}: training loss")
        ax_metric.set(xlabel="step", ylabel=metric, title=f"{experiment}: {metric}")
        outputs.figure(f"{stems[experiment]}_curves", fig)

        mine = [r for r in rows if r["experiment"] == experiment]
        fig, (ax,) = new_figure(1)
        xs = range(len(mine))
        ax.bar(xs, [r["mean"] if r["mean"] is not None else 0.0 for r in mine],
               yerr=[r["std"] or 0.0 for r in mine], capsize=4,
               color=["0.6" if r["role"] else "C0" for r in mine])
        ax.set_xticks(list(xs), [bar_label(r) for r in mine],
                      rotation=30, ha="right", fontsize=8)
        ax.set(ylabel=metric, title=f"{experiment}: {metric} (mean +- std over seeds)")
        outputs.figure(f"{stems[experiment]}_metric", fig)


def run_from_wandb(*, config: dict, summary: dict, history: Iterable[dict], name=None, group=None, run_id=None,
                   project=None, state=None) -> dict:
    """A W&B run read through W&B's API (its config, summary and history rows) as a run summary:
    network, scheme, their options, ``agc_clip`` (with ``agc_eps`` and ``agc_clip_classifier``), the optimizer's ``lr``, the data's ``batch_size``
    ``seed_everything`` and the data read (``data_fingerprint``; an older run's: unknown) from the config the suite pushed (:class:`~..common.run.SaveConfigToRun`),
    the curves, best validation values, steps trained (``trainer/global_step`` + 1: the summary's
    steps) and the epoch-end validations (``val_epoch_ends``: at the steps ``train/loss_epoch`` was
    logged, an epoch's end) from the history, the final values and the throughput (``throughput/run_<unit>_per_s``,
    the whole run's; of an older run, ``throughput/<unit>_per_s``) from the W&B summary."""
    init = ((config.get("model") or {}).get("init_args") or {})
    optimizer = init.get("optimizer") if isinstance(init.get("optimizer"), dict) else {}
    optimizer = optimizer.get("init_args") or {}
    data = (config.get("data") or {}).get("init_args") or {}
    seed = config.get("seed_everything")
    fingerprint = config.get("data_fingerprint")  # run_summary.json's `data`
    final = {k: float(v) for k, v in summary.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_")}
    points: dict[str, dict[int, float]] = defaultdict(dict)  # a step logged again (a resume) keeps its last value
    steps = None  # the furthest step logged: a run still training (state running) has fewer than its seeds
    epoch_ends = None  # the steps an epoch ended at (Lightning logs its epoch's loss there), once each
    for row in history:
        step = row.get("trainer/global_step")
        if not isinstance(step, (int, float)):
            continue
        steps = max(steps or 0, int(step) + 1)
        if "train/loss_epoch" in row:
            epoch_ends = (epoch_ends or set()) | {int(step) + 1}
        for key, value in row.items():
            if (key == "train/loss_step" or key.startswith("val/")) and isinstance(value, (int, float)):
                points["train/loss" if key == "train/loss_step" else key][int(step) + 1] = float(value)
    curves = {key: [[step, value] for step, value in sorted(values.items())] for key, values in points.items()}
    best = {}
    for key, points in curves.items():
        values = [v for _, v in points if math.isfinite(v)]
        if key.startswith("val/") and values:
            best[key] = max(values) if higher_is_better(key) else min(values)
    # the whole run's (throughput/run_<unit>_per_s); a run logged before it had its own key: the last rate logged
    rates = [(not k.startswith("throughput/run_"), v) for k, v in final.items()
             if k.startswith("throughput/") and k.endswith("_per_s")]
    throughput = min(rates, key=lambda r: r[0])[1] if rates else None
    diverged = summary.get("diverged") is True or final.get("diverged") == 1.0
    return {
        "name": name, "group": group, "run_id": run_id, "project": project, "network": init.get("network"),
        "scheme": init.get("scheme"), "scheme_options": init.get("scheme_options") or {},
        "network_options": init.get("network_options") or {}, "agc_clip": init.get("agc_clip"),
        "agc_eps": init.get("agc_eps"), "agc_clip_classifier": init.get("agc_clip_classifier"),
        "lr": optimizer.get("lr"), "batch_size": data.get("batch_size"),
        "seed_everything": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "data_seed": data.get("seed") if isinstance(data.get("seed"), int) and not isinstance(data.get("seed"), bool) else None,
        "status": "diverged" if diverged else (state or "finished"), "steps": steps,
        "final": final, "best": best, "samples_per_second": throughput, "curves": curves,
        "data": fingerprint if isinstance(fingerprint, dict) else None,
        # the validations at an epoch's end: at a step an epoch ended (unknown where no epoch logged its loss)
        "val_epoch_ends": None if epoch_ends is None else sorted(
            epoch_ends & {step for key, points in curves.items() if key.startswith("val/") for step, _ in points}),
    }


def _project_summaries(project: str, wandb_dir: str) -> list[dict]:
    """The run summaries of ``project`` (``entity/project`` or ``project``) under ``wandb_dir``
    (the suite logger's ``save_dir``; a resumed run's segments are one run: :func:`latest_segments`)."""
    name = project.rsplit("/", 1)[-1]
    runs, _ = _read_summaries([wandb_dir]) if os.path.isdir(wandb_dir) else ([], 0)
    return [run for run in runs if run.get("project") == name]


def _wandb_runs(project: str, wandb_dir: str) -> list[dict]:
    """The runs of a W&B project: from W&B's servers when logged in, else the summaries of its
    runs under ``wandb_dir``."""
    if wandb_mode() != "online":
        runs = _project_summaries(project, wandb_dir)
        if not runs:
            raise UserError(f"--wandb_project {project}: no run_summary.json of project "
                            f"{project.rsplit('/', 1)[-1]} under {wandb_dir} (point --wandb_dir at the logger's "
                            "save_dir, or give the runs' folders); reading the project from W&B's servers "
                            "needs a login (wandb login)")
        return runs
    import wandb

    return [run_from_wandb(config=dict(run.config or {}), summary=dict(run.summary), history=run.scan_history(),
                           name=run.name, group=run.group, run_id=run.id, project=project, state=run.state)
            for run in wandb.Api().runs(project)]


def run_identity(run: dict) -> Optional[str]:
    """What the segments of one resumed run share: its W&B project's name and run id (every segment
    of a resumed run continues it; the name without its entity, as a run summary records it, so that
    a run read from its folder and from W&B's API is one), else its checkpoint folder; None: a run on
    its own."""
    if run.get("run_id"):
        return f"{(run.get('project') or '').rsplit('/', 1)[-1]}/{run['run_id']}"
    if run.get("checkpoint"):
        return os.path.dirname(os.path.abspath(run["checkpoint"]))
    return None


def latest_segments(runs: list[dict]) -> list[dict]:
    """One summary per run: a run resumed after an interruption writes one summary per segment
    (each W&B offline segment is a folder of its own), every one covering the run from its start;
    the one that got furthest (most steps; the last written among equals) stands for the run, so
    that a resumed run is counted once and its seeds are distinct runs."""
    latest: dict[str, dict] = {}
    alone = []
    for run in runs:
        key = run_identity(run)
        if key is None:
            alone.append(run)
        elif key not in latest or _progress(run) >= _progress(latest[key]):
            latest[key] = run
    return alone + list(latest.values())


def _progress(run: dict) -> tuple:
    path = run.get("path")
    written = os.path.getmtime(path) if path and os.path.exists(path) else 0.0
    return run.get("steps") or 0, written


def _read_summaries(folders: list[str]) -> tuple[list[dict], int]:
    """The run summaries under ``folders`` (one per run: :func:`latest_segments`), and how many
    files were skipped: a file that is not one (a run killed while writing it, a file edited by
    hand) is named in one warning line on stderr and left out, so the other runs are still
    compared."""
    runs, skipped = [], 0
    for path in find_summaries(*folders):
        try:
            runs.append(read_summary(path))
        except (MalformedSummary, OSError) as err:
            skipped += 1
            why = f"cannot read {path}: {err.strerror}" if isinstance(err, OSError) else str(err)
            log.warning(f"warning: skipped {why}")
    if skipped and runs:
        log.warning(f"warning: skipped {skipped} of {skipped + len(runs)} run_summary.json files as malformed "
                    "(named above)")
    return latest_segments(runs), skipped


def main(argv: Optional[list[str]] = None) -> int:
    p = UserArgumentParser(prog="rescale compare", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="folders holding run_summary.json files (searched recursively)")
    p.add_argument("--wandb_project", help="entity/project: compare its runs, through the W&B API when logged in, "
                                           "else the run summaries of the project under --wandb_dir")
    p.add_argument("--wandb_dir", default="runs", help="where the project's runs are when not logged in: the "
                                                       "logger's save_dir (default: runs)")
    p.add_argument("--metric", help=f"the metric to compare (default: the first logged of {', '.join(METRICS)})")
    p.add_argument("--use", choices=("best", "final"), default="best", help="best or final validation value")
    p.add_argument("--last_k", type=int, metavar="K", help="also the mean of the last K epoch-end validations of "
                                                           "each run (e.g. 5), then mean +- std over seeds")
    p.add_argument("--baseline", help="the baseline variant (default: bn, gn, post_ln or pre_ln, else another "
                                     "scheme with BatchNorm, GroupNorm or LayerNorm; never dyt or derf)")
    p.add_argument("--out", default="compare", help="output folder")
    p.add_argument("--wandb_run", help="also log the table and plots to this W&B run (its folder, or its id with "
                                       "--wandb_project: the project of the runs compared)")
    args = p.parse_args(argv)
    if not args.folders and not args.wandb_project:
        raise UserError("rescale compare needs run folders (e.g. runs/) or --wandb_project")
    missing = [f for f in args.folders if not os.path.exists(f)]
    if missing:
        raise UserError(f"rescale compare: no such folder {missing[0]}")
    check_wandb_run(args.wandb_run, args.wandb_project)
    check_last_k(args.last_k)
    outputs = StudyOutputs(args.out)
    runs, skipped = _read_summaries(args.folders)
    if args.wandb_project:  # a run under both the folders and --wandb_dir counts once
        runs = latest_segments(runs + _wandb_runs(args.wandb_project, args.wandb_dir))
    if not runs:
        which = f"readable run_summary.json ({skipped} malformed, named above)" if skipped else "run_summary.json"
        raise UserError(f"no {which} under {', '.join(args.folders)}: every `rescale fit` writes one beside its "
                        "config; point at the runs' folders")
    rows, metric = compare_rows(runs, args.metric, args.baseline, args.use, args.last_k)
    metrics = ", ".join(dict.fromkeys(r["metric"] for r in rows)) or metric
    left_out = f"; {skipped} malformed run_summary.json left out" if skipped else ""
    recent = (f"; {last_k_column(args.last_k)}: each run's mean of its last {args.last_k} epoch-end validations, "
              "then over seeds" if args.last_k else "")
    outputs.table("compare", rows, title=f"{metrics} ({args.use}{recent}; each experiment its task's metric, see the "
                  f"metric column), each variant against its baseline; std: sample std over seeds (n-1){left_out}")
    _plots(outputs, runs, rows, metric)
    outputs.finish(args.wandb_run, args.wandb_project, echo=["compare"])
    return 0
