"""`rescale export` of a tiny rescale Transformer trained a step on real English-German pairs: the encoder
and one incremental decoding step, in every format, checked against the PyTorch model on real token ids;
and `rescale translate` (beam search) computing on the inference plan."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rescale_core.generation import GenerationConfig, best_tokens, generate
from rescale_tasks.cli import main
from rescale_tasks.common.export import FORMATS, capture, max_difference
from rescale_tasks.translation.translate import load_translator

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
                            "exported-program", "--out", "wmt.onnx"])
    assert sorted(written) == sorted(f"wmt.{program}{suffix}" for program in ("encoder", "decode_step")
                                     for suffix in (".onnx", ".pt2"))
    assert max(written.values()) < 1e-4, written


def test_torchscript_is_refused_in_one_line_for_the_decoding_step(trained, handful_root, error_line):
    """A traced decode_step holds the prefix length it was traced at (a search calls it at every
    length, and the file failed at any other with a TorchScript traceback): refused before any file
    is written, naming the formats whose step takes every length."""
    assert main(["export", *run_args(handful_root), "--ckpt_path", str(trained), "--format", "onnx", "torchscript",
                 "--out", "wmt.onnx"]) == 2
    line = error_line()
    assert line.startswith("rescale export --format torchscript: the decode_step is not written as torchscript: a "
                           "search loop calls it at every prefix length"), line
    assert "give --format onnx or exported-program" in line, line
    assert not list(Path().glob("wmt*")) and not list(Path().glob(".export-*"))


def test_torchscript_is_refused_before_any_data_is_read(trained, handful_root, tmp_path, error_line):
    """The refusal comes from the module alone: a training corpus that cannot be read (its two
    sides of different lengths) is never reached, and the checkpoint's weights never loaded."""
    root = tmp_path / "broken"
    root.mkdir()
    for path in (p for p in handful_root.iterdir() if p.is_file()):
        text = path.read_text(encoding="utf-8")
        (root / path.name).write_text(text + "one line more\n" if path.name == "train.en" else text, encoding="utf-8")
    argv = [*run_args(root), "--ckpt_path", str(trained), "--format", "torchscript", "--out", "wmt.onnx"]
    assert main(["export", *argv]) == 2
    assert error_line().startswith("rescale export --format torchscript: the decode_step is not written as torchscript")
    assert main(["export", *argv[:-4], "--format", "exported-program", "--out", "wmt.onnx"]) != 0
    assert "train" in error_line()  # the same corpus, read for another format: refused for what it is


def test_translate_runs_on_the_inference_plan(trained, tmp_path, frozen_calls):
    source = tmp_path / "source.en"
    source.write_text("Open file\nSave the document\n", encoding="utf-8")
    assert main(["translate", "--ckpt_path", str(trained), "--input", str(source), "--output", "out.de",
                 "--max_len_b", "4"]) == 0
    assert len(Path("out.de").read_text(encoding="utf-8").splitlines()) == 2
    assert frozen_calls and {(grad, training) for _, grad, training in frozen_calls} == {(False, False)}


@pytest.mark.parametrize("args, refused", [
    (["--max_len_a", "0", "--max_len_b", "0"], "max_len_a 0.0 and max_len_b 0 allow no token: every translation"),
    (["--len_penalty", "nan"], "len_penalty must be a finite number, got nan"),
    (["--max_len_a", "-1"], "max_len_a and max_len_b must be >= 0, got -1.0"),
], ids=["no-token", "nan-penalty", "negative-length"])
def test_translate_refuses_decoding_settings_that_cannot_decode(args, refused, trained, error_line):
    assert main(["translate", "--ckpt_path", str(trained), *args]) == 2
    line = error_line()
    assert line.startswith(f"rescale translate: {refused}"), line


def exported_greedy(encoder, decode_step, src_tokens: torch.Tensor, module, max_len: int) -> list[list[int]]:
    """Greedy search as a runtime runs it around the exported programs, from bos alone (min_len 1,
    at most ``max_len`` tokens): per sentence its tokens before EOS."""
    config = module.net.config
    memory, src_padding_mask = encoder(src_tokens)
    rows = src_tokens.size(0)
    tokens = torch.full((rows, 1), module.bos_index)
    num_tokens, key_padding = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, 0, dtype=torch.bool)
    free = (config.num_decoder_layers, rows, config.nhead, 1, config.d_model // config.nhead)
    self_k = self_v = torch.zeros(free)
    chosen = []
    for step in range(max_len):
        logits, self_k, self_v = decode_step(tokens, memory, src_padding_mask, num_tokens, key_padding, self_k, self_v)
        num_tokens = num_tokens + tokens[:, 0].ne(module.pad_index)
        key_padding = torch.cat([key_padding, tokens.eq(module.pad_index)], dim=1)
        self_k, self_v = (torch.cat([t, t.new_zeros(free)], dim=3) for t in (self_k, self_v))
        scores = logits[:, -1].log_softmax(dim=-1)
        scores[:, module.pad_index] = -torch.inf
        if step == 0:
            scores[:, module.eos_index] = -torch.inf
        tokens = scores.argmax(dim=-1, keepdim=True)
        chosen.append(tokens)
    out = []
    for row in torch.cat(chosen, dim=1).tolist():
        out.append(row[:row.index(module.eos_index)] if module.eos_index in row else row)
    return out


def test_a_search_runs_the_exported_decoding_step_from_bos_alone(trained, handful_root, tmp_path):
    """The exported decode_step takes every prefix length from 0 (bos alone, no cached keys): greedy
    search around the ExportedProgram read back gives the translations rescale translate computes,
    and the ONNX file's first step matches the PyTorch model's, as does a step captured on target
    prefixes of 2 tokens."""
    module = load_translator(str(trained))
    lines = (handful_root / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    targets = (handful_root / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    pad = torch.nn.utils.rnn.pad_sequence

    def ids(texts: list[str], start: list[int], end: list[int]) -> torch.Tensor:
        rows = [torch.tensor(start + module.processor.encode(t, out_type=int) + end) for t in texts]
        return pad(rows, batch_first=True, padding_value=module.pad_index)

    src = ids(lines, [], [module.eos_index])
    config = GenerationConfig(beam=1, max_len_a=0.0, max_len_b=6)
    expected = [best_tokens(nbest).tolist() for nbest in generate(module.net, src, bos=module.bos_index,
                                                                 eos=module.eos_index, config=config)]
    prev_output_tokens = ids(targets, [module.bos_index], [])
    encoder, step = module.export_programs({"src_tokens": src, "prev_output_tokens": prev_output_tokens})
    captured = {program.name: capture(program.module, program.inputs, program.dynamic_shapes)
                for program in (encoder, step)}
    loaded = {}
    for name, program in captured.items():
        torch.export.save(program, tmp_path / f"{name}.pt2")
        loaded[name] = torch.export.load(tmp_path / f"{name}.pt2").module()
    with torch.no_grad():
        assert exported_greedy(loaded["encoder"], loaded["decode_step"], src, module, 6) == expected
        tokens, memory, src_padding_mask, num_tokens, key_padding, self_k, self_v = step.inputs
        first = (torch.full_like(tokens, module.bos_index), memory, src_padding_mask, torch.zeros_like(num_tokens),
                 key_padding[:, :0], torch.zeros_like(self_k[:, :, :, :1]), torch.zeros_like(self_v[:, :, :, :1]))
        from_onnx = FORMATS["onnx"].save_and_load(captured["decode_step"], first, str(tmp_path / "decode_step.onnx"))
        assert max_difference(from_onnx, step.module(*first)) < 1e-4
        # target prefixes too short to sample a step after 2 tokens: captured all the same
        short = module.export_programs({"src_tokens": src, "prev_output_tokens": prev_output_tokens[:, :2]})[1]
        from_short = capture(short.module, short.inputs, short.dynamic_shapes).module()(*first)
        assert max_difference(from_short, step.module(*first)) < 1e-4


@pytest.mark.parametrize("scheme", ["derf", "dyt", "deepnorm", "tfixup"])
def test_layer_norm_free_schemes_export_in_every_format(scheme, tmp_path, handful_root, fit_checkpoint,
                                                        export_files):
    """Derf's and DyT's pointwise layers (erf with a learned shift, tanh; the final ones included),
    DeepNorm's up-weighted shortcut and T-Fixup's sublayers without any norm, in the encoder and the
    decoding step of every format a search loop can run."""
    args = [*run_args(handful_root), "--model.init_args.scheme", scheme]
    ckpt = fit_checkpoint(tmp_path, [*args, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"])
    written, _ = export_files([*args, "--ckpt_path", str(ckpt), "--format", "onnx", "exported-program",
                               "--out", f"{scheme}.onnx"])
    assert len(written) == 4 and max(written.values()) < 1e-4, written


#: What a runtime outside the suite runs: greedy search over the ONNX encoder and decode_step, with the
#: SentencePiece model and the settings of the sidecar alone (argv: the folder, the sidecar's name, the
#: source file); prints the translations as JSON, and fails if anything of the suite was imported.
GREEDY = '''
import json, os, sys
import numpy as np
import onnxruntime
import sentencepiece

folder, sidecar, source = sys.argv[1:]
meta = json.load(open(os.path.join(folder, sidecar)))
tr = meta["translation"]
spm = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, tr["sentencepiece"]))
sessions = {name: onnxruntime.InferenceSession(os.path.join(folder, program["files"]["onnx"]),
                                               providers=["CPUExecutionProvider"])
            for name, program in meta["programs"].items()}

def run(name, **feeds):
    session = sessions[name]
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})

dec, cache = tr["decoding"], tr["cache"]
out = []
assert tr["no_pieces"] == "empty translation, not decoded", tr["no_pieces"]
for line in open(source, encoding="utf-8").read().splitlines():
    pieces = spm.encode(line, out_type=int)
    if not pieces:
        out.append("")
        continue
    src = pieces[:tr["max_positions"] - 1] + [tr["eos"]]
    memory, src_padding_mask = run("encoder", src_tokens=np.array([src], np.int64))
    max_len = min(int(dec["max_len_a"] * len(src) + dec["max_len_b"]), tr["max_positions"] - 1)
    free = np.zeros((cache["layers"], 1, cache["heads"], 1, cache["head_dim"]), np.float32)
    self_k = self_v = free
    key_padding, token, chosen = np.zeros((1, 0), bool), tr["bos"], []
    for step in range(max_len + 1):
        logits, self_k, self_v = run("decode_step", tokens=np.array([[token]], np.int64), memory=memory,
                                     src_padding_mask=src_padding_mask, num_tokens=np.array([step], np.int64),
                                     key_padding=key_padding, self_k=self_k, self_v=self_v)
        key_padding = np.concatenate([key_padding, np.zeros((1, 1), bool)], axis=1)
        self_k, self_v = (np.concatenate([t, free], axis=3) for t in (self_k, self_v))
        scores = logits[0, -1].astype(np.float64)
        scores[tr["pad"]] = -np.inf
        if step < dec["min_len"]:
            scores[tr["eos"]] = -np.inf
        token = tr["eos"] if step == max_len else int(scores.argmax())
        if token == tr["eos"]:
            break
        chosen.append(token)
    out.append(spm.decode([t for t in chosen if t != tr["bos"]]))
assert not [m for m in sys.modules if m.split(".")[0] in ("rescale_core", "rescale_tasks", "tasks", "torch")]
print(json.dumps(out))
'''


def test_a_runtime_with_the_exported_folder_alone_translates_as_rescale_translate(handful_root, tmp_path,
                                                                                fit_checkpoint, export_files):
    """The export writes ``<name>.json`` and the SentencePiece model beside the encoder and decode_step,
    moved in with them: a script with onnxruntime, sentencepiece and the exported folder alone runs
    greedy search from bos as the sidecar says and gives ``rescale translate --beam 1``'s translations,
    an empty one for a line without a piece (``no_pieces``; searched from eos alone, it came out as words)."""
    import hashlib
    import json
    import subprocess
    import sys

    ckpt = fit_checkpoint(tmp_path, [*run_args(handful_root), "--trainer.max_steps", "60",
                                     "--trainer.limit_val_batches", "0", "--model.init_args.optimizer.init_args.lr",
                                     "0.005", "--model.init_args.lr_scheduler.init_args.warmup_updates", "10"])
    export_files([*run_args(handful_root), "--ckpt_path", str(ckpt), "--format", "onnx", "--out", "deploy/wmt"])
    files = sorted(p.name for p in Path("deploy").iterdir())
    assert files == ["wmt.decode_step.onnx", "wmt.encoder.onnx", "wmt.json", "wmt.spm.model"], files
    meta = json.loads(Path("deploy/wmt.json").read_text())
    tr = meta["translation"]
    assert (meta["task"], meta["scheme"], tr["bos"], tr["pad"], tr["eos"]) == ("translation", "rescale", 0, 1, 2)
    assert tr["sentencepiece_sha256"] == hashlib.sha256(Path("deploy/wmt.spm.model").read_bytes()).hexdigest()
    assert (tr["decoding"]["beam"], tr["decoding"]["max_len_a"], tr["decoding"]["max_len_b"]) == (4, 1.2, 10)
    assert meta["programs"]["decode_step"]["inputs"][5]["free"] == {"1": "tokens[0]", "3": "key_padding[1] + 1"}

    source = tmp_path / "source.en"  # with an empty, a blank and a zero-width line: no piece, an empty translation
    lines = (handful_root / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    source.write_text("\n".join(lines[:2] + ["", "   ", "\u200b"] + lines[2:]) + "\n", encoding="utf-8")
    assert main(["translate", "--ckpt_path", str(ckpt), "--input", str(source), "--output", "out.de",
                 "--beam", "1"]) == 0
    expected = Path("out.de").read_text(encoding="utf-8").splitlines()
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    done = subprocess.run([sys.executable, str(script), "deploy", "wmt.json", str(source)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert expected[2:5] == ["", "", ""] and len(set(expected)) > 2 and all(expected[:2] + expected[5:]), expected
