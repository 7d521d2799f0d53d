"""Token-budget batches of similar lengths (fairseq's ``ordered_indices`` + ``batch_by_size``).

Order: by source size, then target size, then a seeded random tie-break (fairseq shuffles, then
stable-sorts by target and by source size; :func:`length_order` is the same order in one
``lexsort``). Evaluation splits break ties by index instead (deterministic).

Batches: walking that order, a batch grows while ``(n + 1) * max(size)`` stays within
``max_tokens``, where a pair's size is ``max(source, target)`` tokens including eos (fairseq's
``num_tokens``): the padded tensors of a batch then hold at most ``max_tokens`` positions each. A
pair larger than ``max_tokens`` forms a batch alone (training drops such pairs beforehand).
Deviation: fairseq's loop is Cython; here each batch is found with a few array operations over
the longest window it could fill, so 4.5M pairs batch in about a second in pure numpy.
"""
from __future__ import annotations

import numpy as np

__all__ = ["length_order", "batch_by_size", "padding_efficiency"]


def length_order(indices: np.ndarray, src_sizes: np.ndarray, tgt_sizes: np.ndarray,
                 seed: int | None) -> np.ndarray:
    """``indices`` sorted by (source size, target size, tie-break); seeded random ties, or
    ascending index when ``seed`` is None. ``sizes`` are indexed by pair id."""
    indices = np.asarray(indices, dtype=np.int64)
    if seed is None:
        ties = indices
    else:
        ties = np.random.default_rng([seed, 0x5EED]).permutation(len(indices))
    return indices[np.lexsort((ties, tgt_sizes[indices], src_sizes[indices]))]


def batch_by_size(ordered: np.ndarray, num_tokens: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Consecutive runs of ``ordered`` (pair ids) whose padded size fits ``max_tokens``.

    ``num_tokens[k]`` is the size of ``ordered[k]`` (aligned with ``ordered``, every value >= 1).
    Greedy as fairseq: a pair joins the current batch unless ``(n + 1) * max`` would exceed the
    budget. A batch starting with a pair of size s has at most ``max_tokens // s`` pairs, which
    bounds the window examined for it.
    """
    sizes = np.asarray(num_tokens, dtype=np.int64)
    batches, start, n = [], 0, len(sizes)
    while start < n:
        window = sizes[start:start + max(1, max_tokens // int(sizes[start]))]
        padded = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
        count = max(1, int(np.count_nonzero(padded <= max_tokens)))  # `padded` never decreases
        batches.append(ordered[start:start + count])
        start += count
    return batches


def padding_efficiency(batches: list[np.ndarray], src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> float:
    """Real tokens / padded positions over the source and target tensors of ``batches``."""
    real = padded = 0
    for batch in batches:
        s, t = src_sizes[batch], tgt_sizes[batch]
        real += int(s.sum() + t.sum())
        padded += len(batch) * int(s.max() + t.max())
    return real / padded if padded else 1.0
