"""Benchmark harness (issue #5): ``python -m benchmarks`` from the repository root, or ``make bench``.

Train-step time and peak memory, eval throughput, RescaleNet's measuring steps, channels_last and
torch.compile variants for ResNet-50, the 3D ResNet and the Transformer against their normalized
baselines and no-normalization floors, the classification DataLoader's throughput, and the
translation task (issue #12: loader tokens/s and padding efficiency on real En-De pairs, train
tokens/s of post-LN / pre-LN / rescale, decoding with the key/value cache against recomputation),
measured in one run as medians of paired ratios over interleaved repeats. A plain folder run from
the repository root (not installed). Modules: ``models`` (the contenders), ``steps`` (train/eval
steps), ``timing`` (paired repeats on torch.utils.benchmark.Timer), ``memory`` (peak training
memory), ``data`` (DataLoader throughput, the translation corpus), ``decoding`` (cached and
recomputed decoding), ``sections`` (what each section measures), ``report`` (tables, goals,
RESULTS.md).
"""
