"""The CPU cores this process may use, and the DataLoader workers a data module starts on them."""
from __future__ import annotations

import os

__all__ = ["usable_cores", "loader_workers"]


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a SLURM allocation, ``taskset``),
    not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def loader_workers(num_workers: int) -> int:
    """DataLoader worker processes for a data module's ``num_workers``: that many, at most the
    usable cores (the config's 4 or 8 stay the cap on a large machine; a small one gets no
    "suggested max number of worker" warning and no oversubscription). Every task's loaders
    take their count from here."""
    return min(int(num_workers), usable_cores())
