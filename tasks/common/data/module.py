"""The base of every task's data module."""
from __future__ import annotations

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
    """

    def __str__(self) -> str:
        arguments = {k: v for k, v in self.hparams.items() if not k.startswith("_")}
        return f"{type(self).__name__}({arguments})"
