"""Smoke tests of the benchmark harness (``benchmarks/``) on tiny models.

No timing is asserted: only the structure of the tables, the paired-ratio arithmetic (fed with
fake timings), the memory probe's direction and the command line's exit status. ``benchmarks`` is
a plain folder of the repository root, importable because ``python -m pytest`` runs from there.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import rescale_core
from benchmarks import report  # the repository folder (pyproject: pytest pythonpath = ["."])
from benchmarks.memory import peak_step_memory
from benchmarks.models import Contender, Suite, image_batch
from benchmarks.suites import eval_suite, measuring_suite, train_suite
from benchmarks.toolkit import Settings
from benchmarks.steps import RunConfig, min_warmup, prepare, reset_measuring, warm_up
from benchmarks.timing import Summary, paired_repeats, summarize, timer_measure
from benchmarks.decoding import greedy_cached, greedy_recompute
from benchmarks.models import translation_suite
from benchmarks.translation import section_translation
import forked

REPO = Path(__file__).resolve().parents[2]


def tiny_suite() -> Suite:
    def build(scheme):
        return lambda: rescale_core.create_model("cifar_resnet", depth=8, base_width=4,
                                                 scheme=scheme, num_classes=5)
    contenders = (Contender("bn", build("bn"), "baseline"), Contender("none", build("none")),
                  Contender("rescale", build("rescale")))
    return Suite("tiny", "tiny ResNet", contenders, baseline="bn", floor="none", target="rescale",
                 make_batch=image_batch(8, 5), loss=F.cross_entropy, shape="3x8x8")


def tiny_settings() -> Settings:
    return Settings(device=torch.device("cpu"), amp_dtype=None, channels_last=False, batch=4,
                    image_size=8, warmup=2, eval_warmup=1, repeats={}, min_run_time=0.001,
                    verbose=False)


# --- timing arithmetic --------------------------------------------------------------------------
def fake_measures(times: dict[str, list[float]], calls: list[str]):
    def make(name):
        it = iter(times[name])

        def measure():
            calls.append(name)
            return next(it)
        return measure
    return {name: make(name) for name in times}


def test_ratios_are_medians_of_per_repeat_ratios():
    times = {"base": [1.0, 2.0, 4.0], "x": [1.5, 1.0, 6.0], "floor": [0.5, 1.0, 3.0]}
    calls: list[str] = []
    paired = paired_repeats(fake_measures(times, calls), "base", repeats=3)
    assert paired.times == times
    assert paired.ratios("x") == [1.5, 0.5, 1.5]
    r = paired.ratio("x")
    assert r.median == 1.5 and r.n == 3  # the ratio of medians would be 1.5 / 2.0 = 0.75
    assert r.q1 == pytest.approx(1.0) and r.q3 == pytest.approx(1.5)
    assert paired.ratio("x", "floor").median == pytest.approx(2.0)  # ratios [3, 1, 2]
    assert paired.ratio("base").median == 1.0
    # interleaved: every repeat times every contender once, rotated from repeat to repeat
    assert calls == ["base", "x", "floor", "x", "floor", "base", "floor", "base", "x"]


def test_summarize_quartiles():
    assert summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == Summary(3.0, 2.0, 4.0, 5)
    assert summarize([2.0]) == Summary(2.0, 2.0, 2.0, 1)
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(KeyError):
        paired_repeats({"a": lambda: 1.0}, "b", 1)


def test_timer_measure_runs_the_statement_after_setup():
    seen = []
    state = {"fresh": False}

    def setup():
        state["fresh"] = True

    def fn():
        seen.append(state["fresh"])
        state["fresh"] = False

    seconds = timer_measure(fn, setup=setup, number=1)()
    assert seconds > 0 and seen and seen[-1] is True  # the timed call directly follows setup
    assert timer_measure(lambda: None, min_run_time=0.001)() > 0


# --- sections on tiny models --------------------------------------------------------------------
def test_train_eval_measuring_tables():
    suite, settings = tiny_suite(), tiny_settings()
    train = train_suite(suite, settings, batch=4, repeats=2, section="train")
    (table,) = train.tables
    assert table.columns[:4] == ["model", "ms/step", "vs bn", "vs none"]
    assert "peak MiB" in table.columns and "mem vs base" in table.columns
    assert [row[0] for row in table.rows] == ["bn", "none", "rescale"]
    assert table.rows[0][2] == "1.000 [1.000, 1.000]"  # the baseline against itself
    assert table.rows[1][3] == "1.000 [1.000, 1.000]"  # the floor against itself
    m = train.metrics
    assert m["tiny.train.vs_baseline.bn"].median == 1.0
    assert isinstance(m["tiny.train.vs_floor.rescale"], Summary)
    assert m["tiny.train.mem_vs_baseline.bn"] == 1.0 and m["tiny.train.mem_vs_baseline.rescale"] > 0

    ev = eval_suite(suite, settings, batch=4, repeats=2, section="eval")
    assert ev.tables[0].columns == ["model", "ms/batch", "img/s", "vs bn", "vs none"]
    assert ev.metrics["tiny.eval.per_second.rescale"] > 0

    meas = measuring_suite(suite, settings, batch=4, repeats=2, section="measuring")
    assert [r[0] for r in meas.tables[0].rows] == ["rescale ordinary step", "rescale measuring step"]
    assert meas.metrics["tiny.measuring.vs_ordinary"].n == 2


def test_warm_up_passes_the_measuring_phase_and_reset_restarts_it():
    p = prepare(tiny_suite(), "rescale", 4, RunConfig())
    assert min_warmup(p.model) == 10
    warm_up(p, steps=1)  # raised to measure_batches + 2
    layers = rescale_core.mean_shift_layers(p.model)
    assert p.warmup_steps == 10 and not any(m.measuring for m in layers)
    reset_measuring(p.model)
    assert all(m.measuring and int(m.count) == 0 for m in layers)


def test_memory_probe_grows_with_the_batch():
    suite = tiny_suite()
    peaks = {}
    for batch in (2, 32):
        p = warm_up(prepare(suite, "bn", batch, RunConfig()), 1)
        r = peak_step_memory(p.train_step, p.model, p.optimizer, p.tensors)
        assert r.step_peak > 0 and r.unaccounted == 0 and r.peak == r.resting + r.step_peak
        peaks[batch] = r
    assert peaks[32].peak > peaks[2].peak
    assert peaks[32].step_peak > peaks[2].step_peak


# --- goals and results file ---------------------------------------------------------------------
def test_goal_marks_follow_the_measured_ratios():
    key = "resnet50.train.vs_baseline.rescale50"
    metrics = {key: Summary(0.88, 0.86, 0.90, 10), "resnet50.train.mem_vs_baseline.rescale50": 1.02}
    cpu = {r.goal.key: r for r in report.evaluate_goals(metrics, "cpu")}
    gpu = {r.goal.key: r for r in report.evaluate_goals(metrics, "cuda")}
    assert cpu[key].status == "PASS" and gpu[key].status == "FAIL"  # 0.90 on CPU, 0.85 on GPU
    assert cpu["resnet50.train.mem_vs_baseline.rescale50"].status == "FAIL"
    assert cpu["resnet50.eval.vs_floor.rescale50"].status == "not measured"
    noisy = report.evaluate_goals({key: Summary(0.89, 0.80, 0.95, 10)}, "cpu")
    assert next(r for r in noisy if r.goal.key == key).status == "PASS (IQR spans the threshold)"
    table = report.goals_table(list(cpu.values()), "cpu", ran={"train"})
    assert {row[1] for row in table.rows} >= {"rescale50 train step / resnet50 BN"}
    assert all(row[0] == "ResNet-50" for row in table.rows)  # sections that did not run are left out


def test_goal_marks_name_a_floor_that_misses_the_threshold_itself():
    """A ratio to the baseline names the floor's own ratio, and is marked out of reach where the
    floor itself misses the threshold; the compile goals compare with the compiled floor and
    with the eager target."""
    key, floor = "resnet50.compile.vs_baseline.rescale50", "resnet50.compile.vs_baseline.floor (no norm)"
    metrics = {key: Summary(0.97, 0.96, 0.98, 5), floor: Summary(0.93, 0.92, 0.94, 5),
               "resnet50.compile.vs_floor.rescale50": Summary(1.03, 1.02, 1.04, 5),
               "resnet50.compile.vs_reference.rescale50": Summary(0.94, 0.93, 0.95, 5)}
    marks = {r.goal.key: r.status for r in report.evaluate_goals(metrics, "cpu")}
    assert marks[key] == "FAIL (out of reach: the floor itself is 0.930)"
    assert marks["resnet50.compile.vs_floor.rescale50"] == "PASS"
    assert marks["resnet50.compile.vs_reference.rescale50"] == "PASS"
    metrics[floor] = Summary(0.85, 0.84, 0.86, 5)  # a floor that makes it: a FAIL, floor named
    assert {r.goal.key: r.status for r in report.evaluate_goals(metrics, "cpu")}[key] == "FAIL (floor 0.850)"


def test_write_results_replaces_only_its_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\nhand-written notes\n")
    report.write_results(path, f"{report.BEGIN}\nfirst\n{report.END}\n")
    report.write_results(path, f"{report.BEGIN}\nsecond\n{report.END}\n")
    text = path.read_text()
    assert "hand-written notes" in text and "second" in text and "first" not in text
    assert text.count(report.BEGIN) == 1


def test_gpu_results_sit_next_to_the_cpu_results(tmp_path):
    path = tmp_path / "RESULTS.md"
    begin, end = report.markers("cuda-bf16")
    report.write_results(path, f"{report.BEGIN}\ncpu figures\n{report.END}\n")
    report.write_results(path, f"{begin}\ngpu first\n{end}\n", "cuda-bf16")
    report.write_results(path, f"{begin}\ngpu second\n{end}\n", "cuda-bf16")
    report.write_results(path, f"{report.BEGIN}\ncpu again\n{report.END}\n")
    text = path.read_text()
    assert "cpu again" in text and "gpu second" in text and "first" not in text and "cpu figures" not in text
    assert text.count(begin) == 1 and text.count(report.BEGIN) == 1


def test_command_line_quick_run(tmp_path):
    out = tmp_path / "RESULTS.md"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = forked.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "data",  # (tests/forked.py)
                       "--repeats", "1", "--min-run-time", "0.01", "--markdown", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DataLoader throughput" in proc.stdout and "versions" in proc.stdout
    text = out.read_text()
    assert report.BEGIN in text and "| workers=0 |" in text


# --- translation -----------------------------------------------------------------------------------
TINY_TRANSFORMER = {"d_model": 16, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1,
                    "dim_feedforward": 32}


def test_recomputed_greedy_decoding_matches_the_cached_search():
    torch.manual_seed(0)
    model = rescale_core.create_model("transformer_base", scheme="rescale", src_vocab_size=50,
                                      share_embeddings=True, **TINY_TRANSFORMER).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
    for n in (1, 6):
        cached = greedy_cached(model, src, bos=0, eos=2, length=n)
        assert cached.shape == (2, n) and not cached.eq(2).any() and not cached.eq(1).any()
        assert torch.equal(cached, greedy_recompute(model, src, bos=0, eos=2, length=n))


def test_multi_batch_suite_steps_once_per_batch():
    """A translation-style suite: one timed call = one optimizer step per batch; the warm-up
    counts steps, not calls."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for rows, width in ((3, 5), (2, 9)):
        tgt = torch.randint(4, 40, (rows, width), generator=g)
        tgt[0, -2:] = 1  # padding: not counted as tokens
        batches.append({"src_tokens": torch.randint(4, 40, (rows, width + 1), generator=g),
                        "prev_output_tokens": tgt, "target": tgt})
    suite = translation_suite(batches, 40, "transformer_base", schemes=("post_ln", "rescale"), **TINY_TRANSFORMER)
    assert suite.items == 3 * 5 + 2 * 9 - 4 and suite.floor is None and suite.target == "T rescale"
    p = prepare(suite, "T rescale", 0, RunConfig())
    assert p.steps_per_call == 2 and len(p.tensors) == 6
    assert isinstance(p.optimizer, torch.optim.Adam)
    warm_up(p, steps=5)
    assert p.warmup_steps == 3  # calls holding >= 5 steps
    assert p.optimizer.state[next(iter(p.model.parameters()))]["step"] == 6


def test_translation_goals_and_tags():
    metrics = {"translation.padding_efficiency": 0.93,
               "translation.decode.cached_vs_recomputed.20": Summary(0.7, 0.6, 0.8, 3),
               "translation.decode.cached_vs_recomputed.7": Summary(1.2, 1.1, 1.3, 3)}
    marks = {r.goal.key: r for r in report.evaluate_goals(metrics, "cpu")}
    assert marks["translation.padding_efficiency"].status == "PASS"  # higher is better
    assert marks["translation.decode.cached_vs_recomputed.20"].status == "PASS"
    assert marks["translation.decode.cached_vs_recomputed.7"].status == "FAIL"  # a measured length gets a goal
    assert marks["translation.decode.cached_vs_recomputed.100"].status == "not measured"
    low = report.evaluate_goals({"translation.padding_efficiency": 0.85}, "cuda")
    assert next(r for r in low if r.goal.key == "translation.padding_efficiency").status == "FAIL"
    table = report.goals_table(list(marks.values()), "cpu", ran={"translation"})
    assert table.title == "Goals (translation)" and all(row[0] == "Translation" for row in table.rows)
    assert table.rows[0][3] == "> 0.90"
    cpu, gpu = tiny_settings(), tiny_settings()
    gpu.device, gpu.amp_dtype = torch.device("cuda"), torch.bfloat16
    assert report.results_tag(cpu) == "" and report.results_tag(cpu, "translation") == "translation"
    assert report.results_tag(gpu, "trans lation") == "cuda-bf16-trans-lation"


def test_translation_section_on_real_pairs(tmp_path, en_de_pairs):
    """The whole section on 1200 real catalogue pairs (the suite's) with a tiny model: a few seconds."""
    settings = tiny_settings()
    settings.repeats = {"translation": 2}
    settings.translation = {"root": str(tmp_path / "corpus"), "num_pairs": 1400, "valid": 100, "test": 100,
                            "pairs": en_de_pairs,
                            "vocab_size": 300, "workers": (0,), "overrides": TINY_TRANSFORMER,
                            "train_max_tokens": 256, "train_batches": 2, "decode_batch": 2,
                            "lengths": (3, 6), "beam": 2, "schemes": ("post_ln", "pre_ln", "rescale", "dyt")}
    res = section_translation(settings)
    loader, train, decode = res.tables
    assert loader.columns[:2] == ["setting", "tok/s"] and [r[0] for r in loader.rows] == ["workers=0"]
    assert [r[0] for r in train.rows] == ["post-LN", "pre-LN", "T rescale", "DyT"]
    assert train.rows[0][3] == "1.000 [1.000, 1.000]"  # the baseline against itself
    m = res.metrics
    assert 0 < m["translation.padding_efficiency"] <= 1
    assert m["translation.loader.per_second.workers=0"] > 0
    for name in ("post-LN", "pre-LN", "T rescale", "DyT"):
        assert m[f"translation.train.per_second.{name}"] > 0
        assert m[f"translation.train.tokens_vs_baseline.{name}"].n == 2
    assert [(r[0], r[1]) for r in decode.rows] == [(n, s) for n in ("3", "6") for s in
                                                  ("greedy, cached", "greedy, recomputed", "beam 2, cached")]
    assert all(r[5] == "2/2" for r in decode.rows if r[1].startswith("greedy"))  # cache == recomputation
    for n in (3, 6):
        assert m[f"translation.decode.cached_vs_recomputed.{n}"].median > 0
        assert m[f"translation.decode.sentences_per_second.beam 2, cached.{n}"] > 0
    marks = {r.goal.key: r.status for r in report.evaluate_goals(m, "cpu")}
    assert marks["translation.padding_efficiency"] in ("PASS", "FAIL")
    assert marks["translation.decode.cached_vs_recomputed.6"].split()[0] in ("PASS", "FAIL")


def test_the_agc_step_clips_the_model_it_is_given_even_one_built_where_a_dead_one_was():
    """``nf50 + AGC``'s clipping step chooses each model's parameters once, for that model: a model
    built after another died (at the same address, as CPython often reuses it) is clipped itself,
    its output layer excluded, never the dead model's tensors."""
    import gc

    from benchmarks.models import agc_but_classifier

    clip_ = agc_but_classifier(0.01)
    seen, reused = set(), False
    for _ in range(50):
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        reused |= id(model) in seen
        seen.add(id(model))
        for p in model.parameters():
            p.grad = torch.full_like(p, 100.0)  # far above 0.01 x the weights' norms
        clip_(model)
        hidden, output = model[0], model[2]
        assert hidden.weight.grad.abs().max() < 1.0 and hidden.bias.grad.abs().max() < 100.0
        assert torch.equal(output.weight.grad, torch.full_like(output.weight, 100.0))  # the classifier's own
        del model, hidden, output
        gc.collect()
        if reused:
            break
    assert reused, "no model was built where a dead one was: the test is void"


def test_a_run_stopped_midway_keeps_the_sections_it_finished(tmp_path, monkeypatch):
    """The results section is written after every section: a run killed in its second section (a
    GPU lease that ends) leaves the first one's tables in the file, the rest marked not run. The
    kill is a ``BaseException`` raised where the second section starts (where the progress line
    ``[ops] starting`` is written): nothing of the run after it is written, as after a kill."""
    from benchmarks import __main__ as bench

    class Killed(BaseException):
        """The process ended where it stood (past ``main``'s ``except Exception``)."""

    run_section = bench.run_section

    def killed_at_ops(name, settings):
        if name == "ops":
            raise Killed
        return run_section(name, settings)

    monkeypatch.setattr(bench, "run_section", killed_at_ops)
    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\nhand-written notes\n")
    with pytest.raises(Killed):
        bench.main(["--quick", "--threads", str(torch.get_num_threads()),  # (--quick alone: 1)
                    "--repeats", "1", "--min-run-time", "0.01", "--only", "data", "ops", "--markdown", str(out)])
    text = out.read_text()
    assert "hand-written notes" in text and text.count(report.BEGIN) == 1 and report.END in text
    assert "| workers=0 |" in text
    assert "**ops failed:** not run: the run stopped before this section ended" in text


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_a_results_file_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, capsys, where):
    """A --markdown path in a folder that does not exist (or a folder) is one error line at the
    start, not a traceback after the run's measurements."""
    from benchmarks.__main__ import parse_args

    path = tmp_path / "nowhere" / "RESULTS.md" if where == "missing folder" else tmp_path
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--device", "cpu", "--quick", "--only", "data", "--markdown", str(path)])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"python -m benchmarks: error: --markdown {path}: ")
    assert parse_args(["--markdown", str(tmp_path / "RESULTS.md")]).markdown == str(tmp_path / "RESULTS.md")


@pytest.mark.parametrize("option", ["--resnet3d-arch", "--transformer-arch"])
def test_an_unknown_architecture_is_refused_before_anything_runs(capsys, option):
    """An architecture that is not registered (or of another family) is one error line naming the
    choices, not a traceback when its section (perhaps the last of an hour's run) builds it."""
    from benchmarks.__main__ import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args([option, "resnet50"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"python -m benchmarks: error: {option} resnet50: not a registered ")
    assert "transformer_small" in line or "resnet3d_50" in line


def test_the_documented_partial_runs_write_a_block_of_their_own():
    """Every ``make bench`` example of docs/speed.md and ``make help`` that runs some sections
    (``--only``) or a smoke run (``--quick``) names a ``--markdown-tag``: without one it would
    replace the full run's results block (``make bench-gpu``'s checks tag themselves)."""
    import re

    texts = {"docs/speed.md": (REPO / "docs" / "speed.md").read_text(),
             "Makefile": (REPO / "Makefile").read_text().replace('\\"', '"')}
    examples = [(where, args) for where, text in texts.items()
                for m in re.finditer(r'BENCH_ARGS="([^"]*)"(?:,? or "([^"]*)")?', text.replace("\n", " "))
                if "bench-gpu" not in text.replace("\n", " ")[max(0, m.start() - 40):m.start()]
                for args in m.groups() if args is not None]
    assert examples
    partial = [(where, args) for where, args in examples if re.search(r"--only|--quick", args)]
    assert partial and all("--markdown-tag" in args for _, args in partial), partial


def test_a_results_block_whose_end_marker_was_lost_is_refused_not_run_over(tmp_path, capsys):
    """A begin marker without its end (a hand edit) would make the replacement run on to the next
    end marker, over the other blocks and notes: the run refuses it at the start, and
    write_results writes nothing."""
    from benchmarks.__main__ import main

    gpu_begin, gpu_end = report.markers("cuda-bf16")
    text = f"# R\n\n{report.BEGIN}\nold cpu figures\n\nnotes\n\n{gpu_begin}\nGPU FIGURES\n{gpu_end}\n"
    path = tmp_path / "RESULTS.md"
    path.write_text(text)
    with pytest.raises(ValueError, match="mend them by hand"):
        report.write_results(path, f"{report.BEGIN}\nnew\n{report.END}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", "--quick", "--threads", str(torch.get_num_threads()),  # (--quick alone: 1)
              "--only", "data", "--markdown", str(path)])
    assert str(exit_.value).startswith(f"python -m benchmarks: error: --markdown {path}: its results section")
    assert "[data]" not in capsys.readouterr().out
    assert path.read_text() == text
    report.write_results(path, f"{gpu_begin}\nnew GPU figures\n{gpu_end}\n", "cuda-bf16")  # a sound pair
    assert "new GPU figures" in path.read_text() and "old cpu figures" in path.read_text()


@pytest.mark.parametrize("option", ["--batch", "--image-size", "--repeats", "--threads", "--min-run-time",
                                    "--detection-batch", "--video-workers"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_size_of_zero_or_below_is_refused_not_read_as_the_default(capsys, option, value):
    """``--batch 0`` (or an image size, threads, repeats... of 0) used to run silently with the
    default (``--repeats 0``: with 1): one error line naming the option instead."""
    from benchmarks.__main__ import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args([option, value])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"python -m benchmarks: error: argument {option}: must be above 0, not {value}")
    assert getattr(parse_args([option, "3"]), option[2:].replace("-", "_")) == 3
