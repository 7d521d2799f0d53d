"""channels_last and in-place torch.compile switches of the task modules."""
from __future__ import annotations

import pytest
import torch

import rescale_core
from rescale_tasks.common.training import (as_memory_format, compile_in_place, memory_format_of,
                                           use_channels_last)


@pytest.mark.parametrize("name, fmt", [("resnet18", torch.channels_last),
                                       ("resnet3d_18", torch.channels_last_3d)])
def test_channels_last_format_follows_the_network(name, fmt):
    net = rescale_core.create_model(name, scheme="rescale", base_width=8, num_classes=3)
    assert use_channels_last(net) == fmt
    assert net.conv1.weight.is_contiguous(memory_format=fmt)
    x = torch.randn((2, 3, 4, 16, 16) if fmt == torch.channels_last_3d else (2, 3, 16, 16))
    assert as_memory_format(x, fmt).is_contiguous(memory_format=fmt)
    assert as_memory_format(x[:, 0, 0], fmt) is not None  # other ranks pass through unchanged
    assert as_memory_format(x, None) is x


def test_channels_last_refuses_a_network_without_convolutions():
    net = rescale_core.create_model("transformer_tiny", scheme="rescale", src_vocab_size=20)
    with pytest.raises(ValueError, match="no 2D or 3D convolution"):
        memory_format_of(net)


def test_compile_in_place_keeps_the_state_dict_keys():
    net = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3)
    keys = list(net.state_dict())
    compile_in_place(net)
    assert list(net.state_dict()) == keys  # torch.compile(net) would prefix them "_orig_mod."
    assert net._compiled_call_impl is not None
