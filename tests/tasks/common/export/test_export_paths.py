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
