"""The points of the papers' studies: one ``rescale fit`` per (scheme, depth), per (scheme, batch
size, learning rate) or per seed, each optionally over seeds and with a per-scheme recipe, and the
defaults of the published studies (SkipInit's depth and batch-size studies, the rebuttal's seeds).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

from ..common.errors import ConfigError, UserError
from ..common.training import create_network
from .grid import GridPoint, configured_network
from .seeded import seed_suffix

__all__ = ["depth_points", "batch_lr_points", "seed_points", "parse_lr_grid", "check_depths", "check_batch_lr", "KEYS", "DEPTH_SCHEMES",
           "DEPTH_CONFIG", "DEPTH_DEPTHS", "BATCH_LR_CONFIG", "BATCH_LR_SCHEMES", "BATCH_SIZES", "LR_GRID",
           "DEFAULT_SEEDS"]

DEPTH_SCHEMES = ("bn", "bn_scaled", "bn_head", "bn_merge", "skipinit", "rescale", "fixup", "nf", "none")
DEPTH_CONFIG = "experiments/cifar/wrn100-2_bn.yaml"      # Wide-ResNet n-2, SkipInit's depth study
DEPTH_DEPTHS = (16, 40, 100, 1000)
BATCH_LR_CONFIG = "experiments/cifar/wrn16-4_bn.yaml"    # SkipInit's batch-size study: WRN 16-4
BATCH_LR_SCHEMES = ("bn", "skipinit", "rescale", "nf")
BATCH_SIZES = (64, 256, 1024, 4096)
LR_GRID = "0.0125:6.4:2"
DEFAULT_SEEDS = 6                                          # the rebuttal's 6 runs
KEYS = {"depth": "model.init_args.network_options.depth", "scheme": "model.init_args.scheme",
        "batch": "data.init_args.batch_size", "lr": "model.init_args.optimizer.init_args.lr"}


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


def check_batch_lr(batch_sizes: list[int], lrs: list[float]) -> None:
    """Refuse a batch size below 1 or a learning rate not above 0 in one line, before the grid is
    written (each point would fail, or train nothing, in turn)."""
    bad = [b for b in batch_sizes if b < 1]
    if bad:
        raise UserError(f"--batch_sizes {' '.join(map(str, bad))}: a batch size is at least 1")
    bad_lrs = [lr for lr in lrs if not lr > 0]  # nan included
    if bad_lrs:
        raise UserError(f"--lrs {' '.join(map(_fmt, bad_lrs))}: a learning rate is above 0")


_NETWORK_OPTION = "model.init_args.network_options."


def check_depths(depths: list[int], points: list[GridPoint], depth_key: str, overrides: list[str]) -> None:
    """Refuse in one line, before the grid is written, a depth below 1 and, where the depth is a
    network option (``model.init_args.network_options.<key>``, the default), one the study's network
    cannot be built at: each depth's first point's network (its configs, recipe and overrides) is
    built as its run builds it, on the meta device (no memory, no time), so the rule is the
    network's own. Judged only where the network builds at its config's own depth: a network that
    needs the data's settings (a Transformer's vocabulary) is left to its runs."""
    low = [d for d in depths if d < 1]
    if low:
        raise UserError(f"--depths {' '.join(map(str, low))}: a depth is at least 1")
    if not depth_key.startswith(_NETWORK_OPTION):
        return
    seen: set = set()
    for point in points:
        depth = point.params.get("depth")
        if depth in seen:
            continue
        seen.add(depth)
        error = _build_error(configured_network(point.configs, [*overrides, *point.overrides]), f"--depths {depth}")
        if error is None:
            continue
        # the depth's fault only where the network builds without it: at the config's own depth, or
        # at the network's default one
        own = configured_network(point.configs, [*overrides, *_without(point.overrides, f"--{depth_key}")])
        default = {**own, "network_options": {k: v for k, v in (own.get("network_options") or {}).items()
                                              if k != depth_key.removeprefix(_NETWORK_OPTION)}}
        if any(_build_error(settings, "the config") is None for settings in (own, default)):
            raise UserError(error)


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value."""
    return [a for i, a in enumerate(argv) if a != flag and (i == 0 or argv[i - 1] != flag)]


def _build_error(settings: dict[str, Any], where: str) -> Optional[str]:
    """Why the network of ``settings`` (:func:`configured_network`) cannot be built (None: it can,
    or it could not be judged here)."""
    network, options = settings.get("network"), settings.get("network_options") or {}
    if not isinstance(network, str) or not isinstance(options, dict):
        return None
    kwargs = dict(options)
    if settings.get("scheme") is not None:
        kwargs["scheme"] = settings["scheme"]
    if isinstance(settings.get("scheme_options"), dict) and settings["scheme_options"]:
        kwargs["scheme_options"] = dict(settings["scheme_options"])
    try:
        with torch.device("meta"):
            create_network(network, where=where, **kwargs)
    except ConfigError as err:
        return str(err)
    except Exception:  # noqa: BLE001 - a builder that cannot run on the meta device: left to the run
        return None
    return None
