"""``rescale study``: the papers' studies as grids of ordinary ``rescale fit`` runs.

    rescale study depth    [--config C] [--depths 16 100 1000] [--schemes bn none ...] [--budget_epochs E]
    rescale study batch-lr [--config C] [--batch_sizes 64 256 ...] [--lrs ... | --lr_grid 0.025:3.2:2]
    rescale study seeds    --config C [--seeds N | --seed_list 0 1 2]
    rescale study aggregate STUDY_DIR        (the tables and plots again, e.g. after a cluster ran it)

Common: ``--out STUDY_DIR`` (default ``studies/<kind>``), ``--engine local|slurm|wandb``,
``--dry-run``, ``--wandb_run RUN`` (log the tables and plots), and ``rescale fit`` overrides after
``--``, applied to every point (``-- --trainer.max_epochs 2 --data.root /data/cifar10``).

- ``depth``: SkipInit's depth study: a network of several depths under ``bn``, the
  counter-examples (``bn_scaled``, ``bn_head``, ``bn_merge``), ``skipinit``, ``rescale``,
  ``fixup``, ``nf`` and ``none``, each with the same budget. Table: trained / diverged at step s / failed to learn / failed, final
  train loss, final validation loss and metric, best metric; plot: metric against depth.
- ``batch-lr``: for every batch size a grid of learning rates per scheme; the optimal and the
  largest stable learning rate per batch size (table), plotted against the batch size (log-log).
- ``seeds``: any config over N seeds; every final and best metric as mean, sample std (n-1), n,
  min and max, and the diverged runs.

The engines: ``local`` runs the points here, one after another or ``--workers N`` at once, seed
by seed (each a ``rescale fit`` subprocess; running the command again skips finished points and
resumes interrupted ones from their ``last.ckpt``), then writes the tables; ``slurm`` writes ``STUDY_DIR/slurm.sbatch`` (a job
array, one task per point) and ``wandb`` writes ``STUDY_DIR/sweep.yaml`` (for ``wandb agent``),
and print how to submit them; ``rescale study aggregate STUDY_DIR`` then reads the results.
One study command at a time works in a folder (a second is refused in one line naming the first,
:mod:`..common.system.lock`); the points of a SLURM array share it, each point locking its own folder.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
from typing import Optional

from ..common.cli import CONFIG_FLAGS, check_layers, defaults_for, flag_values
from ..common.errors import UserArgumentParser as _Parser, UserError
from ..common.system import folder_lock
from .aggregate import aggregate
from .compare import METRICS, check_last_k
from .cluster import check_slurm_options, write_slurm, write_sweep
from .engines import StudyInterrupted, check_workers, run_grid, run_one
from .grid import LOG_FILE, Grid, GridPoint, rescale_command, wandb_project
from .points import (BATCH_LR_CONFIG, BATCH_LR_SCHEMES, BATCH_SIZES, DEFAULT_SEEDS, DEPTH_CONFIG, DEPTH_DEPTHS,
                     DEPTH_SCHEMES, KEYS, LR_GRID, batch_lr_points, check_batch_lr, check_depths, depth_points,
                     parse_lr_grid, seed_points)
from .readme_tables import update_document

__all__ = ["main", "build_parser", "split_overrides"]

log = logging.getLogger(__name__)


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
    g.add_argument("--workers", type=int, default=1,
                   help="local engine: run this many points at once, each a rescale fit subprocess with its "
                        "share of the cores as OMP_NUM_THREADS where none is set and of the GPUs as "
                        "CUDA_VISIBLE_DEVICES (default: %(default)s)")
    g.add_argument("--echo", action="store_true", help="local engine: show the runs' output (always in their log.txt)")
    g.add_argument("--seed", type=int, default=0, help="--seed_everything of every point (default: %(default)s)")
    g.add_argument("--budget_epochs", type=int, help="training budget of every point: --trainer.max_epochs")
    g.add_argument("--budget_steps", type=int,
                   help="training budget of every point: --trainer.max_steps (a run validates at its "
                        "val_check_interval, by default at epoch ends only; epoch-based schedules are sized by "
                        "max_epochs: prefer --budget_epochs where the configs validate per epoch)")
    g.add_argument("--metric", help=f"the metric of the tables (default: the first logged of {', '.join(METRICS)})")
    g.add_argument("--last_k", type=int, metavar="K", help="the tables also give each run's mean of its last K "
                                                           "epoch-end validations of the metric (e.g. 5)")
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
    is looked up in the repository of this installation when the current folder has none. A file
    that is no config (a key given twice included), or one of its ``_defaults.yaml``, is one line
    before any point runs, not a failure of every point."""
    if args.config:
        configs = args.config
    elif default:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # <repo>/tasks/studies
        configs = [default if os.path.isfile(default) else os.path.join(repo, default)]
    else:
        raise UserError(f"rescale study {args.command}: give a run config with --config")
    check_layers(configs)
    return [os.path.abspath(c) for c in configs]


def _run_study(args, grid: Grid) -> int:
    check_workers(args.workers, args.in_process)
    if args.engine == "slurm":  # before the grid is written
        check_slurm_options(args.cpus_per_task, args.max_parallel)
    if args.dry_run:
        log.info(f"study {grid.study_dir}: {len(grid.points)} points (dry run: nothing run or written)")
        run_grid(grid, dry_run=True)
        return 0
    with folder_lock(grid.study_dir):  # one study process per folder (common.system.lock)
        return _run_locked(args, grid)


def _run_locked(args, grid: Grid) -> int:
    grid.save()
    n = len(grid.points)
    if args.engine == "slurm":
        path = write_slurm(grid, args.partition, args.gres or None, args.time, args.cpus_per_task,
                           args.max_parallel, tuple(args.sbatch))
        log.info(f"wrote {grid.path} ({n} points) and {path}\nsubmit: sbatch {shlex.quote(path)}\n"
                 f"results: rescale study aggregate {shlex.quote(grid.study_dir)}")
        return 0
    if args.engine == "wandb":
        logger = grid.logger_class(grid.points[0])
        if not logger or "wandb" not in logger.lower():
            log.warning(f"warning: the points log with {logger or 'no logger'}, not W&B: the sweep's runs will "
                        f"report nothing to it (the results are still in {grid.study_dir})")
        project = wandb_project(grid)
        path = write_sweep(grid, project)
        log.info(f"wrote {grid.path} ({n} points) and {path}\n"
                 f"submit: wandb sweep --project {shlex.quote(project)} {shlex.quote(path)}   (prints the sweep id)\n"
                 f"then, on each machine: wandb agent <entity>/{project}/<sweep id>\n"
                 f"results: rescale study aggregate {shlex.quote(grid.study_dir)}")
        return 0
    at_once = "one after another" if args.workers == 1 else f"{args.workers} at once"
    log.info(f"study {grid.study_dir}: {n} points, {at_once} "
             f"({'in this process' if args.in_process else 'each a rescale fit subprocess'})")
    try:
        counts = run_grid(grid, in_process=args.in_process, echo=args.echo, say=log.info, workers=args.workers)
    except StudyInterrupted as stop:
        log.error(f"error: study interrupted while running {stop.point} ({_where_stopped(grid, stop.point)}"
                  f"{'; the points running beside it kept theirs, where they had one' if args.workers > 1 else ''}); "
                  f"run the same command again to resume")
        return stop.returncode or 128 + signal.SIGTERM
    busy = f", {counts['busy']} running elsewhere" if counts["busy"] else ""
    log.info(f"points: {counts['ran']} run, {counts['resumed']} resumed, {counts['skipped']} already done, "
             f"{counts['failed']} failed{busy}")
    aggregate(grid, metric=args.metric, wandb_run=args.wandb_run, wandb_project_name=args.wandb_project,
              last_k=args.last_k)
    if counts["failed"]:
        log.error(f"error: {counts['failed']} of {n} points failed (the table says which and why; their "
                  f"{LOG_FILE} has the output); run the same command again to retry them")
        return 1
    return 0


def _where_stopped(grid: Grid, name: str) -> str:
    """Where a point the study's stop signal reached is: resumable, done (the signal came as its
    run ended) or to start again."""
    state = grid.state(grid.point(name))
    if state.state == "done":
        return f"it had ended ({state.summary.get('status')}) as the signal came: its result is kept"
    if state.state == "partial":
        return "its last.ckpt is kept"
    return "stopped before its first checkpoint: it starts again"


def _study(args, points: list[GridPoint], settings: dict, overrides: list[str]) -> int:
    """The grid of ``args.command`` (the budget and fit overrides for every point) run by the engine."""
    check_last_k(args.last_k, args.metric)  # before a point runs
    settings = {**settings, "metric": args.metric, "learn_margin": args.learn_margin, "last_k": args.last_k}
    overlays = flag_values(overrides, CONFIG_FLAGS)
    if overlays and points:  # checked as --config is, before a point runs or a script is written
        check_layers([*points[0].configs, *overlays], "--config (after --)")
    grid = Grid(args.out, points, args.command, settings, [*_budget(args), *overrides], args.seed)
    return _run_study(args, grid)


def _name(args) -> str:
    """The study's name (the W&B groups of its points): its folder's."""
    return os.path.basename(os.path.abspath(args.out))


def _repeats(args) -> Optional[list[int]]:
    """The seeds of a study over several (``--seed_list`` without repeats, else ``--seeds N`` from
    ``--seed`` on; a depth or batch-lr study without either: None, one run per point, ``--seed``)."""
    if args.seed_list:
        return list(dict.fromkeys(args.seed_list))
    if args.seeds is not None:
        if args.seeds < 1:
            raise UserError(f"--seeds {args.seeds}: give at least 1")
        return list(range(args.seed, args.seed + args.seeds))
    return None


def _recipe_template(args, configs: list[str]) -> Optional[str]:
    if not args.recipe:
        return None
    if "{scheme}" not in args.recipe:
        raise UserError(f"--recipe {args.recipe}: expected a path with {{scheme}} in it, "
                        "e.g. experiments/cifar/recipes/{scheme}.yaml")
    if not any(os.path.isfile(args.recipe.format(scheme=scheme)) for scheme in args.schemes):
        raise UserError(f"--recipe {args.recipe}: no recipe file for any of the schemes "
                        f"{' '.join(args.schemes)} (a scheme without one trains on the base config)")
    base_defaults = defaults_for(configs)
    for scheme in args.schemes:
        path = args.recipe.format(scheme=scheme)
        if os.path.isfile(path):
            check_layers([path], "--recipe")
        # a recipe is an overlay: the _defaults.yaml of another experiments folder would come with
        # it and replace the base config's network and data (common/cli/config_layers.py)
        foreign = [d for d in defaults_for([path]) if d not in base_defaults] if os.path.isfile(path) else []
        if foreign:
            raise UserError(f"--recipe {path}: it lies under {os.path.dirname(foreign[-1])}, whose "
                            f"{os.path.basename(foreign[-1])} would replace the network and data of "
                            f"{' '.join(configs)}; give a recipe from the base config's own experiments folder")
    return args.recipe


def _cmd_depth(args, overrides: list[str]) -> int:
    configs = _configs(args, DEPTH_CONFIG)
    seeds, recipe = _repeats(args), _recipe_template(args, configs)
    points = depth_points(configs, args.depths, args.schemes, _name(args), args.depth_key,
                          args.scheme_key, seeds, recipe)
    check_depths(args.depths, points, args.depth_key, overrides)
    return _study(args, points, {"depths": args.depths, "schemes": args.schemes, "seeds": seeds,
                                 "recipe": recipe, "depth_key": args.depth_key}, overrides)


def _cmd_batch_lr(args, overrides: list[str]) -> int:
    configs = _configs(args, BATCH_LR_CONFIG)
    lrs = args.lrs or parse_lr_grid(args.lr_grid)
    check_batch_lr(args.batch_sizes, lrs)
    seeds, recipe = _repeats(args), _recipe_template(args, configs)
    points = batch_lr_points(configs, args.batch_sizes, lrs, args.schemes, _name(args), args.batch_key, args.lr_key,
                             args.scheme_key, seeds, recipe)
    return _study(args, points, {"batch_sizes": args.batch_sizes, "lrs": lrs, "schemes": args.schemes,
                                 "seeds": seeds, "recipe": recipe}, overrides)


def _cmd_seeds(args, overrides: list[str]) -> int:
    configs = _configs(args, None)
    seeds = _repeats(args)
    return _study(args, seed_points(configs, seeds, _name(args)), {"seeds": seeds}, overrides)


def _cmd_aggregate(args, overrides: list[str]) -> int:
    if overrides:
        raise UserError("rescale study aggregate takes no fit overrides (after --)")
    grid = Grid.load(args.study_dir)
    with folder_lock(grid.study_dir):
        aggregate(grid, args.out, args.metric, args.wandb_run, args.wandb_project, args.last_k)
    return 0


def _cmd_tables(args, overrides: list[str]) -> int:
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
    grid.check_definition(point)
    state = grid.state(point)
    if state.state == "done":
        log.info(f"{point.name}: done ({state.summary.get('status')}), nothing to run")
        return 0
    log.info(f"{point.name}: {'resuming from ' + str(state.checkpoint) if state.state == 'partial' else 'running'}\n"
             f"$ {shlex.join([*rescale_command(), *grid.point_argv(point)])}")
    try:
        code = run_one(grid, point, in_process=args.in_process, echo=not args.in_process)
    except StudyInterrupted as stop:
        return stop.returncode or 128 + signal.SIGTERM
    if code:
        log.error(f"error: {point.name} failed (exit status {code}): see {os.path.join(grid.point_dir(point), LOG_FILE)}")
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
    a.add_argument("--last_k", type=int, metavar="K", help="the tables also give each run's mean of its last K "
                                                           "epoch-end validations of the metric (e.g. 5)")
    a.add_argument("--wandb_run", help="log the tables and plots to this W&B run (folder or id)")
    a.add_argument("--wandb_project", help="the W&B project of --wandb_run given as an id")
    a.set_defaults(func=_cmd_aggregate)

    t = sub.add_parser("tables", help="copy the study tables a document names into it (docs/studies.md)")
    t.add_argument("document", nargs="?", default="docs/studies.md", help="default: %(default)s")
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
