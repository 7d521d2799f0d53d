"""What every study command writes: tables as CSV and markdown, plots as PNG, and both to a W&B
run when one is named (``--wandb_run``)."""
from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import logging
import math
import numbers
import os
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import yaml

from ..common.errors import UserError
from ..common.reporting import wandb_mode
from ..common.system import atomic_open, atomic_path, require_writable, write_output

__all__ = ["write_table", "markdown_table", "csv_markdown_table", "format_cell", "save_figure", "log_to_wandb", "check_wandb_run",
           "StudyOutputs", "TableEdited", "WRITTEN_SUFFIX"]

# beside <stem>.csv: what write_table wrote there (each cell's type, the file's digest)
WRITTEN_SUFFIX = ".written.json"

log = logging.getLogger(__name__)


def format_cell(value: Any) -> str:
    """Numbers to 4 significant digits, None as an empty cell, NaN as ``nan``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return str(value)


def _columns(rows: Sequence[dict], columns: Optional[Sequence[str]]) -> list[str]:
    if columns is not None:
        return list(columns)
    out: dict[str, None] = {}
    for row in rows:
        out.update(dict.fromkeys(row))
    return list(out)


def markdown_table(rows: Sequence[dict], columns: Optional[Sequence[str]] = None) -> str:
    cols = _columns(rows, columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(format_cell(row.get(c)) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + "\n"


class TableEdited(ValueError):
    """A table's ``.csv`` that is not what :func:`write_table` wrote (edited by hand since)."""


def _kind(value: Any) -> str:
    """A cell's type as :data:`WRITTEN_SUFFIX` records it: none, bool, int, float or text."""
    if value is None:
        return "none"
    if isinstance(value, (bool, np.bool_)):  # numpy's bool is no number
        return "bool"
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return "int"
    return "float" if isinstance(value, numbers.Real) else "text"


def _typed(text: str, kind: str) -> Any:
    """A cell of a table's CSV as the value of ``kind`` it was written from."""
    if kind == "none":
        return None
    if kind == "bool":
        return text == "True"
    return int(text) if kind == "int" else float(text) if kind == "float" else text


def _csv_value(text: str) -> Any:
    """A cell of a table's CSV written without :data:`WRITTEN_SUFFIX` beside it, as the value it was
    most likely written from: a bool, None (empty), a number only where the text is how the CSV writes
    that number (``0.001``, not ``1e-3``, ``0.10`` or ``NaN``: text a study wrote as such), else text."""
    if text in ("True", "False"):
        return text == "True"
    if text == "":
        return None
    try:
        if str(int(text)) == text:
            return int(text)
    except ValueError:
        pass
    try:
        if repr(float(text)) == text:
            return float(text)
    except ValueError:
        pass
    return text


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def csv_markdown_table(path: str) -> str:
    """The markdown table (without its title) :func:`write_table` writes beside the CSV ``path``:
    the full-precision values rounded as the ``.md`` rounds them, each cell read as the type it was
    written from (recorded in ``<stem>.written.json``; a table written before that record: guessed
    by :func:`_csv_value`). Raises :class:`TableEdited` when the CSV is not the one recorded (a value
    edited by hand, even one that rounds the same)."""
    with open(path, "rb") as f:
        data = f.read()
    header, *rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline=""))) or [[]]
    written = os.path.splitext(path)[0] + WRITTEN_SUFFIX
    if not os.path.isfile(written):
        return markdown_table([dict(zip(header, map(_csv_value, row))) for row in rows], header)
    try:
        with open(written, encoding="utf-8") as f:
            record = json.load(f)
        kinds = record["kinds"]
        digest = record["csv_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise TableEdited(f"{written} is not the record write_table wrote (unreadable)") from None
    if digest != _digest(data) or len(kinds) != len(rows) or any(len(k) != len(r) for k, r in zip(kinds, rows)):
        raise TableEdited(f"{os.path.basename(path)} is not the file the study wrote (edited by hand?)")
    return markdown_table([dict(zip(header, map(_typed, row, kind))) for row, kind in zip(rows, kinds)], header)


def write_table(rows: Sequence[dict], stem: str, columns: Optional[Sequence[str]] = None,
                title: Optional[str] = None) -> tuple[str, str]:
    """``<stem>.csv`` (full precision) and ``<stem>.md`` (rounded, with an optional title line); and
    ``<stem>.written.json``: each cell's type and the CSV's digest, so that ``rescale study tables``
    reads the CSV back as it was written (text ``1e-3`` stays text) and knows it unedited."""
    cols = _columns(rows, columns)
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=cols, extrasaction="ignore")
    writer.writeheader()
    writer.writerows([{c: ("" if row.get(c) is None else row.get(c)) for c in cols} for row in rows])
    data = text.getvalue().encode("utf-8")
    record = {"csv_sha256": _digest(data), "kinds": [[_kind(row.get(c)) for c in cols] for row in rows]}
    # the record last, the old one gone first: a write stopped midway leaves a pair without a record
    # (read by its cells, as a pair written before records), never a record of other files
    if os.path.exists(stem + WRITTEN_SUFFIX):
        os.remove(stem + WRITTEN_SUFFIX)
    with atomic_open(stem + ".csv", "wb") as f:
        f.write(data)
    with atomic_open(stem + ".md") as f:
        f.write((f"{title}\n\n" if title else "") + markdown_table(rows, cols))
    with atomic_open(stem + WRITTEN_SUFFIX) as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
    return stem + ".csv", stem + ".md"


def save_figure(fig, path: str) -> str:
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(fig)
    return path


def log_to_wandb(run: str, tables: dict[str, Sequence[dict]], images: dict[str, str],
                 project: Optional[str] = None) -> str:
    """Log tables and PNGs to the W&B run ``run``: a run directory of this suite
    (``.../wandb/offline-run-*`` or ``run-*``) or a run id (with ``project``, ``project`` or
    ``entity/project``). The run is resumed
    (``resume="allow"``) in the suite's mode: offline unless logged in. Returns the run id."""
    import wandb

    check_wandb_run(run, project)
    save_dir = None
    if os.path.isdir(run):
        run_id, logged_to = _run_of_folder(run)
        project = project or logged_to
        save_dir = os.path.dirname(os.path.dirname(os.path.abspath(run)))  # <save_dir>/wandb/<run>
    else:
        run_id = run
    settings = wandb.Settings(console="off", silent=True)
    entity, _, name = (project or "rescale").rpartition("/")  # entity/project, as --wandb_project takes it
    # dir: an explicit folder (W&B would otherwise use the working folder of its first run in this process)
    with wandb.init(id=run_id, project=name, entity=entity or None, dir=save_dir or os.getcwd(), resume="allow",
                    mode=wandb_mode(), settings=settings) as wb:
        payload: dict[str, Any] = {}
        for name, rows in tables.items():
            cols = _columns(rows, None)
            payload[f"tables/{name}"] = wandb.Table(columns=cols, data=[[row.get(c) for c in cols] for row in rows])
        for name, path in images.items():
            payload[f"plots/{name}"] = wandb.Image(path)
        wb.log(payload)
    return run_id


def check_wandb_run(run: Optional[str], project: Optional[str]) -> None:
    """Refuse, in one :class:`UserError` line and before a command does its work, a ``--wandb_run``
    that :func:`log_to_wandb` could not log to: a folder that is no W&B run's, or a run id without
    its project."""
    if not run:
        return
    if os.path.isdir(run):
        _run_of_folder(run)
    elif not project:
        raise UserError(f"--wandb_run {run}: a run id needs --wandb_project (or give the run's folder)")


def _run_of_folder(folder: str) -> tuple[str, Optional[str]]:
    """The run id and project of a run folder of this suite (``<save_dir>/wandb/offline-run-<time>-<id>``
    or ``run-<time>-<id>``): the id from the name W&B gives the run's file (``run-<id>.wandb``), the
    project from the config the run saved beside its files (``files/rescale_config.yaml``; None when
    it has none)."""
    found = sorted(glob.glob(os.path.join(folder, "run-*.wandb")))
    if not found:
        raise UserError(f"--wandb_run {folder}: not a W&B run directory (no run-<id>.wandb file in it); give a "
                        "runs/wandb/offline-run-* folder or a run id with --wandb_project")
    run_id = os.path.basename(found[0])[len("run-"):-len(".wandb")]
    try:
        with open(os.path.join(folder, "files", "rescale_config.yaml")) as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return run_id, None
    logger = ((config or {}).get("trainer") or {}).get("logger") if isinstance(config, dict) else None
    init = (logger.get("init_args") or {}) if isinstance(logger, dict) else {}
    project = init.get("project")
    return run_id, project if isinstance(project, str) else None


class StudyOutputs:
    """The files of one command: ``<out>/<stem>.csv|.md|.png``, remembered for W&B and the final
    listing printed to the user. A folder that cannot be written is refused when made, in one
    :class:`UserError` line, before the command does its work."""

    def __init__(self, out: str) -> None:
        require_writable(out, "the output folder", "give --out a folder you can write")
        self.out = out
        self.tables: dict[str, list[dict]] = {}
        self.images: dict[str, str] = {}
        self.files: list[str] = []

    def table(self, name: str, rows: Sequence[dict], columns: Optional[Sequence[str]] = None,
              title: Optional[str] = None) -> None:
        rows = list(rows)
        self.tables[name] = rows
        self.files += write_table(rows, os.path.join(self.out, name), columns, title)

    def figure(self, name: str, fig) -> str:
        path = save_figure(fig, os.path.join(self.out, name + ".png"))
        self.images[name] = path
        self.files.append(path)
        return path

    def finish(self, wandb_run: Optional[str] = None, wandb_project: Optional[str] = None,
               echo: Iterable[str] = ()) -> None:
        """Print the markdown of the tables named in ``echo`` (the command's output), log the files
        written; log to W&B."""
        for name in echo:
            write_output(markdown_table(self.tables[name]))
        if wandb_run:
            run_id = log_to_wandb(wandb_run, self.tables, self.images, wandb_project)
            log.info(f"logged to W&B run {run_id}")
        log.info("wrote " + ", ".join(self.files))
