"""``rescale compare`` reads the baseline's runs once per experiment, not once per variant: with many
variants the work stays linear in the runs."""
from __future__ import annotations

from rescale_tasks.studies.compare import compare_rows


class _Run(dict):
    """A run summary that counts how often its network and data are read."""

    reads = 0

    def get(self, key, default=None):
        if key in ("network", "data"):
            type(self).reads += 1
        return super().get(key, default)


def _runs(variants: int) -> list[dict]:
    def run(scheme: str, seed: int, c: float) -> dict:
        return {"group": "digits", "network": "cifar_resnet", "network_options": {"depth": 20}, "scheme": scheme,
                "scheme_options": {"c": c} if scheme == "rescale" else {}, "seed_everything": seed,
                "status": "finished", "steps": 10, "final": {"val/acc1": 0.9}, "best": {"val/acc1": 0.9},
                "data": {"class": "DigitsDataModule", "splits": {"val": {"count": 270, "hash": "ab"}}}}
    baseline = [_Run(run("bn", seed, 0.0)) for seed in range(3)]
    return baseline + [run("rescale", seed, float(c)) for c in range(1, variants + 1) for seed in range(3)]


def _baseline_reads(variants: int) -> int:
    _Run.reads = 0
    rows, _ = compare_rows(_runs(variants), "val/acc1")
    assert len(rows) == variants + 1 and rows[0]["role"] == "baseline" and not any(r["mixed"] for r in rows)
    return _Run.reads


def test_the_baselines_runs_are_read_as_often_for_two_variants_as_for_twenty():
    assert _baseline_reads(2) == _baseline_reads(20)
