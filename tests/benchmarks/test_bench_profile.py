"""``python -m benchmarks.profile``: kernel categories and a CPU run of the kernel tables."""
from __future__ import annotations

import pytest

from benchmarks import profile


def test_kernel_names_fall_into_their_categories():
    assert profile.categorize("sm90_xmma_fprop_implicit_gemm_bf16bf16") == "conv/matmul"
    assert profile.categorize("aten::convolution_backward") == "conv/matmul"
    assert profile.categorize("void at::native::bfloat16_copy_kernel_cuda") == "copy/cast"
    assert profile.categorize("batch_norm_collect_statistics_channels_last_kernel") == "reduction"
    assert profile.categorize("vectorized_elementwise_kernel<CUDAFunctor_add>") == "elementwise"
    assert profile.categorize("multi_tensor_apply_kernel") == "optimizer"


def test_cpu_tables_name_every_contender(capsys):
    assert profile.main(["--device", "cpu", "--contenders", "floor (no norm)", "rescale50",
                         "--batch", "1", "--image-size", "32", "--steps", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    summary = out[out.index("per train step"):].splitlines()[2:]
    for name in ("floor (no norm)", "rescale50"):
        (line,) = [row for row in summary if row.startswith(name)]
        wall, kernels, calls = (float(v) for v in line[len(name):].split()[:3])
        assert wall > 0 and kernels > 0 and calls > 0


def test_an_unknown_contender_is_one_error_line_before_any_is_profiled(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        profile.main(["--device", "cpu", "--contenders", "floor (no norm)", "rescale",
                      "--batch", "1", "--image-size", "32", "--steps", "1"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert "==" not in out  # the floor, named first, was not built and profiled before the error
    line = err.strip().splitlines()[-1]
    assert line.startswith("python -m benchmarks.profile: error: --contenders: no 'rescale' in the resnet50 suite")
    assert "'rescale50'" in line


@pytest.mark.parametrize("option", ["--steps", "--batch", "--image-size", "--batch-3d", "--frames", "--image-size-3d",
                                    "--batch-transformer"])
def test_a_size_of_zero_is_refused_before_anything_is_built(capsys, option):
    """``--steps 0`` used to build and warm up a contender, then end in a ZeroDivisionError
    traceback; ``--batch 0`` ran the default batch: one error line naming the option instead."""
    from benchmarks.profile import main

    with pytest.raises(SystemExit) as exit_:
        main([option, "0", "--contenders", "no such contender"])  # (refused after the parse: the size first)
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"python -m benchmarks.profile: error: argument {option}: must be above 0, not 0")
