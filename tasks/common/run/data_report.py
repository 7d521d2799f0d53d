"""Reporting what the data pipeline had to skip (corrupt images, undecodable videos).

Any DataModule exposing a ``skipped_corrupt`` count (files it dropped because they could not be
decoded, with ``skip_corrupt`` on) gets the count logged as ``data/skipped_corrupt`` (summed over
ranks) after every epoch, validation, test and prediction (once a step, at the step the loggers
record that epoch's or validation's own values), and one warning line at the end of the run.

A DataModule that also tells problems apart by kind -- ``data_problems() -> {kind: count}`` and
``problem_files() -> [(path, kind)]``, as the video data does (unreadable, no video stream,
empty, short; repaired short videos too) -- gets ``data/<kind>`` logged at the same moments and,
at the end, the list of problem files written to ``<run dir>/data_problems.tsv`` (``path<TAB>kind``;
the run dir as :func:`~rescale_tasks.common.run.run_directory` finds it) and one warning line
with the counts of the kinds that occurred (:func:`problems_line`; a ``kept_problem_kinds``
attribute names the kinds the module repairs and keeps instead of skipping). Deviation from a plain
sum over ranks: the files are gathered from every rank and counted once each, because two ranks can
meet the same file (other epochs' shards, a DistributedSampler's padding of evaluation sets).

A DataModule listing what its data folders hold but it does not read -- ``unread_files`` (paths:
files of other extensions, hidden files, sub-folders of an image class folder), with the extensions
it does read in ``read_extensions`` -- gets one warning line when its data is set up
(:func:`unread_line`) and the count logged as ``data/unread_files``.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

import lightning.pytorch as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..system import atomic_open, gather_objects
from .outputs import run_directory

__all__ = ["PROBLEMS_FILE", "SkippedDataReport", "problems_line", "unread_line"]

PROBLEMS_FILE = "data_problems.tsv"


def problems_line(problems: dict[str, int], kept_kinds=()) -> str:
    """The end-of-run warning: only the kinds that occurred, with their counts, and what became of
    the files (``kept_kinds``: kinds the data module repairs and keeps, e.g. looped short videos;
    every other kind was skipped), e.g. ``data problems: 3 file(s) (short_loop 1, unreadable 2):
    2 skipped, 1 repaired and kept``."""
    counts = {kind: n for kind, n in sorted(problems.items()) if n}
    kept = sum(n for kind, n in counts.items() if kind in kept_kinds)
    skipped = sum(counts.values()) - kept
    fate = [text for n, text in ((skipped, f"{skipped} skipped"), (kept, f"{kept} repaired and kept")) if n]
    listed = ", ".join(f"{kind} {n}" for kind, n in counts.items())
    return f"data problems: {sum(counts.values())} file(s) ({listed}): {', '.join(fate)}"


#: the kind of Tiny ImageNet's ``<class>/<class>_boxes.txt`` beside its ``<class>/images/`` folder
BOX_ANNOTATIONS = "box annotations"


def _box_annotations(path: str) -> bool:
    """Whether ``path`` is Tiny ImageNet's ``<class>/<class>_boxes.txt`` beside ``<class>/images/``."""
    folder = os.path.dirname(path)
    return (os.path.basename(path) == f"{os.path.basename(folder)}_boxes.txt"
            and os.path.isdir(os.path.join(folder, "images")))


def _unread_kind(path: str, read_extensions: Sequence[str]) -> str:
    """``folder``, ``broken link``, ``hidden``, ``box annotations`` (:func:`_box_annotations`),
    ``<ext> outside a class folder`` (a file of a kind
    that is read, where none is looked for), the lower-case extension, or ``no extension``."""
    if os.path.isdir(path):
        return "folder"
    if os.path.islink(path) and not os.path.exists(path):
        return "broken link"
    name = os.path.basename(path)
    if name.startswith("."):
        return "hidden"
    if _box_annotations(path):
        return BOX_ANNOTATIONS
    extension = os.path.splitext(name)[1].lower()
    if extension and extension in read_extensions:
        return f"{extension} outside a class folder"
    return extension or "no extension"


def unread_line(files: list[str], read_extensions: Sequence[str] = ()) -> str:
    """The warning for entries of the data folders that are not read, with their kinds, where they
    are and what to do, e.g. ``data: 3 file(s) under /data/train were found but not read (.heic 1,
    .txt 1, hidden 1), e.g. /data/train/cat/a.heic; only .jpg/.png files are read: convert them or
    move them out of the data folder``. Tiny ImageNet's ``<class>_boxes.txt`` beside its ``images/``
    folders are counted as its box annotations, with nothing to do about them."""
    counts = Counter(_unread_kind(f, [e.lower() for e in read_extensions]) for f in files)
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
    where = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
    reads = f"only {'/'.join(read_extensions)} files are read" if read_extensions else "they are not data"
    advice = f"{reads}: convert them or move them out of the data folder"
    if counts[BOX_ANNOTATIONS]:
        boxes = "the <class>_boxes.txt files are the dataset's box annotations, which classification does not read"
        advice = boxes if counts[BOX_ANNOTATIONS] == len(files) else \
            f"{boxes}; {reads}: convert the others or move them out of the data folder"
    return f"data: {len(files)} file(s) under {where} were found but not read ({kinds}), e.g. {files[0]}; {advice}"


class SkippedDataReport(L.Callback):
    """Logs and reports the data module's ``skipped_corrupt`` count and, where it has them, its
    problems by kind and the files it does not read (no-op for other modules)."""

    def __init__(self) -> None:
        self.total = 0
        self.problems: dict[str, int] = {}
        self.files: list[tuple[str, str]] = []
        self.unread: list[str] | None = None  # None until reported
        self._logged_step: int | None = None  # the step a fit last logged the counts at

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # the data module has scanned its folders by now (Lightning sets it up before the callbacks)
        unread = getattr(trainer.datamodule, "unread_files", None)
        if unread is None or self.unread is not None:
            return
        self.unread = list(unread)
        if self.unread:
            rank_zero_warn(unread_line(self.unread, getattr(trainer.datamodule, "read_extensions", ())))

    def _count(self, trainer: L.Trainer) -> int | None:
        count = getattr(trainer.datamodule, "skipped_corrupt", None)
        if count is None:
            return None
        total = trainer.strategy.reduce(torch.tensor(float(count)), reduce_op="sum")
        self.total = int(total)
        return self.total

    def _problems(self, trainer: L.Trainer) -> dict[str, int] | None:
        """Problem counts by kind over all ranks, each file counted once (a collective)."""
        datamodule = trainer.datamodule
        if not callable(getattr(datamodule, "data_problems", None)):
            return None
        local = datamodule.data_problems()
        files = datamodule.problem_files() if callable(getattr(datamodule, "problem_files", None)) else None
        if files is None:  # counts only: sum them (every rank takes part with the same kinds)
            kinds = sorted({kind for part in gather_objects([sorted(local)]) for kind in part})
            values = torch.tensor([float(local.get(kind, 0)) for kind in kinds])
            summed = trainer.strategy.reduce(values, reduce_op="sum") if kinds else values
            self.problems = {kind: int(v) for kind, v in zip(kinds, summed.tolist())}
            return self.problems
        gathered = gather_objects([(sorted(local), [tuple(f) for f in files])])
        unique = sorted({f for _, part in gathered for f in part})
        counts = {kind: 0 for kinds, _ in gathered for kind in kinds}
        for _, kind in unique:
            counts[kind] = counts.get(kind, 0) + 1
        self.problems, self.files = dict(sorted(counts.items())), unique
        return self.problems

    def _log(self, trainer: L.Trainer) -> None:
        # on the loggers' step axis: Lightning logs optimizer step k's values (a validation's, an
        # epoch's) at k - 1; once a step (a fit's last validation and its epoch's end come at one)
        step = max(trainer.global_step - 1, 0)
        if trainer.sanity_checking or step == self._logged_step:
            return
        self._logged_step = step if trainer.state.fn == "fit" else None
        metrics = {}
        count = self._count(trainer)
        if count is not None:
            metrics["data/skipped_corrupt"] = float(count)
        if self.unread is not None:
            metrics["data/unread_files"] = float(len(self.unread))
        for kind, n in (self._problems(trainer) or {}).items():
            metrics[f"data/{kind.replace(' ', '_')}"] = float(n)
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.problems and any(self.problems.values()):
            self._report_problems(trainer)
        elif self.total:
            rank_zero_warn(f"skipped {self.total} corrupt input file(s) (data.skip_corrupt is on); "
                           "each was named in a warning when first met")

    def _report_problems(self, trainer: L.Trainer) -> None:
        where = ""
        if trainer.is_global_zero and self.files:
            directories = [d for d in (run_directory(logger) for logger in trainer.loggers) if d]
            directories = directories or ([trainer.default_root_dir] if trainer.default_root_dir else [])
            for directory in directories:
                os.makedirs(directory, exist_ok=True)
                with atomic_open(os.path.join(directory, PROBLEMS_FILE)) as f:
                    f.write("path\tkind\n")
                    f.writelines(f"{path}\t{kind}\n" for path, kind in self.files)
            if directories:
                where = f"; the files are listed in {os.path.join(directories[0], PROBLEMS_FILE)}"
        rank_zero_warn(problems_line(self.problems, getattr(trainer.datamodule, "kept_problem_kinds", ())) + where)
