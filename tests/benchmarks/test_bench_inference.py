"""The ``inference`` section of the benchmark harness on a tiny R3D-18: eval forwards on the frozen
plan beside BN, the floor and RescaleNet with the frozen plan off, eager and compiled, in one set
of paired repeats, and the goals it feeds. No timing is asserted: the structure is."""
from __future__ import annotations

from dataclasses import replace

import torch

import rescale_core
from benchmarks import report
from benchmarks.inference import FROZEN_OFF, inference_suite, inference_table
from benchmarks.models import image_batch
from benchmarks.sections import SECTIONS
from benchmarks.toolkit import Settings


def tiny_suite():
    """R3D-18's roles and names (so the goals read its metrics) on an 8-layer 2D ResNet: dynamo
    traces it in a fraction of R3D-18's time."""
    def build(scheme, frozen=True):
        return lambda: rescale_core.plans.set_frozen(rescale_core.create_model(
            "cifar_resnet", depth=8, base_width=4, scheme=scheme, num_classes=5), frozen)
    r3d = inference_suite("r3d_18", image_size=16, frames=2, num_classes=5, base_width=4)
    contenders = tuple(replace(c, build=build(c.name.split()[0].replace("floor", "none").replace("BN", "bn"),
                                              FROZEN_OFF not in c.name)) for c in r3d.contenders)
    return replace(r3d, contenders=contenders, make_batch=image_batch(8, 5))


def test_inference_eager_and_compiled_side_by_side():
    # the eager backend: dynamo captures the graphs without inductor's code generation
    settings = Settings(device=torch.device("cpu"), amp_dtype=None, channels_last=False, batch=2, image_size=8,
                        warmup=1, eval_warmup=1, repeats={"inference": 2}, min_run_time=0.001, verbose=False,
                        compile=True, compile_backend="eager")
    res = inference_table(tiny_suite(), settings, 2)
    (table,) = res.tables
    assert table.columns == ["model", "eager ms", "eager x floor", "eager x BN", "compiled ms", "compiled x floor",
                             "compiled x BN", "note"]
    names = [r[0] for r in table.rows]
    assert names == ["BN", "floor (no norm)", "rescale", f"rescale {FROZEN_OFF}", "fixup", "skipinit"]
    fixup = table.rows[names.index("fixup")]
    assert fixup[4:7] == ["-", "-", "-"]  # compiled: the baseline, the floor and RescaleNet on and off
    m = res.metrics
    for mode in ("eager", "compiled"):
        assert m[f"r3d_18.inference.{mode}.vs_floor.rescale"].n == 2
        assert m[f"r3d_18.inference.{mode}.vs_before.rescale"].n == 2
    assert any("frozen plan / rescale with it off" in n for n in table.notes)
    marks = {g.goal.key: g.status for g in report.evaluate_goals(m, "cpu")}
    assert marks["r3d_18.inference.compiled.vs_floor.rescale"].split()[0] in ("PASS", "FAIL")
    assert marks["resnet50.inference.eager.vs_floor.rescale"] == "not measured"
    assert "inference" in SECTIONS


def test_frozen_off_contender_evaluates_on_the_plan_it_trains_on():
    suite = inference_suite("r3d_18", image_size=16, frames=2, num_classes=5, base_width=4)
    on, off = (suite.contender(n).build().eval() for n in ("rescale", f"rescale {FROZEN_OFF}"))
    x = torch.randn(1, 3, 2, 16, 16)
    with torch.inference_mode():
        assert rescale_core.plans.running_plan(on, x) == "frozen"
        assert rescale_core.plans.running_plan(off, x) == "folded"


def test_the_figures_docs_speed_quotes_are_the_inference_blocks_medians_of_per_repeat_ratios():
    """docs/speed.md's "frozen / frozen off" column quotes RESULTS.md's ``inference`` block: the
    medians of the per-repeat ratios written there (not a ratio of the medians of the times)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    begin, end = report.markers("inference")
    results = (repo / "benchmarks" / "RESULTS.md").read_text()
    block = results[results.index(begin):results.index(end)]
    written = {title: (m.group(1), m.group(2)) for title, m in zip(
        re.findall(r"^### (\S+): eval forward on the frozen plan", block, re.M),
        re.finditer(r"^- rescale on the frozen plan / rescale with it off \(the same mode\): "
                    r"eager (\S+) \[[^]]*\], compiled (\S+) \[", block, re.M))}
    quoted = dict((m.group(1), (m.group(2), m.group(3))) for m in re.finditer(
        r"^\| (\S+) rescale \|.*\| (\S+), (\S+) \|$", (repo / "docs" / "speed.md").read_text(), re.M))
    assert written.keys() == {"ResNet-50", "R3D-18"}
    assert {k: quoted[k] for k in written} == written
