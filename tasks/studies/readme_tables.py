"""``rescale study tables README.md``: the published tables of a document, copied from the files a
study wrote, never typed by hand.

A block of the document::

    <!-- study-table: docs/studies/digits-depth/depth_grid.md -->
    ... (replaced by that file's content)
    <!-- /study-table -->

names the table file (``<out>/<name>.md`` of ``rescale study ...`` or ``rescale study aggregate``,
relative to the document's folder); the command replaces each block's body with the file's
current content and says which blocks changed. ``--check`` changes nothing and exits 1 when a
block differs from its file (what a test or CI runs, so that a figure edited by hand is caught).
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Optional

from ..common.errors import UserArgumentParser, UserError

__all__ = ["fill_tables", "main"]

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


def main(argv: Optional[list[str]] = None) -> int:
    p = UserArgumentParser(prog="rescale study tables",
                           description="Copy the study tables a document names into it "
                                       "(<!-- study-table: PATH --> ... <!-- /study-table --> blocks).")
    p.add_argument("document", nargs="?", default="README.md", help="default: %(default)s")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs from its file")
    args = p.parse_args(argv)
    if not os.path.isfile(args.document):
        raise UserError(f"document not found: {args.document}")
    with open(args.document, encoding="utf-8") as f:
        text = f.read()
    new, changed, seen = fill_tables(text, os.path.dirname(os.path.abspath(args.document)))
    if args.check:
        for rel in changed:
            print(f"{args.document}: the table from {rel} differs from the file (run rescale study tables)")
        return 1 if changed else 0
    if changed:
        with open(args.document, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{args.document}: {len(seen)} study tables, {len(changed)} updated"
          + (f" ({', '.join(changed)})" if changed else ""))
    return 0
