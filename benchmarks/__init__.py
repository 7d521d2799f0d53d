"""Benchmark harness (issue #5): ``python -m benchmarks`` from the repository root, or ``make bench``.

Train-step time and peak memory, eval throughput, RescaleNet's measuring steps, channels_last and
torch.compile variants for ResNet-50, the 3D ResNet and the Transformer against their normalized
baselines and no-normalization floors, and the classification DataLoader's throughput, measured
in one run as medians of paired ratios over interleaved repeats. A plain folder run from the
repository root (not installed). Modules: ``models`` (the contenders), ``steps`` (train/eval
steps), ``timing`` (paired repeats on torch.utils.benchmark.Timer), ``memory`` (peak training
memory), ``data`` (DataLoader throughput), ``sections`` (what each section measures),
``report`` (tables, goals, RESULTS.md).
"""
