"""The ``plans`` section of the benchmark harness on a tiny ResNet: every plan eager and compiled
beside the baseline and the floor in one set of paired repeats, the goals it feeds, and the
command line that selects it. No timing is asserted: the structure and the arithmetic are."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import rescale_core
from benchmarks import report
from benchmarks.__main__ import build_settings, measured_sections, parse_args, selected_sections
from benchmarks.models import Contender, Suite, image_batch
from benchmarks.opcount import OpCounter
from benchmarks.plans import default_plan, plans_suite
from benchmarks.toolkit import SectionResult, Settings

PLANS = ("reference", "folded", "lean")


def tiny_plans_suite() -> Suite:
    """ResNet-50's roles and names (so the compile goals read its metrics) on an 8-layer ResNet."""
    def build(scheme, plan="auto"):
        return lambda: rescale_core.create_model("cifar_resnet", depth=8, base_width=4, scheme=scheme,
                                                 num_classes=5, plan=plan)
    contenders = (Contender("resnet50 BN", build("bn")), Contender("floor (no norm)", build("none")),
                  *(Contender(f"rescale50 {p}", build("rescale", p), f"plan {p}") for p in PLANS))
    return Suite("resnet50", "tiny ResNet", contenders, baseline="resnet50 BN", floor="floor (no norm)",
                 target="rescale50 folded", make_batch=image_batch(8, 5), loss=F.cross_entropy, shape="3x8x8")


def tiny_settings(compile: bool) -> Settings:
    # the eager backend: dynamo captures the graphs (and counts them) without inductor's code generation
    return Settings(device=torch.device("cpu"), amp_dtype=None, channels_last=False, batch=2, image_size=8,
                    warmup=2, eval_warmup=1, repeats={"plans": 2}, min_run_time=0.001, verbose=False,
                    compile=compile, compile_backend="eager")


def test_plans_eager_and_compiled_side_by_side():
    res = plans_suite(tiny_plans_suite(), tiny_settings(compile=True), "plans",
                      {p: f"rescale50 {p}" for p in PLANS})
    table, against = res.tables
    assert table.columns == ["model", "eager ms", "eager x floor", "eager x BN", "compiled ms", "compiled x floor",
                             "compiled x BN", "compiled / eager", "compile s", "graphs", "note"]
    assert [r[0] for r in table.rows] == ["resnet50 BN", "floor (no norm)", "rescale50 reference",
                                          "rescale50 folded", "rescale50 lean"]
    one = "1.000 [1.000, 1.000]"
    bn, floor = table.rows[0], table.rows[1]
    assert bn[3] == bn[6] == one and floor[2] == floor[5] == one  # each mode against its own BN and floor
    assert all(int(r[9]) >= 1 for r in table.rows)  # every contender really ran compiled
    assert "auto's plan here" in table.rows[3][-1]
    m = res.metrics
    for plan in PLANS:
        for mode in ("eager", "compiled"):
            assert m[f"resnet50.plans.{mode}.vs_floor.{plan}"].n == 2
            assert m[f"resnet50.plans.{mode}.vs_baseline.{plan}"].n == 2
        assert m[f"resnet50.plans.compiled_vs_eager.{plan}"].n == 2
    assert [r[0] for r in against.rows] == ["folded", "lean"]
    assert against.columns == ["plan", "eager x reference", "compiled x reference"]
    assert sum(n.startswith(("eager: the fastest", "compiled: the fastest")) for n in against.notes) == 2
    # the compile goals read the default plan's compiled ratios
    assert m["resnet50.compile.vs_floor.rescale50"] == m["resnet50.plans.compiled.vs_floor.folded"]
    marks = {g.goal.key: g.status for g in report.evaluate_goals(m, "cpu")}
    for key in ("resnet50.compile.vs_baseline.rescale50", "resnet50.compile.vs_floor.rescale50",
                "resnet50.compile.vs_reference.rescale50"):
        assert marks[key].split()[0] in ("PASS", "FAIL")


def test_plans_eager_only_without_compile():
    res = plans_suite(tiny_plans_suite(), tiny_settings(compile=False), "plans",
                      {p: f"rescale50 {p}" for p in PLANS})
    table, against = res.tables
    assert table.columns == ["model", "eager ms", "eager x floor", "eager x BN", "note"]
    assert against.columns == ["plan", "eager x reference"]
    assert not any(k.startswith("resnet50.compile.") for k in res.metrics)


def test_command_line_runs_the_plans_section_compiled_unless_quick():
    threads = ["--device", "cpu", "--threads", str(torch.get_num_threads())]  # --quick alone would set 1 here
    quick = parse_args(["--quick", *threads])
    assert "plans" in selected_sections(quick) and not build_settings(quick).compile
    full = build_settings(parse_args(threads))
    assert full.compile and full.compile_backend == "inductor" and full.repeats["plans"] == 5
    assert build_settings(parse_args(["--quick", "--compile", *threads])).compile
    # the compile goals count as measured only where the section compiled
    ran = [SectionResult("train"), SectionResult("plans")]
    assert measured_sections(ran, build_settings(quick)) == {"train"}
    assert measured_sections(ran, full) == {"train", "plans"}


def test_default_plan_is_the_plan_auto_runs():
    """On the CPU ``auto`` dispatches exactly the ops of the folded plan, not the lean plan's."""
    x = torch.randn(2, 3, 8, 8)

    def ops(plan):
        torch.manual_seed(0)
        model = rescale_core.create_model("cifar_resnet", depth=8, base_width=4, scheme="rescale",
                                          num_classes=5, plan=plan)
        rescale_core.finish_measuring(model)
        counter = OpCounter()
        with counter:
            model(x)
        return counter.by_op

    assert default_plan(torch.device("cpu")) == "folded" and default_plan(torch.device("cuda")) == "lean"
    assert ops("auto") == ops("folded") != ops("lean")



def test_the_goals_of_a_failed_section_read_not_measured():
    """A section that failed (or that the deadline left out) keeps its goals in the table, marked
    "not measured" (benchmarks/RESULTS.md), rather than leaving them out as if not selected."""
    from benchmarks import report

    settings = build_settings(parse_args(["--device", "cpu", "--quick"]))
    ran = [SectionResult("train", error="RuntimeError: boom"),
           SectionResult("eval", error="not run: the 5 s deadline had passed")]
    table = report.goals_table(report.evaluate_goals({}, "cpu"), "cpu", measured_sections(ran, settings))
    texts = {row[1]: row[4] for row in table.rows}
    assert texts["rescale50 train step / resnet50 BN"] == "not measured"
    assert texts["rescale50 eval forward / floor (no norm)"] == "not measured"
    assert not any("measuring" in text for text in texts)  # not selected: left out
