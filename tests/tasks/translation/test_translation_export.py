"""`rescale export` of a tiny rescale Transformer trained a step on real English-German pairs: the encoder
and one incremental decoding step, in every format, checked against the PyTorch model on real token ids;
and `rescale translate` (beam search) computing on the inference plan."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main

pytestmark = pytest.mark.usefixtures("offline_in_tmp")

REPO = Path(__file__).resolve().parents[3]
# one encoder and one decoder layer, 32 wide: a step in a fraction of a second
NETWORK = ("{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, dim_feedforward: 64, "
           "num_encoder_layers: 1, num_decoder_layers: 1}")


def run_args(root: Path) -> list[str]:
    overrides = {"model.init_args.network": "transformer_tiny", "model.init_args.network_options": NETWORK,
                 "data.init_args.root": str(root), "data.init_args.vocab_size": "100",
                 "data.init_args.max_tokens": "200", "data.init_args.num_workers": "0",
                 "trainer.accelerator": "cpu", "trainer.devices": "1", "trainer.precision": "32-true",
                 "trainer.logger": "false", "trainer.enable_progress_bar": "false"}
    return ["--config", str(REPO / "experiments/wmt/rescale6.yaml"),
            *[a for key, value in overrides.items() for a in (f"--{key}", value)]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, handful_root, fit_checkpoint) -> Path:
    folder = tmp_path_factory.mktemp("translation_export")
    return fit_checkpoint(folder, [*run_args(handful_root), "--trainer.max_steps", "1",
                                   "--trainer.limit_val_batches", "0"])


def test_the_encoder_and_one_decoding_step_export_and_match_pytorch(trained, handful_root, export_files):
    written, _ = export_files([*run_args(handful_root), "--ckpt_path", str(trained), "--format", "onnx",
                            "exported-program", "torchscript", "--out", "wmt.onnx"])
    assert sorted(written) == sorted(f"wmt.{program}{suffix}" for program in ("encoder", "decode_step")
                                     for suffix in (".onnx", ".pt2", ".torchscript.pt"))
    assert max(written.values()) < 1e-4, written


def test_translate_runs_on_the_inference_plan(trained, tmp_path, frozen_calls):
    source = tmp_path / "source.en"
    source.write_text("Open file\nSave the document\n", encoding="utf-8")
    assert main(["translate", "--ckpt_path", str(trained), "--input", str(source), "--output", "out.de",
                 "--max_len_b", "4"]) == 0
    assert len(Path("out.de").read_text(encoding="utf-8").splitlines()) == 2
    assert frozen_calls and {(grad, training) for _, grad, training in frozen_calls} == {(False, False)}


@pytest.mark.parametrize("scheme", ["derf", "dyt", "deepnorm", "tfixup"])
def test_layer_norm_free_schemes_export_in_every_format(scheme, tmp_path, handful_root, fit_checkpoint,
                                                        export_files):
    """Derf's and DyT's pointwise layers (erf with a learned shift, tanh; the final ones included),
    DeepNorm's up-weighted shortcut and T-Fixup's sublayers without any norm, in the encoder and the
    decoding step of every format."""
    args = [*run_args(handful_root), "--model.init_args.scheme", scheme]
    ckpt = fit_checkpoint(tmp_path, [*args, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"])
    written, _ = export_files([*args, "--ckpt_path", str(ckpt), "--format", "onnx", "exported-program",
                               "torchscript", "--out", f"{scheme}.onnx"])
    assert len(written) == 6 and max(written.values()) < 1e-4, written
