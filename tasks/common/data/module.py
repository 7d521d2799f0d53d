"""The base of every task's data module."""
from __future__ import annotations

from typing import Any

import lightning.pytorch as L

__all__ = ["TaskDataModule"]


class TaskDataModule(L.LightningDataModule):
    """Lightning's data module, described without building its loaders.

    Lightning's ``__str__`` calls every ``*_dataloader`` method to report the datasets' sizes, which
    sets the data up. jsonargparse writes the data module into a debug message (formatted whether
    or not anything logs it) for each data -> model link whose attribute the data module lacks (a
    classification data module has no ``vocab_size``), so every ``rescale fit`` loaded its training
    data, or listed an image folder, while it built its objects, before any check had run
    (measured: 0.66 s of a 0.9 s MNIST-5k build). The text here is the class and its arguments
    (its hyper-parameters less the ``_class_path`` and ``_instantiator`` Lightning's CLI adds).

    The hyper-parameters it hands the loggers leave out those the model also has with another value
    (:attr:`hparams_initial`): Lightning merges both into one flat set and stopped every run with a
    traceback (``Error while merging hparams``) at such a name, as COCO's ``data.max_size`` (the
    training resize's long-side cap) next to ``model.max_size`` (the test-time one). The model's
    value is logged under the flat name; the data's stays in the logged config (``data``).
    The data order's ``seed`` is handed over as ``data_seed``: a flat ``seed`` beside the config's
    ``seed_everything`` read as the run's seed (every seed of ``rescale study --seeds`` showed 0).
    """

    @property
    def hparams_initial(self) -> Any:
        """The hyper-parameters as given, less those the attached model has with another value."""
        initial = super().hparams_initial
        module = getattr(getattr(self, "trainer", None), "lightning_module", None)
        if module is None:
            return _data_seed_named(initial)
        theirs = module.hparams_initial
        for key in [k for k in initial if k in theirs and k != "_class_path"]:
            mine, other = initial[key], theirs[key]
            try:
                differ = type(mine) is not type(other) or bool(mine != other)
            except Exception:  # values whose comparison is no truth value (tensors, arrays): never merged
                differ = mine is not other
            if differ:
                del initial[key]
        return _data_seed_named(initial)

    def __str__(self) -> str:
        arguments = {k: v for k, v in self.hparams.items() if not k.startswith("_")}
        return f"{type(self).__name__}({arguments})"


def _data_seed_named(hparams: Any) -> Any:
    """``seed`` (the data order's) as ``data_seed``, the name the run summary gives it too."""
    if "seed" in hparams:
        hparams["data_seed"] = hparams.pop("seed")
    return hparams
