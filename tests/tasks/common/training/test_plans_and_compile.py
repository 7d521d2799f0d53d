"""``model.init_args.plan``, ``compile``, ``compile_mode`` and ``compile_options`` of every task
module: the plan reaches the network, a bad plan is one line, a checkpoint saved by a
compiled module loads into an eager one and back, and a compiled lean run under 2-process DDP
(gloo), with adaptive gradient clipping, trains as one process does."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import rescale_core
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
from rescale_tasks.detection.module import DetectionModule
from rescale_tasks.translation.module import TranslationModule
from rescale_tasks.video.module import VideoClassificationModule

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("make", [
    lambda plan: ClassificationModule("resnet18", "rescale", network_options={"base_width": 4}, num_classes=3, plan=plan),
    lambda plan: VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 4}, num_classes=3,
                                           plan=plan),
    lambda plan: TranslationModule("transformer_tiny", "rescale", vocab_size=40, plan=plan),
    lambda plan: DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, num_classes=3,
                                 backbone_checkpoint=None, plan=plan),
], ids=["classification", "video", "translation", "detection"])
def test_every_task_takes_a_plan(make):
    module = make("lean")
    planned = [m for m in module.net.modules() if isinstance(getattr(m, "fused", None), bool)]
    assert planned and {m.plan for m in planned} == {"lean"}
    assert rescale_core.plan_of(make("reference").net) == "reference"


def test_an_unknown_plan_is_one_line(tmp_path, run_config, error_line):
    config = run_config(tmp_path / "bad.yaml", model={"init_args": {"plan": "fast"}})
    assert main(["fit", "--config", config]) == 2
    message = error_line()
    assert "plan='fast'" in message and "auto, lean, folded, reference" in message


def _module(**kw) -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule("cifar_resnet", scheme="rescale", num_classes=10, in_channels=1,
                                network_options={"depth": 8, "base_width": 8},
                                scheme_options={"measure_batches": 1}, **kw)


def test_a_compiled_checkpoint_loads_eager_and_back(tmp_path):
    """Train compiled (lean plan, AOT autograd), save; an eager module on another plan loads the
    state and computes the same; the compiled module loads the eager one's state back."""
    import lightning.pytorch as L

    from rescale_tasks.classification.data import DigitsDataModule

    torch._dynamo.reset()
    compiled = _module(compile=True, plan="lean", compile_options={"backend": "aot_eager"},
                       optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
                        enable_model_summary=False)
    trainer.fit(compiled, DigitsDataModule(batch_size=32))
    assert compiled.net._compiled_call_impl is not None
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")
    state = torch.load(tmp_path / "compiled.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    eager = _module(plan="folded")
    assert set(state) == set(eager.state_dict())
    eager.load_state_dict(state)
    assert not any(m.measuring for m in rescale_core.mean_shift_layers(eager))
    x = torch.randn(4, 1, 8, 8)
    compiled.eval(), eager.eval()
    with torch.no_grad():
        want = eager(x)
        torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-6)
        for p in compiled.parameters():
            p.add_(1.0)  # moved away, then loaded back from the eager module
        compiled.load_state_dict(eager.state_dict())
        torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.ddp
def test_compiled_lean_training_under_two_process_ddp(tmp_path, monkeypatch, run_config, rescale_processes):
    """``rescale fit`` compiled on the lean plan with 2 processes (gloo), 64 images each: both
    ranks measure eagerly (the statistics averaged over the ranks), then train compiled (Dynamo
    captured the network in each process, breaking the graph only where measuring runs eagerly,
    and never recompiling), and end with the weights of one eager process given the global batch
    of 128; the checkpoint has the plain module's keys and finished measuring. Both runs clip
    their gradients with AGC (``agc_clip``), which is not linear in them: the ranks agree with
    the one process only if each clips the all-reduced gradients, as the one process clips its
    batch's."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    init_args = {"plan": "lean", "scheme_options": {"measure_batches": 1}, "agc_clip": 0.01,
                 "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05}}}
    probe = {"class_path": "compile_probe.SaveCompileState", "init_args": {"folder": str(tmp_path / "state")}}
    trainer = {"max_steps": 3, "limit_train_batches": 3, "limit_val_batches": 0}
    config = run_config(tmp_path / "compiled.yaml",
                        model={"init_args": {**init_args, "compile": True, "compile_options": {"backend": "aot_eager"}}},
                        trainer={**trainer, "default_root_dir": str(tmp_path / "ddp"), "callbacks": [probe]})
    done = rescale_processes(["fit", "--config", config], 2)
    assert "recompile" not in done.stderr.lower()
    ranks = [torch.load(tmp_path / "state" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["global_step"] == 3
        # the only breaks: the measuring steps, run eagerly by design (a torch.compiler.disable'd call)
        assert rank["compiled"] and rank["graphs"] >= 1, rank["graphs"]
        assert all("torch.compiler.disable" in reason for reason in rank["graph_breaks"]), rank["graph_breaks"]
    [ckpt] = sorted((tmp_path / "ddp").rglob("last.ckpt"))
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert trained["global_step"] == 3
    plain = _module(plan="folded")
    plain.load_state_dict(trained["state_dict"])
    assert not any(m.measuring for m in rescale_core.mean_shift_layers(plain.net))

    one = run_config(tmp_path / "one.yaml", model={"init_args": init_args}, data={"init_args": {"batch_size": 128}},
                     trainer={**trainer, "default_root_dir": str(tmp_path / "one")})
    assert main(["fit", "--config", one]) == 0
    [ckpt] = sorted((tmp_path / "one").rglob("last.ckpt"))
    single = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    weights = ranks[0]["state_dict"]
    assert set(weights) == set(single) == set(trained["state_dict"])
    initial = run_lightning(["fit", "--config", one], run=False).model.state_dict()  # the run's seed, untrained
    moved = max((weights[k] - initial[k]).abs().max().item() for k in weights if k.endswith("weight"))
    for key in weights:
        torch.testing.assert_close(weights[key], ranks[1]["state_dict"][key], rtol=0, atol=0)
        torch.testing.assert_close(weights[key], single[key], rtol=1e-5, atol=1e-6, msg=key)
    assert moved > 1e-3
