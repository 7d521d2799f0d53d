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


def test_a_checkpoint_of_gains_per_sublayer_is_refused_in_one_line_where_they_are_shared():
    """A rezero checkpoint written when each sublayer had its own gain (now: one per Transformer
    layer) would load as one sublayer's gain, the others' dropped: one line says what it is, and
    how to load it as the skipinit network it is; an equal pair loads."""
    from rescale_tasks.translation.module import TranslationModule

    def translation(**options) -> TranslationModule:
        torch.manual_seed(0)
        return TranslationModule("transformer_tiny", scheme="rezero", scheme_options=options or None,
                                 vocab_size=30, pad_index=1, bos_index=0, eos_index=2)

    shared, apart = translation(), translation(layer_gain=False)
    saved = checkpoint_of(apart)
    saved["hyper_parameters"]["scheme_options"] = None  # as rezero recorded it before layer_gain
    shared.on_load_checkpoint(saved)  # the gains all 0: equal, nothing is lost
    saved["state_dict"]["net.decoder.layers.1.ffn.merge.gain.weight"] = torch.tensor([0.25])
    with pytest.raises(ConfigError, match=r"net\.decoder\.layers\.1\.self_attn\.merge\.gain\.weight and "
                                          r"net\.decoder\.layers\.1\.ffn\.merge\.gain\.weight are one tensor here but "
                                          r"differ in the checkpoint, which holds one gain per sublayer.*"
                                          r"\['scheme'\] = 'skipinit'") as err:
        shared.on_load_checkpoint(saved)
    assert "\n" not in str(err.value)
    assert state_dict_differences({"a": torch.ones(2), "b": torch.zeros(2)},
                                  dict.fromkeys("ab", torch.ones(2))) == [
        "a and b are one tensor here but differ in the checkpoint, which holds the two apart, where this "
        "network ties them"]
