"""``rescale study tables docs/studies.md``: the published tables of a document, copied from the
files a study wrote, never typed by hand.

A block of the document::

    <!-- study-table: studies/digits-depth/depth_grid.md -->
    ... (replaced by that file's content)
    <!-- /study-table -->

names the table file (``<out>/<name>.md`` of ``rescale study ...`` or ``rescale study aggregate``,
relative to the document's folder); the command replaces each block's body with the file's
current content and says which blocks changed. ``--check`` changes nothing and exits 1 when a
block differs from its file (what a test or CI runs, so that a figure edited by hand is caught).
"""
from __future__ import annotations

import logging
import os
import re

from ..common.errors import UserError
from ..common.system import write_atomically

__all__ = ["fill_tables", "update_document"]

log = logging.getLogger(__name__)

_BLOCK = re.compile(r"(<!-- study-table: (?P<path>[^>]+?) -->\n)(?P<body>.*?)(<!-- /study-table -->)", re.S)


def fill_tables(text: str, root: str) -> tuple[str, list[str], list[str]]:
    """``text`` with every study-table block's body replaced by its file's content (paths relative
    to ``root``); the paths of the blocks that changed, and of all blocks."""
    changed, seen = [], []

    def replace(match: re.Match) -> str:
        rel = match.group("path").strip()
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            raise UserError(f"study table {rel} (named in the document) not found under {root}: "
                            "run the study command shown above the block, or rescale study aggregate")
        with open(path, encoding="utf-8") as f:
            body = f.read()
        body = body if body.endswith("\n") else body + "\n"
        seen.append(rel)
        if body != match.group("body"):
            changed.append(rel)
        return match.group(1) + body + match.group(4)

    return _BLOCK.sub(replace, text), changed, seen


def update_document(document: str, check: bool = False) -> int:
    """Fill (or, with ``check``, compare) the study tables of ``document``; the exit status: 1 when
    ``check`` finds a table that differs from its file, else 0."""
    if not os.path.isfile(document):
        raise UserError(f"document not found: {document}")
    with open(document, encoding="utf-8") as f:
        text = f.read()
    new, changed, seen = fill_tables(text, os.path.dirname(os.path.abspath(document)))
    if check:
        for rel in changed:
            log.info(f"{document}: the table from {rel} differs from the file (run rescale study tables)")
        if not changed:
            log.info(f"{document}: {len(seen)} study tables, all equal to their files")
        return 1 if changed else 0
    if changed:
        write_atomically(document, new)
    log.info(f"{document}: {len(seen)} study tables, {len(changed)} updated"
             + (f" ({', '.join(changed)})" if changed else ""))
    return 0
