"""Benchmark harness: ``python -m benchmarks`` from the repository root, or ``make bench``.

Train-step time and peak memory, eval throughput, RescaleNet's measuring steps, channels_last, each
execution plan eager and under torch.compile for ResNet-50, the 3D ResNet and the Transformer against their normalized
baselines and no-normalization floors, the classification DataLoader's throughput, the translation
task (loader tokens/s and padding efficiency on real En-De pairs, train tokens/s of post-LN / pre-LN
/ rescale, decoding with the key/value cache against recomputation), Mask R-CNN R50-FPN with
FrozenBN, GN and rescale50 backbones (train step, inference images/s) and the video loader's clips/s
against the 3D train step, measured in one run as medians of paired ratios over interleaved repeats.
A plain folder run from the repository root (not installed). Modules: ``models`` (the contenders),
``steps`` (train/eval steps), ``timing`` (paired repeats on torch.utils.benchmark.Timer), ``memory``
(peak training memory), ``toolkit`` (settings, tables, results, building and timing contenders),
``suites`` (the train, eval, measuring and variant measurements of a suite), ``data`` (DataLoader
throughput, the translation corpus), ``decoding`` (cached and recomputed decoding), ``opcount``,
``plans``, ``translation``, ``detection`` and ``video_loader`` (those sections), ``sections`` (the
sections by name), ``report`` (tables, goals, RESULTS.md).
"""
