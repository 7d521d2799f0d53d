"""Where ``rescale export`` writes its files (:func:`export_paths`): ``--out`` with a format's suffix,
or ``.pt`` (as ``--help`` and docs/inference.md say), has it replaced by each format's."""
from __future__ import annotations

import pytest

from rescale_tasks.common.export import export_paths

FORMATS = ["onnx", "exported-program", "torchscript"]


@pytest.mark.parametrize("out", ["net", "net.onnx", "net.pt2", "net.pt", "net.torchscript.pt"])
def test_a_suffix_on_out_becomes_each_formats(out):
    written = export_paths("runs/x/checkpoints/last.ckpt", f"exports/{out}", FORMATS, ["network"])
    assert sorted(written.values()) == ["exports/net.onnx", "exports/net.pt2", "exports/net.torchscript.pt"]


def test_out_naming_the_sidecar_writes_the_files_beside_it():
    """``--out deploy/net.json`` (the sidecar's name) wrote ``deploy/net.json.onnx`` and
    ``deploy/net.json.json``; it names the export ``deploy/net``: ``net.onnx`` beside ``net.json``."""
    from rescale_tasks.common.export.command import export_stem

    written = export_paths("last.ckpt", "deploy/net.json", ["onnx", "exported-program"], ["network"])
    assert sorted(written.values()) == ["deploy/net.onnx", "deploy/net.pt2"]
    assert export_stem("last.ckpt", "deploy/net.json") + ".json" == "deploy/net.json"


def test_a_task_with_several_programs_names_each():
    written = export_paths("last.ckpt", "wmt.pt", ["onnx"], ["encoder", "decode_step"])
    assert sorted(written.values()) == ["wmt.decode_step.onnx", "wmt.encoder.onnx"]


def test_a_remote_checkpoint_without_out_is_one_line_and_with_out_goes_there():
    """A checkpoint in a store (``s3://``, ``memory://``) has no local run folder: its files went to a
    folder named after the URL below the current one (``./memory:/bucket/run/export/``); without
    --out the command now says, in one line, to give one."""
    from rescale_tasks.common.errors import UserError

    with pytest.raises(UserError, match=r"^--ckpt_path memory://bucket/run/checkpoints/last.ckpt is remote: .* "
                                        r"give --out, a local file or folder"):
        export_paths("memory://bucket/run/checkpoints/last.ckpt", None, ["onnx"], ["network"])
    written = export_paths("memory://bucket/run/checkpoints/last.ckpt", "exports/", ["onnx"], ["network"])
    assert list(written.values()) == ["exports/last.onnx"]


@pytest.mark.parametrize("out", ["", "deploy/.onnx"], ids=["empty", "a-suffix-alone"])
def test_an_out_naming_no_file_is_one_line(out):
    """``--out ""`` (an unset shell variable) wrote hidden files named by their suffix alone (``.onnx``,
    ``.json``) in the current folder, and failed with a page of traceback for an ExportedProgram."""
    from rescale_tasks.common.errors import UserError

    with pytest.raises(UserError, match=rf"^--out {out!r} names no file: give a file name"):
        export_paths("runs/x/checkpoints/last.ckpt", out, ["onnx", "exported-program"], ["network"])


# --- moving the files in: all or none ------------------------------------------------------------------

def _staged(tmp_path, names: list[str], text: str):
    staging = tmp_path / "deploy" / ".export-x"
    staging.mkdir(parents=True)
    for name in names:
        (staging / name).write_text(text)
    return staging


def test_a_folder_in_the_way_of_a_file_is_one_line_before_any_file_moves(tmp_path):
    """``deploy/last.json`` a folder: the ExportedProgram and ONNX files were moved over the earlier
    export's, then the sidecar's move failed with a traceback, the folder left holding new files beside
    old ones."""
    from rescale_tasks.common.errors import UserError
    from rescale_tasks.common.export.command import move_in

    deploy = tmp_path / "deploy"
    staging = _staged(tmp_path, ["last.json", "last.onnx", "last.pt2"], "new")
    for name in ("last.onnx", "last.pt2"):
        (deploy / name).write_text("old")
    (deploy / "last.json").mkdir()
    with pytest.raises(UserError, match=r"^cannot write --out .*last\.json: a folder is in the way .* \(no file "
                                        r"written\)$"):
        move_in(str(staging), str(deploy), "--out")
    assert [(deploy / name).read_text() for name in ("last.onnx", "last.pt2")] == ["old", "old"]


def test_a_move_failing_midway_puts_back_what_it_replaced(tmp_path, monkeypatch):
    """A file system failing on the third move (a disk error, a file made a folder meanwhile: what no
    check beforehand can rule out; here ``os.replace`` made to fail): the two files already moved in
    are taken back and the earlier export's put back, one error line says so."""
    import os

    from rescale_tasks.common.errors import UserError
    from rescale_tasks.common.export import command

    deploy = tmp_path / "deploy"
    staging = _staged(tmp_path, ["net.json", "net.onnx", "net.onnx.data"], "new")
    for name in ("net.json", "net.onnx"):  # an earlier export without external data
        (deploy / name).write_text("old")
    calls, replace = [], os.replace

    def failing_midway(src, dst):
        calls.append(dst)
        if len(calls) == 5:  # set aside json, move json, set aside onnx, move onnx, move data: fails
            raise OSError(5, "Input/output error", str(dst))
        return replace(src, dst)

    monkeypatch.setattr(command.os, "replace", failing_midway)
    with pytest.raises(UserError, match=r"^cannot write --out .*net\.onnx\.data: Input/output error; the files "
                                        r"already moved in were taken back"):
        command.move_in(str(staging), str(deploy), "--out")
    assert sorted(p.name for p in deploy.iterdir() if p.is_file()) == ["net.json", "net.onnx"]
    assert [(deploy / name).read_text() for name in ("net.json", "net.onnx")] == ["old", "old"]


def test_the_earlier_external_data_goes_in_the_same_move(tmp_path, monkeypatch):
    """An ONNX file holding its weights moved over one that kept them beside it: the earlier
    ``net.onnx.data`` is set aside with the move (and put back with the rest if a move fails)."""
    import os

    from rescale_tasks.common.errors import UserError
    from rescale_tasks.common.export import command

    deploy = tmp_path / "deploy"
    staging = _staged(tmp_path, ["net.json", "net.onnx"], "new")
    for name in ("net.json", "net.onnx", "net.onnx.data"):
        (deploy / name).write_text("old")
    calls, replace = [], os.replace

    def failing_last(src, dst):
        calls.append(dst)
        if len(calls) == 5:  # set aside json, move json, set aside onnx, move onnx, set aside data: fails
            raise OSError(5, "Input/output error", str(dst))
        return replace(src, dst)

    stale = command.earlier_files(str(deploy), "net", sorted(os.listdir(staging)))
    assert stale == ["net.onnx.data"]
    monkeypatch.setattr(command.os, "replace", failing_last)
    with pytest.raises(UserError, match=r"^cannot write --out .*net\.onnx\.data: Input/output error"):
        command.move_in(str(staging), str(deploy), "--out", stale)
    assert {p.name: p.read_text() for p in deploy.iterdir() if p.is_file()} == {"net.json": "old", "net.onnx": "old",
                                                                                 "net.onnx.data": "old"}
    monkeypatch.setattr(command.os, "replace", replace)
    command.move_in(str(staging), str(deploy), "--out", stale)
    assert {p.name: p.read_text() for p in deploy.iterdir() if p.is_file()} == {"net.json": "new", "net.onnx": "new"}


def test_the_earlier_exports_files_its_sidecar_lists_are_found_and_nothing_else(tmp_path):
    """What an earlier export at the stem wrote and the new one does not (a format, a program, a
    tokenizer): from its sidecar, this stem's files only, never a rejected file or another stem's."""
    import json

    from rescale_tasks.common.export.command import earlier_files

    sidecar = {"rescale_export": 1, "translation": {"sentencepiece": "net.spm.model"},
               "programs": {"encoder": {"files": {"onnx": "net.encoder.onnx", "exported-program": "net.encoder.pt2"},
                                        "data_files": {"onnx": "net.encoder.onnx.data"}},
                            "decode_step": {"files": {"onnx": "../elsewhere.onnx", "torchscript": "other.pt"}}}}
    (tmp_path / "net.json").write_text(json.dumps(sidecar))
    for name in ("net.encoder.onnx", "net.encoder.onnx.data", "net.encoder.pt2", "net.spm.model", "other.pt",
                 "net.rejected.onnx", "net.onnx.data"):
        (tmp_path / name).write_text("earlier")
    assert earlier_files(str(tmp_path), "net", ["net.json", "net.onnx", "net.pt2"]) == [
        "net.encoder.onnx", "net.encoder.onnx.data", "net.encoder.pt2", "net.onnx.data", "net.spm.model"]
    assert earlier_files(str(tmp_path), "net", ["net.json", "net.encoder.pt2"]) == [
        "net.encoder.onnx", "net.encoder.onnx.data", "net.spm.model"]
    (tmp_path / "net.json").write_text("{not json")
    assert earlier_files(str(tmp_path), "net", ["net.json", "net.onnx"]) == ["net.onnx.data"]


def test_the_package_names_every_public_name_of_programs():
    from rescale_tasks.common import export
    from rescale_tasks.common.export import programs

    assert set(programs.__all__) <= set(export.__all__)
    assert all(getattr(export, name) is getattr(programs, name) for name in programs.__all__)

