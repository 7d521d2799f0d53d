"""The shared checkpoint/architecture comparison (used by every task's on_load_checkpoint)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.checkpoints import (check_checkpoint_compatible, hparam_differences, load_into_module,
                                              state_dict_differences)
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import resolved_architecture


def tiny(scheme="rescale", depth=8, num_classes=10, in_channels=1) -> ClassificationModule:
    return ClassificationModule("cifar_resnet", scheme=scheme, network_options={"depth": depth, "base_width": 4},
                                num_classes=num_classes, in_channels=in_channels)


def checkpoint_of(module: nn.Module) -> dict:
    return {"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}


def test_same_architecture_passes_and_unset_equals_empty():
    a, b = tiny(), tiny()
    b.on_load_checkpoint(checkpoint_of(a))
    assert hparam_differences({"scheme_options": None}, {"scheme_options": {}}) == []
    assert hparam_differences({"network": "x"}, {"scheme": "y"}) == []  # only keys both sides have


def test_default_scheme_compares_equal_to_its_name():
    saved = {"network": "cifar_resnet", "scheme": None}
    assert hparam_differences(resolved_architecture(saved), resolved_architecture({**saved, "scheme": "bn"})) == []
    assert hparam_differences(resolved_architecture({"network": "rescale50", "scheme": None}),
                              {"network": "rescale50", "scheme": "rescale"}) == []
    assert hparam_differences(resolved_architecture(saved), {**saved, "scheme": "rescale"}) == ["scheme"]


@pytest.mark.parametrize("other,differ", [
    (dict(scheme="bn"), "scheme"),
    (dict(depth=14), "network_options"),
    (dict(num_classes=7), "num_classes"),
])
def test_module_refuses_a_checkpoint_of_another_architecture(other, differ):
    with pytest.raises(ConfigError) as err:
        tiny(**other).on_load_checkpoint(checkpoint_of(tiny()))
    message = str(err.value)
    assert "\n" not in message and f"(they differ in {differ})" in message
    assert message.startswith("the checkpoint was saved from network=cifar_resnet, scheme=rescale")


def test_state_dict_shapes_and_keys_without_hyper_parameters():
    saved = {"state_dict": {"fc.weight": torch.zeros(10, 4), "fc.bias": torch.zeros(10), "old": torch.zeros(1)}}
    current = {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3), "new.weight": torch.zeros(2)}
    problems = state_dict_differences(saved["state_dict"], current, limit=1)
    assert problems[0] == "fc.weight has shape (10, 4) in the checkpoint but (3, 4) here"
    assert "1 more shape mismatches" in problems
    assert "1 entries missing from the checkpoint: new.weight" in problems
    assert "1 entries not in this network: old" in problems
    assert state_dict_differences(saved["state_dict"], current, strict=False, limit=5) == [
        "fc.weight has shape (10, 4) in the checkpoint but (3, 4) here",
        "fc.bias has shape (10,) in the checkpoint but (3,) here"]
    with pytest.raises(ConfigError) as err:
        check_checkpoint_compatible(saved, {}, current, source="checkpoint x.ckpt")
    assert str(err.value).startswith("checkpoint x.ckpt does not fit this run's network: fc.weight has shape")


def test_training_only_scheme_options_differ_for_evaluation_not_for_a_resume():
    """Dropout and stochastic depth are the identity at evaluation: a checkpoint trained with them is
    evaluated under a config without them; a resume (and any option that changes weights) refuses."""
    trained = ClassificationModule("cifar_resnet", scheme="nf", network_options={"depth": 8, "base_width": 4},
                                   num_classes=10, in_channels=1,
                                   scheme_options={"stochdepth_rate": 0.3, "classifier_dropout": 0.2})
    plain = ClassificationModule("cifar_resnet", scheme="nf", network_options={"depth": 8, "base_width": 4},
                                 num_classes=10, in_channels=1)
    checkpoint = checkpoint_of(trained)
    check_checkpoint_compatible(checkpoint, plain.hparams, plain.state_dict(), evaluating=True)
    assert load_into_module(plain, checkpoint, "checkpoint x.ckpt") == 0
    with pytest.raises(ConfigError) as err:
        check_checkpoint_compatible(checkpoint, plain.hparams, plain.state_dict(), source="checkpoint x.ckpt")
    message = str(err.value)
    assert "\n" not in message and "classifier_dropout=0.2->None, stochdepth_rate=0.3->None" in message
    assert "resuming with it would change the run's training" in message
    other = {**plain.hparams, "scheme_options": {"stochdepth_rate": 0.3, "c": 0.5}}
    with pytest.raises(ConfigError, match=r"\(they differ in scheme_options\)"):
        check_checkpoint_compatible(checkpoint, other, evaluating=True)


def test_the_cli_check_lets_an_evaluation_differ_in_training_only_options(tmp_path):
    """The check the CLI runs before parsing (validate/test/predict/export: ``evaluating``; fit: not)."""
    from rescale_tasks.common.checkpoints import check_config_against_checkpoint

    path = tmp_path / "last.ckpt"
    saved = {"network": "cifar_resnet", "scheme": "nf", "scheme_options": {"stochdepth_rate": 0.3}}
    torch.save({"hyper_parameters": saved, "state_dict": {}}, path)
    config = {"class_path": None, "init_args": {"network": "cifar_resnet", "scheme": "nf", "scheme_options": None}}
    check_config_against_checkpoint(config, str(path), evaluating=True)
    with pytest.raises(ConfigError, match="stochdepth_rate=0.3->None"):
        check_config_against_checkpoint(config, str(path))
    config["init_args"]["scheme_options"] = {"c": 0.5}
    with pytest.raises(ConfigError, match=r"\(they differ in scheme_options\)"):
        check_config_against_checkpoint(config, str(path), evaluating=True)
