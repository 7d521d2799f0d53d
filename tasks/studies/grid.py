"""A study's grid of ordinary ``rescale fit`` runs: its points, their folders and where each stands.

A study is a list of grid points; each point is one ``rescale fit`` with the study's base config,
the study's overrides and the point's own (its scheme, depth, batch size, learning rate or seed).
:class:`Grid` writes ``<study_dir>/grid.json`` (the points, configs and overrides), so every
engine (:mod:`.engines`) and the aggregation read the same grid, wherever they run. Each point has
a folder ``<study_dir>/points/<name>/`` holding everything of its run:

- ``run_summary.json`` (``--run_summary.path``): what the run ended with, read by the tables;
- ``checkpoints/[<run id>/]last.ckpt`` (``--last_checkpoint.dirpath``): the resume point;
- the logger's files (``--trainer.logger.init_args.save_dir``: ``wandb/offline-run-*``);
- ``log.txt``: the run's output, appended by every attempt, and ``outcome.json``: the exit
  status and error line of the last attempt.

A point is *done* when its summary says ``finished`` or ``diverged`` (a divergence is a result,
never a failure: runs get ``--divergence.raise_error false``), *partial* when it has a
``last.ckpt`` but no final summary (it resumes with ``--ckpt_path``), *failed* when its last
attempt exited with an error and left nothing to resume (it is tried again), else *todo*.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import yaml

from ..common.cli import CONFIG_FLAGS, flag_values, load_yaml, trainer_defaults, yaml_layers
from ..common.errors import UserError
from ..common.run import SUMMARY_FILE, read_summary
from ..common.run.summary import scheme_changes, shown_changes
from ..common.system import atomic_open, lock_holder

__all__ = ["GridPoint", "Grid", "PointState", "GRID_FILE", "POINTS_DIR", "LOG_FILE", "OUTCOME_FILE",
           "rescale_command", "configured_logger", "configured_network", "wandb_project", "read_json", "write_json"]

GRID_FILE = "grid.json"
POINTS_DIR = "points"
LOG_FILE = "log.txt"
OUTCOME_FILE = "outcome.json"
DONE = ("finished", "diverged")
_NOW = "as the code defines it now"  # a recorded scheme definition that scheme_changes finds unchanged
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.+=")


@dataclass
class GridPoint:
    """One run of a study: ``rescale fit --config <configs> <grid overrides> <overrides>``.

    ``params`` are the point's coordinates in the study (``{"depth": 100, "scheme": "rescale"}``),
    read back by the tables; ``group`` is its W&B group (points compared with each other share one).
    """

    name: str
    configs: list[str]
    overrides: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    group: Optional[str] = None
    config_digest: Optional[str] = None  # what its configs said when the grid was written (configs_digest)

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_OK or self.name.startswith("."):
            raise UserError(f"grid point name {self.name!r}: use letters, digits and - _ . + = only")


@dataclass
class PointState:
    """Where a point stands: ``done``, ``partial``, ``failed`` or ``todo``."""

    state: str
    summary: Optional[dict] = None
    checkpoint: Optional[str] = None
    outcome: Optional[dict] = None


def rescale_command() -> list[str]:
    """The installed ``rescale`` command: the script beside this Python, else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "rescale")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "rescale_tasks.cli"]


class Grid:
    """The points of one study and their folders under ``study_dir``.

    Args:
        study_dir: the study's folder (``grid.json``, ``points/<name>/``, tables and plots).
        points: the grid points, in the order of their index (the SLURM array task id).
        kind: the study (``depth``, ``batch-lr``, ``seeds``): how ``aggregate`` reads it.
        settings: the study's own settings (depths, schemes, metric ...), kept for ``aggregate``.
        overrides: ``rescale fit`` arguments every point gets (before its own).
        seed: ``--seed_everything`` of every point (a point's overrides may set its own).
        cwd: the folder runs start in (relative paths in configs and overrides are read there).
    """

    def __init__(self, study_dir: str, points: list[GridPoint], kind: str = "grid",
                 settings: Optional[dict] = None, overrides: Optional[list[str]] = None,
                 seed: int = 0, cwd: Optional[str] = None) -> None:
        names = [p.name for p in points]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise UserError(f"grid point {duplicate!r} appears twice; each point needs its own name")
        self.study_dir = os.path.abspath(study_dir)
        self.points = list(points)
        self.kind = kind
        self.settings = dict(settings or {})
        self.overrides = list(overrides or [])
        self.seed = int(seed)
        self.cwd = os.path.abspath(cwd or os.getcwd())

    # --- grid.json ------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return os.path.join(self.study_dir, GRID_FILE)

    def to_dict(self) -> dict:
        return {"version": 1, "kind": self.kind, "cwd": self.cwd, "seed": self.seed,
                "overrides": self.overrides, "settings": self.settings,
                "points": [asdict(p) for p in self.points]}

    @classmethod
    def load(cls, study_dir: str) -> "Grid":
        path = os.path.join(study_dir, GRID_FILE)
        if not os.path.isfile(path):
            raise UserError(f"{study_dir} is not a study folder (no {GRID_FILE}); create it with "
                            "rescale study depth|batch-lr|seeds --out <folder>")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            points = [GridPoint(**p) for p in data["points"]]
            return cls(study_dir, points, data.get("kind", "grid"), data.get("settings"),
                       data.get("overrides"), data.get("seed", 0), data.get("cwd"))
        except UserError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:  # not JSON, or not a grid's fields
            what = f"invalid JSON ({err.msg}: line {err.lineno})" if isinstance(err, json.JSONDecodeError) \
                else f"{type(err).__name__}: {err}"
            raise UserError(f"{path} is not the grid file of a study ({what}); put back the one the study "
                            "wrote, or give the study another --out folder") from None

    def _signature(self, point: GridPoint) -> list:
        return [point.configs, self.seed, self.overrides, point.overrides]

    def config_files(self, point: GridPoint) -> list[str]:
        """Every config file ``point``'s command applies: its configs, then those the study's and
        its own overrides give with ``--config`` (an overlay after ``--``), as paths from
        :attr:`cwd`, where the runs start."""
        overlays = flag_values([*self.overrides, *point.overrides], CONFIG_FLAGS)
        return [os.path.join(self.cwd, c) for c in [*point.configs, *overlays]]

    def configs_digest(self, point: GridPoint) -> str:
        """A digest of what ``point``'s config files say (:meth:`config_files`): the YAML mappings
        the command applies (the ``_defaults.yaml`` files above them, then the configs and
        overlays), so an edited value changes it and a comment or the layout does not."""
        layers = json.dumps(list(yaml_layers(self.config_files(point))), sort_keys=True, default=str)
        return hashlib.sha256(layers.encode()).hexdigest()[:16]

    def _ran_otherwise(self, old: "Grid", before: GridPoint, point: GridPoint) -> bool:
        """The point ran with other settings than ``point`` has (a grid written before configs'
        digests were recorded compares without them)."""
        if old._signature(before) != self._signature(point):
            return True
        return None not in (before.config_digest, point.config_digest) and before.config_digest != point.config_digest

    def check_configs(self, point: GridPoint) -> None:
        """Refuse to run ``point`` when its configs say something else than when the grid was
        written: its run would not be the study's (the points that ran read the old values)."""
        if point.config_digest is not None and self.configs_digest(point) != point.config_digest:
            raise UserError(
                f"the configs of grid point {point.name} changed since {self.path} was written "
                f"({', '.join(self.config_files(point))} or a _defaults.yaml above them): put them back as they were, "
                f"or run the study again with another --out")

    def check_definition(self, point: GridPoint) -> None:
        """Refuse to reuse ``point`` (done, or resumed) when its run recorded another definition of
        its scheme than the scheme's name and options give in this code (``run_summary.json``'s
        ``scheme_fields``): its result is of another network than the study's name says. A
        summary without the record (written before it was kept) is reused as ever."""
        summary = self.state(point).summary
        changes = scheme_changes(summary) if summary is not None else {}
        if changes:
            raise UserError(
                f"{self.study_dir} already holds point {point.name} run under another definition of scheme "
                f"{summary.get('scheme')} ({shown_changes(changes)}); give the study another --out folder, or "
                f"delete {self.point_dir(point)} to run it again")

    def check_one_definition(self) -> None:
        """Refuse to tabulate the done points of one scheme (name and options) whose runs recorded
        different definitions of it (``scheme_fields``: some ran before the code defined it
        otherwise, others after): the tables would average two networks under one name. A summary
        without the record is left alone, as when the grid is written."""
        found: dict[str, dict[str, list[str]]] = {}
        for point in self.points:
            state = self.state(point)
            summary = state.summary or {}
            if state.state != "done" or not isinstance(summary.get("scheme_fields"), dict):
                continue
            scheme = json.dumps([summary.get("scheme"), summary.get("scheme_options") or {}], default=str)
            what = shown_changes(scheme_changes(summary)) or _NOW
            found.setdefault(scheme, {}).setdefault(what, []).append(point.name)
        for scheme, definitions in found.items():
            if len(definitions) > 1:
                listed = "; ".join(f"{what}: {', '.join(names)}" for what, names in definitions.items())
                earlier = [name for what, names in definitions.items() if what != _NOW for name in names]
                raise UserError(
                    f"{self.study_dir}: its points of scheme {json.loads(scheme)[0]} ran under {len(definitions)} "
                    f"definitions of it ({listed}), which its tables would average as one; delete the points of "
                    f"the earlier ones from {os.path.join(self.study_dir, POINTS_DIR)} ({', '.join(earlier)}) and "
                    f"run the study again")

    def save(self) -> str:
        """Write ``grid.json`` with each point's :meth:`configs_digest`; refuse when the folder
        holds a point of the same name that ran with other settings (its results would be mixed up
        with this grid's), an edited config or another definition of its scheme included
        (:meth:`check_definition`), or points that ran from another folder."""
        digests: dict[tuple, str] = {}  # points share configs: read each set of YAML layers once
        for point in self.points:
            if point.config_digest is None:
                key = tuple(self.config_files(point))
                if key not in digests:
                    digests[key] = self.configs_digest(point)
                point.config_digest = digests[key]
        if os.path.isfile(self.path):
            old = Grid.load(self.study_dir)
            ran = [p.name for p in old.points if os.path.isdir(old.point_dir(p))]
            if old.cwd != self.cwd and ran:
                # the runs start in cwd: a relative path (the configs' data.root: data/cifar10, an
                # overlay) would name another file for the points still to run than for those that ran
                raise UserError(
                    f"{self.study_dir} holds points run from {old.cwd} (the folder relative paths such as "
                    f"data.root are read from), not from {self.cwd}: run the study from {old.cwd}, or give it "
                    f"another --out folder")
            by_name = {p.name: p for p in old.points}
            for point in self.points:
                before = by_name.get(point.name)
                if before is not None and self._ran_otherwise(old, before, point) \
                        and os.path.isdir(self.point_dir(point)):
                    raise UserError(
                        f"{self.study_dir} already holds point {point.name} run with other settings "
                        f"(configs, their values, seed or overrides differ); give the study another --out "
                        f"folder, or delete {self.point_dir(point)} to run it again")
        for point in self.points:
            if os.path.isdir(self.point_dir(point)):
                self.check_definition(point)
        os.makedirs(self.study_dir, exist_ok=True)
        write_json(self.path, self.to_dict())
        return self.path

    # --- one point --------------------------------------------------------------------------------
    def point(self, key: "int | str") -> GridPoint:
        """A point by index (the SLURM array task id, the sweep's ``point``) or by name."""
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            found = next((p for p in self.points if p.name == key), None)
            if found is None:
                raise UserError(f"no grid point named {key!r} in {self.study_dir}")
            return found
        index = int(key)
        if not 0 <= index < len(self.points):
            raise UserError(f"grid point {index} out of range: {self.study_dir} has points 0 to {len(self.points) - 1}")
        return self.points[index]

    def point_dir(self, point: GridPoint) -> str:
        return os.path.join(self.study_dir, POINTS_DIR, point.name)

    def state(self, point: GridPoint) -> PointState:
        folder = self.point_dir(point)
        summary = None
        summary_path = os.path.join(folder, SUMMARY_FILE)
        if os.path.isfile(summary_path):
            try:
                summary = read_summary(summary_path)
            except (OSError, ValueError):
                summary = None  # unreadable: run it again
        outcome = read_json(os.path.join(folder, OUTCOME_FILE))
        if summary is not None and summary.get("status") in DONE:
            return PointState("done", summary, None, outcome)
        checkpoint = self.last_checkpoint(point)
        if checkpoint:
            return PointState("partial", summary, checkpoint, outcome)
        if (outcome and outcome.get("returncode")) or summary is not None:
            return PointState("failed", summary, None, outcome)
        return PointState("todo", summary, None, outcome)

    def status(self, point: GridPoint) -> str:
        """``done``, ``partial``, ``failed`` or ``todo``."""
        return self.state(point).state

    def running(self, point: GridPoint) -> Optional[str]:
        """Who runs the point now (its folder's lock: pid, host, start, command; a SLURM task,
        ``rescale study run`` in another shell), or None when no process does."""
        return lock_holder(self.point_dir(point))

    def last_checkpoint(self, point: GridPoint) -> Optional[str]:
        """The newest ``last.ckpt`` of the point (under ``checkpoints/``, any run id)."""
        pattern = os.path.join(self.point_dir(point), "checkpoints", "**", "last.ckpt")
        found = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        return max(found, key=os.path.getmtime) if found else None

    def logger_class(self, point: GridPoint) -> Optional[str]:
        """The logger's class path after configs and overrides (None: no logger), read from the
        YAML files without building anything."""
        return configured_logger(self.config_files(point), [*self.overrides, *point.overrides])

    def point_argv(self, point: GridPoint, resume: bool = True) -> list[str]:
        """The exact ``rescale fit`` arguments of the point (with ``--ckpt_path`` when it has a
        ``last.ckpt`` to resume from and ``resume``)."""
        folder = self.point_dir(point)
        argv = ["fit"]
        for config in point.configs:
            argv += ["--config", config]
        argv += ["--seed_everything", str(self.seed), "--divergence.raise_error", "false", *self.overrides,
                 "--trainer.default_root_dir", folder,
                 "--run_summary.path", os.path.join(folder, SUMMARY_FILE),
                 "--last_checkpoint.dirpath", os.path.join(folder, "checkpoints")]
        logger = self.logger_class(point)
        if logger:  # Lightning's loggers all take save_dir and name; group is W&B's
            argv += ["--trainer.logger.init_args.save_dir", folder, "--trainer.logger.init_args.name", point.name]
            if point.group and "wandb" in logger.lower():
                argv += ["--trainer.logger.init_args.group", point.group]
        argv += point.overrides
        state = self.state(point) if resume else None
        if state is not None and state.state == "partial":
            argv += ["--ckpt_path", state.checkpoint]
        return argv


def configured_logger(configs: list[str], overrides: list[str]) -> Optional[str]:
    """``trainer.logger``'s class path as the CLI would resolve it: the suite's W&B logger unless a
    ``_defaults.yaml``, a config or an override sets another or none (``false``/``null``)."""
    logger: Any = trainer_defaults()["logger"]
    for data in yaml_layers(configs):
        trainer = data.get("trainer")
        if isinstance(trainer, dict) and "logger" in trainer:
            value = trainer["logger"]
            if isinstance(value, dict) and isinstance(logger, dict) and "class_path" not in value:
                value = {**logger, **value}  # init_args only: the class stays
            logger = value
    values = flag_values(overrides, ("--trainer.logger", "--trainer.logger.class_path"))
    if values:
        logger = load_yaml(values[-1], "--trainer.logger", file=False) if values[-1] else None
    if isinstance(logger, dict):
        logger = logger.get("class_path")
    if isinstance(logger, list):  # several loggers: leave their folders alone
        return None
    if logger is True:
        return "lightning.pytorch.loggers.TensorBoardLogger"
    return logger if isinstance(logger, str) and logger.lower() not in ("false", "null", "none", "") else None


NETWORK_SETTINGS = ("network", "scheme", "scheme_options", "network_options")


def configured_network(configs: list[str], overrides: list[str]) -> dict[str, Any]:
    """``model.init_args``' network, scheme, scheme_options and network_options after the configs,
    the ``--config`` overlays among the overrides, then the other overrides, read from the YAML files
    without building anything: a mapping given again replaces the former one, as the run's parser
    does; ``--model.init_args.network_options.<key> value`` sets one key of it."""
    settings: dict[str, Any] = {}

    def layer(data: Any) -> None:
        model = data.get("model") if isinstance(data, dict) else None
        init = model.get("init_args") if isinstance(model, dict) else None
        if isinstance(init, dict):
            settings.update({k: v for k, v in init.items() if k in NETWORK_SETTINGS})

    for data in yaml_layers([*configs, *flag_values(overrides, CONFIG_FLAGS)]):
        layer(data)
    i = 0
    while i < len(overrides):
        flag, sep, value = overrides[i].partition("=")
        if not sep:
            value, i = (overrides[i + 1] if i + 1 < len(overrides) else ""), i + 1
        i += 1
        key = flag.removeprefix("--model.init_args.")
        head, _, sub = key.partition(".")
        if key == flag or head not in NETWORK_SETTINGS:
            continue
        try:
            parsed = load_yaml(value, flag, file=False)
        except (yaml.YAMLError, UserError):
            continue  # the run itself reports it
        if sub:
            mapping = settings.get(head)
            settings[head] = {**(mapping if isinstance(mapping, dict) else {}), sub: parsed}
        else:
            settings[head] = parsed
    return settings


def wandb_project(grid: Grid) -> Optional[str]:
    """The W&B project the points log to (from their configs), for the sweep."""
    if not grid.points:
        return None
    point = grid.points[0]
    project = None
    for data in yaml_layers(grid.config_files(point)):
        init = (data.get("trainer") or {}).get("logger") or {}
        init = init.get("init_args") if isinstance(init, dict) else None
        if isinstance(init, dict) and init.get("project"):
            project = init["project"]
    overridden = flag_values([*grid.overrides, *point.overrides], ("--trainer.logger.init_args.project",))
    return (overridden[-1] if overridden else None) or project or "rescale"


def read_json(path: str) -> Optional[dict]:
    """The JSON object in ``path``; None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: dict) -> None:
    """``data`` as JSON in ``path``, written whole or not at all (:func:`~..common.system.atomic_open`)."""
    with atomic_open(path) as f:
        json.dump(data, f, indent=1)
