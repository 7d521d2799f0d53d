"""The ``translation`` section: the translation task on real English-German pairs (the gettext
catalogues, :mod:`benchmarks.data`).

- the training loader's target tokens/s (num_workers paired) and the padding efficiency of its
  token-budget batches;
- target tokens/s of the task network's train step (label-smoothed loss, Adam) under post-LN,
  pre-LN and rescale on real batches;
- greedy decoding with the key/value cache against full recomputation at fixed output lengths,
  beam search beside them (:mod:`benchmarks.decoding`).

It needs the project's task package (``rescale_tasks``), which :mod:`benchmarks.sections` imports
only when the section runs.
"""
from __future__ import annotations

import gc

import torch

import rescale_core
from rescale_tasks.translation.dataset import BatchKey
from rescale_tasks.translation.vocab import BOS, EOS, PAD

from . import data, decoding
from .models import TRANSLATION_SCHEMES, translation_suite
from .timing import paired_repeats, timer_measure
from .toolkit import SectionResult, Settings, Table, ms_text, prepare_all, ratio_text, release, time_paired

__all__ = ["TRANSLATION_DEFAULTS", "section_translation"]

TRANSLATION_DEFAULTS = {
    "root": None,            # corpus folder (None: under the temp directory, kept between runs)
    "num_pairs": None,       # catalogue pairs used (None: all)
    "pairs": None,           # the English-German pairs (None: the system's gettext catalogues)
    "valid": 500, "test": 500,
    "vocab_size": 8000,      # joint SentencePiece vocabulary
    "max_tokens": 4096,      # the loader and padding-efficiency budget
    "workers": (0, 2),       # loader num_workers settings, paired
    "arch": "transformer_base",
    "overrides": {},         # TransformerConfig fields (smaller CPU sizes)
    "schemes": TRANSLATION_SCHEMES,
    "train_max_tokens": 4096,  # the budget of the timed training batches
    "train_batches": 8,      # real batches per timed call, spread over the batch widths
    "decode_batch": 16,      # sentences decoded together
    "lengths": (20, 50, 100),  # forced output lengths of the decoding timings
    "beam": 4,
}


def _spread(batches: list, widths: list[int], k: int) -> list:
    """``k`` batches at evenly spaced quantiles of ``widths`` (the batches' padded lengths)."""
    order = sorted(range(len(batches)), key=lambda i: (widths[i], i))
    k = max(1, min(k, len(order)))
    return [batches[order[int((j + 0.5) * len(order) / k)]] for j in range(k)]


def _translation_loader(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    res = data.translation_throughput(root, o["vocab_size"], tuple(o["workers"]), max_tokens=o["max_tokens"],
                                            repeats=repeats, min_run_time=settings.min_run_time,
                                            progress=settings.progress("translation"))
    result.metrics["translation.padding_efficiency"] = res.padding_efficiency
    rows = []
    for name in res.paired.names:
        tps = res.tokens_per_second(name)
        result.metrics[f"translation.loader.per_second.{name}"] = tps
        seconds = res.paired.seconds(name).median
        rows.append([name, f"{tps:.0f}", f"{res.sentences / seconds:.0f}", ms_text(seconds),
                     ratio_text(res.paired.ratio(name))])
    notes = [f"train loader of TranslationDataModule (token-budget batches, max_tokens {res.max_tokens}) "
             f"over {res.sentences} real En-De pairs (gettext catalogues, {root}), {res.batches} batches "
             f"and {res.target_tokens} target tokens per epoch; tok/s: real target tokens per second; "
             f"one measurement = one epoch with persistent workers; {res.paired.repeats} paired repeats",
             f"padding efficiency (real tokens / padded positions, source + target tensors): "
             f"{res.padding_efficiency:.4f} by rescale_tasks.translation.batching.padding_efficiency "
             f"of the epoch's batches, {res.tensor_efficiency:.4f} counted on the collated tensors"]
    result.tables.append(Table("Translation: training loader",
                               ["setting", "tok/s", "sentences/s", "ms/epoch",
                                f"time vs {res.paired.baseline}"], rows, notes))


def _translation_train(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    dm = data.translation_datamodule(root, o["vocab_size"], o["train_max_tokens"], 0)
    sampler = dm.train_dataloader().sampler
    dataset = dm.datasets["train"]
    width = lambda ids: int(max(dataset.src_sizes[ids].max(), dataset.tgt_sizes[ids].max()))  # noqa: E731
    chosen = _spread(sampler.batches, [width(b) for b in sampler.batches], o["train_batches"])
    batches = [dataset[BatchKey(ids)] for ids in chosen]
    suite = translation_suite(batches, dm.vocab_size, o["arch"], tuple(o["schemes"]),
                              max_tokens=o["train_max_tokens"], **o["overrides"])
    names = [c.name for c in suite.contenders]
    prepared = prepare_all(suite, names, settings, batch=0)
    paired = time_paired(prepared, suite.baseline, repeats, settings, "translation")
    base = suite.baseline
    rows = []
    for name in names:
        sec = paired.seconds(name).median
        tokens_vs = paired.ratio(base, name)  # time(base) / time(name) per repeat = tok/s ratio
        result.metrics[f"translation.train.per_second.{name}"] = suite.items / sec
        result.metrics[f"translation.train.tokens_vs_baseline.{name}"] = tokens_vs
        result.metrics[f"translation.train.vs_baseline.{name}"] = paired.ratio(name)
        rows.append([name, ms_text(sec / len(batches)), f"{suite.items / sec:.0f}", ratio_text(tokens_vs),
                     ratio_text(paired.ratio(name)), suite.contender(name).note])
    params = sum(p.numel() for p in next(iter(prepared.values())).model.parameters())
    config = next(iter(prepared.values())).model.config
    notes = [f"{suite.title} train step (TranslationModule's network: shared embeddings, label-smoothed "
             f"loss eps 0.1 / target tokens, Adam (0.9, 0.98) at lr 0), {suite.shape}; d_model "
             f"{config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} layers, ffn "
             f"{config.dim_feedforward}, {params / 1e6:.1f}M parameters; {settings.run_config.label()}; "
             f"one timed call = one step per batch; {paired.repeats} paired repeats after >= "
             f"{settings.warmup} warm-up steps each",
             "tok/s: real target tokens per second; tok/s vs X: time(X) / time per repeat (above 1: "
             "more tokens/s), time vs X: time / time(X); median [q1, q3] of per-repeat ratios; the "
             "fixed-shape train step, its memory and the no-LN floor: see the transformer section"]
    result.tables.append(Table(f"{suite.title}: train tokens/s",
                               ["model", "ms/step", "tok/s", f"tok/s vs {base}", f"time vs {base}", "note"],
                               rows, notes))
    release(prepared)


def _translation_decode(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    dm = data.translation_datamodule(root, o["vocab_size"], o["max_tokens"], 0)
    sources = dm.sources("valid")[:o["decode_batch"]]
    device, amp = settings.device, settings.amp_dtype
    src = torch.nn.utils.rnn.pad_sequence([dm.encode(s) for s in sources], batch_first=True,
                                          padding_value=PAD).to(device)
    scheme = "rescale" if "rescale" in o["schemes"] else o["schemes"][-1]
    torch.manual_seed(0)
    model = rescale_core.create_model(o["arch"], scheme=scheme, src_vocab_size=dm.vocab_size,
                                      share_embeddings=True, pad_index=PAD, **o["overrides"]).to(device).eval()
    sync = device.type == "cuda"
    measures, same = {}, {}

    def autocast(fn):
        def run():
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                return fn()
        return run

    lengths = [int(n) for n in o["lengths"]]
    for n in lengths:
        calls = decoding.decoders(model, src, bos=BOS, eos=EOS, length=n, beam=o["beam"], sync=sync)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            cached = calls["greedy, cached"]()
            recomputed = calls["greedy, recomputed"]()
        same[n] = int((cached == recomputed).all(dim=1).sum())
        for name, fn in calls.items():
            measures[f"{name}, {n} tokens"] = timer_measure(autocast(fn), min_run_time=settings.min_run_time,
                                                            label="translation decode", description=name)
    baseline = next(iter(measures))
    paired = paired_repeats(measures, baseline, repeats, progress=settings.progress("translation"))
    batch = src.size(0)
    rows = []
    for n in lengths:
        key_c, key_r = f"greedy, cached, {n} tokens", f"greedy, recomputed, {n} tokens"
        vs = paired.ratio(key_c, key_r)
        result.metrics[f"translation.decode.cached_vs_recomputed.{n}"] = vs
        for name in [k for k in measures if k.endswith(f", {n} tokens")]:
            sec = paired.seconds(name).median
            label = name[:-len(f", {n} tokens")]
            result.metrics[f"translation.decode.sentences_per_second.{label}.{n}"] = batch / sec
            rows.append([str(n), label, f"{batch / sec:.1f}", f"{sec / batch * 1e3:.2f}",
                         ratio_text(paired.ratio(name, key_r)),
                         f"{same[n]}/{batch}" if name in (key_c, key_r) else "-"])
    config = model.config
    notes = [f"{o['arch']} scheme={scheme} (d_model {config.d_model}, {config.num_encoder_layers}+"
             f"{config.num_decoder_layers} layers, vocab {dm.vocab_size}, untrained), eval mode, "
             f"{settings.run_config.label().replace(', contiguous', '')}; {batch} real validation sources "
             f"decoded together, every sentence forced to exactly n tokens then EOS (min_len = n, max_len = n)",
             "greedy, cached: rescale_core.generation.greedy_search (new_cache / decode_step); greedy, "
             "recomputed: the decoder over the whole prefix at every step, the output projection of the "
             "last position (benchmarks/decoding.py); beam, cached: rescale_core.generation.beam_search "
             "(no uncached beam search to pair with)",
             "ms/sentence: the batch's time / its sentences; time vs recomputed: time / time(greedy, "
             f"recomputed) at the same n, median [q1, q3] of per-repeat ratios; {paired.repeats} paired "
             "repeats (all lengths interleaved); same tokens: sentences whose cached and recomputed "
             "greedy outputs agree"]
    result.tables.append(Table("Translation: decoding at forced output lengths",
                               ["n", "search", "sentences/s", "ms/sentence", "time vs recomputed",
                                "same tokens"], rows, notes))
    del model
    gc.collect()


def section_translation(settings: Settings) -> SectionResult:
    o = {**TRANSLATION_DEFAULTS, **settings.translation}
    r = settings.repeats["translation"]
    root = data.translation_corpus(o["root"], o["num_pairs"], o["valid"], o["test"], pairs=o["pairs"])
    result = SectionResult("translation")
    _translation_loader(o, root, settings, result, r)
    _translation_train(o, root, settings, result, r)
    _translation_decode(o, root, settings, result, r)
    return result
