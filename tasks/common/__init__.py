"""What every task shares, in subpackages by role; each imports only those listed before it
(``python -m tools.layering`` prints the layers and checks them):

- ``errors``: user-facing errors, one line each
- ``system/``: process and file plumbing (host memory, CPU cores, atomic files, locks, stop signals,
  decisions all processes of a run take together)
- ``data/``: samplers that resume mid-epoch, batches over DDP ranks, empty batches, throughput units,
  images, labels
- ``training/``: networks by name, optimizer and schedules (checked before any data work), speed
  switches, the callbacks every run has, a batch's network inputs
- ``checkpoints/``: checkpoint files, when a run writes them and how it resumes, architecture checks,
  ``rescale average-checkpoints``
- ``reporting/``: the W&B logger, progress lines, the probes' figures
- ``run/``: where a run's files go, its folder, ``run_summary.json``, its closing line, predictions
- ``module``: :class:`~.module.RescaleTaskModule`, the base of every task's LightningModule
- ``cli/``: ``rescale fit|validate|test|predict``: the suite's LightningCLI and its config handling
- ``export/``: ``rescale export``

Nothing is imported here: each subpackage loads when used, and names its classes itself
(jsonargparse saves a class by its shortest path: ``rescale_tasks.common.training.WarmupCosineLR``).
"""
