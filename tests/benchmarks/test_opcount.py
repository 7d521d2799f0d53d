"""Ops launched per eager train step (``benchmarks.opcount``): what the lean execution plan
(``rescale_core.plans``) is for; and per eval forward: what the frozen inference plan is for. The
counts are deterministic (the same ops for the same network structure), so they are asserted:
against the family's no-normalization floor, its normalized baseline and the folded plan, and
per added residual block."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks import opcount
from benchmarks.opcount import FAMILIES, count_contender


@pytest.fixture(scope="module")
def counts():
    """{(family, scheme, plan): train launches} for the families and schemes asserted below."""
    out = {}
    for family in ("ResNet-50", "ResNet-18", "R3D-18 (3D)", "VGG-11", "Transformer"):
        for c in opcount.op_counts([family], plans=("folded", "lean"), schemes=["rescale", "skipinit", "fixup"]):
            key = (family, c.name if c.role == "scheme" else c.role, c.plan if c.role == "scheme" else "-")
            out[key] = c.train.launches
    return out


# (family, scheme): the most launches the lean plan may take per train step, as a multiple of
# the floor's (measured: rescale50 1.42, skipinit50 1.10, fixup50 1.49; ResNet-18 1.46 / 1.13 /
# 1.52; R3D-18 1.56 (CPU autocast pools 3D in float32, four casts a shortcut) / 1.13 / 1.52;
# VGG-11 1.11; Transformer rescale 1.17, skipinit 1.13)
LEAN_BOUNDS = {
    ("ResNet-50", "rescale"): 1.43, ("ResNet-50", "skipinit"): 1.11, ("ResNet-50", "fixup"): 1.50,
    ("ResNet-18", "rescale"): 1.47, ("ResNet-18", "skipinit"): 1.14, ("ResNet-18", "fixup"): 1.53,
    ("R3D-18 (3D)", "rescale"): 1.57, ("R3D-18 (3D)", "skipinit"): 1.14, ("R3D-18 (3D)", "fixup"): 1.53,
    ("VGG-11", "rescale"): 1.12,
    ("Transformer", "rescale"): 1.18, ("Transformer", "skipinit"): 1.14,
}


@pytest.mark.parametrize("family, scheme", list(LEAN_BOUNDS), ids=[f"{f}-{s}" for f, s in LEAN_BOUNDS])
def test_lean_plan_launches_fewer_ops(counts, family, scheme):
    train = counts
    lean, folded = train[(family, scheme, "lean")], train[(family, scheme, "folded")]
    floor, base = train[(family, "floor", "-")], train[(family, "baseline", "-")]
    assert lean < folded, (family, scheme, lean, folded)
    assert lean <= LEAN_BOUNDS[(family, scheme)] * floor, (family, scheme, lean, floor)
    if family == "Transformer":
        # a learnable gain per sublayer needs two backward ops (df, ds), LayerNorm two in all
        assert lean <= 1.13 * base, (family, scheme, lean, base)
    elif scheme == "skipinit" or (family, scheme) == ("ResNet-50", "rescale"):
        assert lean < base, (family, scheme, lean, base)  # below BatchNorm


def test_lean_terms_cost_the_same_whatever_the_depth():
    """Every offset and gain of the network comes from one pass (LeanTerms): an added
    bottleneck block costs its convolutions and ReLUs (as in the floor) plus a fixed number of
    activation-sized ops (3 offset adds and their 3 gradient sums, the merge's 2 backward ops),
    with no per-layer subtraction, multiplication or cast of parameters."""
    fam = FAMILIES["ResNet-50"]

    def launches(arch: str, scheme: str) -> int:
        deep = opcount.Family(fam.name, opcount._conv(arch, base_width=8), fam.make_batch, "bn",
                              ("none", None), ())
        return count_contender(deep, scheme, None, "lean").train.launches

    extra_blocks = 23 - 6  # resnet101 has 17 more bottleneck blocks than resnet50 (stage 3)
    floor_per_block = (launches("resnet101", "none") - launches("resnet50", "none")) / extra_blocks
    rescale_per_block = (launches("resnet101", "rescale") - launches("resnet50", "rescale")) / extra_blocks
    assert floor_per_block == int(floor_per_block)
    assert rescale_per_block == floor_per_block + 8


def test_auto_plan_is_folded_on_the_cpu_and_counts_views_apart():
    fam = FAMILIES["ResNet-18"]
    auto = count_contender(fam, "rescale", None, "auto")
    folded = count_contender(fam, "rescale", None, "folded")
    assert auto.train.launches == folded.train.launches
    assert auto.train.dispatches > auto.train.launches  # views and allocations are counted apart
    counter = opcount.OpCounter()
    with counter:
        x = torch.ones(4)
        x.view(2, 2)
        torch.empty(3)
        x + 1
    assert (counter.launches, counter.by_op["aten.add.Tensor"]) == (2, 1)  # ones, add


def test_opcount_command_prints_the_table(capsys):
    assert opcount.main(["--families", "VGG-11", "--plans", "lean"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["family", "contender", "plan"]
    rows = [line for line in lines[1:] if line.startswith("VGG-11")]
    assert len(rows) == 3 and any("lean" in r for r in rows)


def test_measuring_step_is_counted_for_rescale():
    c = count_contender(FAMILIES["VGG-11"], "rescale", None, "lean")
    assert c.measuring is not None and c.measuring.launches > c.train.launches
    assert count_contender(FAMILIES["VGG-11"], "none", None, "lean").measuring is None


# --------------------------------------------------------------- adaptive gradient clipping
def test_agc_launches_grow_with_the_unit_sizes_not_the_parameters():
    """One AGC call on RescaleNet-50's clipped parameters (all but the classifier): a gather, a norm
    and a scaling per unit size, six ops of clipping factors and one foreach copy back; timm's
    loop launches about ten per parameter. Against the lean train step: under a tenth."""
    fam = FAMILIES["ResNet-50"]
    agc = opcount.count_agc(fam, "rescale")
    assert agc.launches == 2 * agc.unit_sizes + 9 and agc.unit_sizes <= 16
    assert agc.timm >= 9 * agc.parameters > 30 * agc.launches
    train = count_contender(fam, "rescale", None, "lean")
    columns, rows = opcount.agc_table([agc], [train])
    assert rows[0][:2] == ["ResNet-50", "rescale"] and float(rows[0][columns.index("x lean train step")]) < 0.1
    counter = opcount.WriteCounter()
    with counter:
        torch._foreach_mul_([torch.ones(2)], 2.0)
    assert counter.launches == 2  # ones, and the in-place foreach op OpCounter leaves out


# --------------------------------------------------------------- eval forwards: the frozen plan
@pytest.fixture(scope="module")
def evals():
    """{(family, scheme or role): EvalCount} under bf16 autocast and channels_last."""
    out = {}
    for c in opcount.eval_counts(["ResNet-50", "R3D-18 (3D)", "VGG-11", "Transformer"]):
        out[(c.family, c.name if c.role == "scheme" else c.role)] = c
    return out


# The only ops a frozen network launches above its floor's: RescaleNet's projection shortcuts
# average-pool before their 1x1 convolution where the floor's strides (3 in these ResNets), and
# VGG's mean-shift offset on the input image, which meets a zero-padded convolution (1).
ABOVE_FLOOR = {("ResNet-50", "rescale"): 3, ("R3D-18 (3D)", "rescale"): 3, ("VGG-11", "rescale"): 1}
EVAL_CASES = [(f, s) for f, schemes in (("ResNet-50", ("rescale", "fixup", "skipinit", "rezero")),
                                        ("R3D-18 (3D)", ("rescale", "fixup", "skipinit", "rezero")),
                                        ("VGG-11", ("rescale",)),
                                        ("Transformer", ("rescale", "rezero", "skipinit"))) for s in schemes]


@pytest.mark.parametrize("family, scheme", EVAL_CASES, ids=[f"{f}-{s}" for f, s in EVAL_CASES])
def test_frozen_eval_launches_a_plain_networks_ops(evals, family, scheme):
    """Evaluation launches the floor's ops (plus the architecture's own pools), below the BN /
    post-LN baseline (a norm per layer) and below the training plans evaluating; at most 1.05x
    the floor, except R3D-18's RescaleNet: its three pooled shortcuts are 3 of its floor's 47."""
    c = evals[(family, scheme)]
    floor, base = evals[(family, "floor")].frozen.launches, evals[(family, "baseline")].frozen.launches
    assert c.frozen.launches == floor + ABOVE_FLOOR.get((family, scheme), 0), (family, scheme, c.frozen.launches)
    assert c.frozen.launches < base and c.frozen.launches < c.before.launches
    bound = 1.07 if (family, scheme) == ("R3D-18 (3D)", "rescale") else 1.05
    assert c.frozen.launches <= bound * floor
    assert evals[(family, "floor")].before.launches == floor  # nothing to fold in the floor


@pytest.mark.parametrize("family", ["ResNet-50", "R3D-18 (3D)"])
def test_frozen_eval_of_nf_networks_standardizes_no_weight(evals, family):
    """NF-ResNets evaluate at RescaleNet's launches and casts (the floor's, plus the average pools
    of the three projection shortcuts): each Scaled WS convolution's weight is standardized once,
    when the plan freezes, so evaluation launches no standardization (a batch-norm over the
    weight, one per convolution on the training plan evaluating, frozen plan off)."""
    c = opcount.count_eval(FAMILIES[family], "nf")
    rescale, floor, bn = (evals[(family, k)] for k in ("rescale", "floor", "baseline"))
    assert c.frozen.launches == rescale.frozen.launches == floor.frozen.launches + 3
    assert (c.frozen_no_grad.kernels, c.frozen_no_grad.casts) == (rescale.frozen_no_grad.kernels,
                                                                 rescale.frozen_no_grad.casts)
    assert c.frozen.launches < bn.frozen.launches and c.frozen.launches < c.before.launches
    convs = sum(n for op, n in c.frozen_no_grad.by_kernel.items() if "convolution" in op)
    assert not any("batch_norm" in op for op in c.frozen_no_grad.by_kernel)
    assert sum(n for op, n in c.before_no_grad.by_kernel.items() if "batch_norm" in op) == convs


def test_frozen_eval_in_float32_on_the_cpu_default():
    """float32 on contiguous tensors (the CPU default): RescaleNet-50 from 316 launches to the
    floor's 121 plus its three shortcut pools, each a few strided sums there (12), below BN's."""
    c, floor, bn = (opcount.count_eval(FAMILIES["ResNet-50"], scheme, autocast=False, channels_last=False)
                    for scheme in ("rescale", "none", "bn"))
    assert c.before.launches > 2 * floor.frozen.launches
    assert c.frozen.launches == floor.frozen.launches + 12 and c.frozen.by_op["aten.conv2d.default"] == 53
    assert c.frozen.launches < bn.frozen.launches


# --------------------------------------------------------------- what a GPU launches: casts included
def test_kernels_count_autocast_casts_alike_under_no_grad_and_inference_mode():
    """Under ``torch.inference_mode`` autocast's casts reach the dispatcher as ``aten.to`` (marked
    a view: the launch counts leave them out), under ``torch.no_grad`` as ``aten._to_copy``: the
    kernel count sees them both ways, and an op that hands its input back (``dropout`` in eval
    mode, seen whole under ``inference_mode``) launches nothing."""
    conv, drop = nn.Conv2d(3, 4, 3), nn.Dropout(0.5).eval()
    x = torch.randn(1, 3, 8, 8)
    for mode in (torch.no_grad, torch.inference_mode):
        counter = opcount.OpCounter()
        with mode(), torch.autocast("cpu", dtype=torch.bfloat16), counter:
            drop(conv(x))
        assert (counter.kernels, counter.casts) == (4, 3), mode.__name__  # input, weight, bias; the conv
    assert counter.launches == 2  # inference_mode: the conv and the dropout, no cast


def test_frozen_eval_launches_no_weight_cast(evals):
    """What a GPU launches per eval forward, casts included, the same under ``torch.no_grad`` and
    ``torch.inference_mode``: the frozen plan keeps its folded weights in autocast's dtype, so a
    normalization-free network casts only its input image, as few as the floor (whose frozen
    program holds bf16 weights too), and launches fewer than BN by every cast and norm BN pays
    (a weight cast per convolution and the classifier's two, a norm per convolution), less its
    own shortcut pools (R3D-18: CPU autocast pools 3D in float32, two casts a pool)."""
    for (family, name), c in evals.items():
        assert c.frozen.kernels == c.frozen_no_grad.kernels, (family, name)
        assert c.before.kernels == c.before_no_grad.kernels, (family, name)
        assert c.frozen.casts == c.frozen_no_grad.casts, (family, name)
    for family in ("ResNet-50", "R3D-18 (3D)", "VGG-11"):
        bn = evals[(family, "baseline")].frozen_no_grad
        floor = evals[(family, "floor")].frozen_no_grad
        norms = sum(n for op, n in bn.by_kernel.items() if "batch_norm" in op)
        for scheme in [s for f, s in EVAL_CASES if f == family] + ["floor"]:
            c = evals[(family, scheme)]
            above = ABOVE_FLOOR.get((family, scheme), 0)
            pool_casts = 2 * above if family == "R3D-18 (3D)" else 0
            assert c.frozen_no_grad.casts == floor.casts + pool_casts, (family, scheme, c.frozen_no_grad.casts)
            assert c.frozen_no_grad.kernels == floor.kernels + above + pool_casts, (family, scheme)
            assert bn.kernels - c.frozen_no_grad.kernels == (bn.casts - c.frozen_no_grad.casts) + norms - above, (
                family, scheme)
            assert c.frozen_no_grad.kernels < c.before_no_grad.kernels or scheme == "floor"
        assert floor.casts == (3 if family == "R3D-18 (3D)" else 1)  # the input's (and R3D's head pool)
    rescale50, bn50 = evals[("ResNet-50", "rescale")].frozen_no_grad, evals[("ResNet-50", "baseline")].frozen_no_grad
    assert (rescale50.kernels, rescale50.casts) == (125, 1)
    # BN casts its input, its 53 convolutions' weights and its classifier's weight and bias
    assert bn50.casts == 1 + 53 + 2 and bn50.by_kernel["aten.convolution.default"] == 53


def test_the_train_counts_leave_out_sgds_three_in_place_updates_and_say_so():
    """The train launches count the ops that return a tensor: SGD's in-place foreach updates
    (momentum buffers and weights), which return nothing, are left out, three per step for every
    contender; the table's note and docs/speed.md say so, rather than letting "foreach SGD" read
    as counted in full."""
    from pathlib import Path

    family = FAMILIES["ResNet-18"]
    for scheme in ("none", "rescale"):
        model, inputs, targets = opcount._built(family, scheme, None, "lean")
        model.train()
        opt = opcount._sgd(model)
        opcount.count_step(model, inputs, targets, family.loss, opt)  # creates the momentum buffers
        counted = opcount.count_step(model, inputs, targets, family.loss, opt)
        every = opcount.count_step(model, inputs, targets, family.loss, opt, counter_type=opcount.WriteCounter)
        left_out = every.by_op - counted.by_op
        assert every.launches - counted.launches == 3 == sum(left_out.values()), (scheme, left_out)
        assert set(left_out) == {"aten._foreach_mul_.Scalar", "aten._foreach_add_.List"}, left_out
    assert "not SGD's three in-place foreach updates" in opcount.TRAIN_LAUNCHES_NOTE
    speed = " ".join((Path(__file__).resolve().parents[2] / "docs" / "speed.md").read_text().split())
    assert "its three in-place foreach updates, which return nothing" in speed


def test_the_speed_docs_compare_the_eval_launches_that_were_counted(evals):
    """docs/speed.md's sentence on rescale50's eval launches names the counts it compares, as
    ``opcount --eval`` counts them (frozen plan on and off, against the floor's on and off),
    not a "2.5x" that no count gives."""
    from pathlib import Path

    rescale, floor = evals[("ResNet-50", "rescale")], evals[("ResNet-50", "floor")]
    on, off = rescale.frozen_no_grad.kernels, rescale.before_no_grad.kernels
    floor_on, floor_off = floor.frozen_no_grad.kernels, floor.before_no_grad.kernels
    speed = " ".join((Path(__file__).resolve().parents[2] / "docs" / "speed.md").read_text().split())
    assert (f"rescale50's eval forward launches {on} on the frozen plan, {on / floor_on:.3f}x the floor's "
            f"{floor_on}, and {off} with it off, {off / floor_on:.2f}x the floor's {floor_on} and "
            f"{off / floor_off:.2f}x the floor's own {floor_off} with it off") in speed
    # the RESULTS.md ops block's older figure: the folded plan evaluating, without autocast's casts
    old, old_floor = off - rescale.before_no_grad.casts, floor_off - floor.before_no_grad.casts
    assert f"its {old} eval launches for rescale50, {old / old_floor:.2f}x the floor's {old_floor}," in speed
