"""Every registered conv/VGG model under every scheme its family supports (Transformers have
their own file): forward/backward at init, every parameter moves in 3 SGD steps, state-dict
round trip. The checks live in ``tests/core/conftest.py`` (the ``harness`` fixture)."""


def test_forward_backward_at_init(model_case, harness):
    harness.forward_backward_at_init(*model_case)


def test_three_sgd_steps_change_every_parameter(model_case, harness):
    harness.sgd_steps_change_every_parameter(*model_case)


def test_state_dict_round_trip(model_case, harness):
    harness.state_dict_round_trip(*model_case)
