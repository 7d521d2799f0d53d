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
