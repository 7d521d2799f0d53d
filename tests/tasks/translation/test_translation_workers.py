"""Translation's loaders take their worker count from the common cap: at most the
usable cores (tests/tasks/common/system/test_loader_workers.py covers the other tasks)."""
from __future__ import annotations

import os

from rescale_tasks.translation.data import TranslationDataModule


def test_translation_loaders_use_at_most_the_usable_cores(handful_root, tmp_path):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # a one-core machine
    try:
        data = TranslationDataModule(str(handful_root), vocab_size=100, num_workers=4, cache_dir=str(tmp_path),
                                     clean={"len_ratio": None}, persistent_workers=False)
        data.prepare_data()
        data.setup("fit")
        assert data.loader("train").num_workers == 1 and data.loader("valid").num_workers == 1
    finally:
        os.sched_setaffinity(0, before)
