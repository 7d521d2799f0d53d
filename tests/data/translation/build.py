"""Rebuild the suite's parallel text from the wheels its README names.

    python -m pip download --no-deps -d /tmp/wheels <the wheels the README lists>
    python tests/data/translation/build.py /tmp/wheels/*.whl

Reads every compiled gettext catalogue of each language inside the wheels (no install, nothing
unpacked), keeps the plain single-line pairs (:func:`rescale_tasks.translation.catalogues.parse_mo`),
the first translation of each English string (wheels in name order), and writes them sorted as
``en-<lang>.tsv.xz`` (English, tab, translation; one pair a line) beside this script, with the
wheels' licence texts in ``LICENSES.txt``.
"""
from __future__ import annotations

import lzma
import re
import sys
import zipfile
from pathlib import Path

from rescale_tasks.translation.catalogues import distinct_pairs, parse_mo

HERE = Path(__file__).resolve().parent
LANGUAGES = ("de", "fr")
LICENCE_FILES = ("LICENSE", "LICENSE.rst", "LICENSE.txt")  # not Django's LICENSE.python (code it took from Python)


def catalogues(wheel: zipfile.ZipFile, lang: str) -> list[bytes]:
    """The ``.mo`` files of ``lang`` (``de``, ``de_DE`` ...) in a wheel, in path order."""
    pattern = re.compile(rf"(^|/)locale/{lang}(_[A-Z]{{2}})?/LC_MESSAGES/[^/]+\.mo$")
    return [wheel.read(name) for name in sorted(wheel.namelist()) if pattern.search(name)]


def licences(wheel: zipfile.ZipFile, path: Path) -> str:
    texts = [wheel.read(name).decode("utf-8") for name in sorted(wheel.namelist())
             if ".dist-info/" in name and name.rsplit("/", 1)[-1] in LICENCE_FILES]
    return f"===== {path.name} =====\n\n" + "\n".join(texts)


def main(wheels: list[str]) -> None:
    paths = sorted(Path(w) for w in wheels)
    opened = [zipfile.ZipFile(p) for p in paths]
    for lang in LANGUAGES:
        pairs = distinct_pairs(parse_mo(data) for wheel in opened for data in catalogues(wheel, lang))
        text = "".join(f"{english}\t{translated}\n" for english, translated in pairs)
        (HERE / f"en-{lang}.tsv.xz").write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
        print(f"en-{lang}: {len(pairs)} pairs")
    (HERE / "LICENSES.txt").write_text("\n\n".join(licences(w, p) for w, p in zip(opened, paths)), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
