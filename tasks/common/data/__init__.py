"""What every task's data pipeline shares: the training order that resumes mid-epoch and matches
across process counts, whole batches spread over DDP ranks, batches left empty by bad files, the
throughput unit, images as the networks read them, and what the labels mean.

- ``sampling``: seeded samplers and loaders that resume mid-epoch; per-sample seeds; resume checks; how
  evaluation is sharded over processes (``eval_sampler``: each item counted once, whatever the strategy)
- ``batch_sampling``: whole batches built by a task (token budgets, aspect-ratio groups) over DDP ranks
- ``empty_batches``: a batch left empty by bad files is no step and no score
- ``throughput``: a task's throughput unit (images, clips, tokens) and its count per batch
- ``images``: any image Pillow opens, as 8-bit RGB with its tones kept and its orientation applied
- ``labels``: what a network's outputs mean, carried by checkpoints and matched to the data by name
- ``text``: text files in another encoding than UTF-8, named with the conversion that fixes them
- ``folders``: class folders on disk (``<split>/<class>/<file>``), what they hold besides the files read listed;
  file names written on Windows
- ``module``: the base of every task's data module
- ``preprocessing``: an evaluation transform described for a runtime (the export sidecar's ``preprocessing``)
"""
from .sampling import (MarkedPadding, PaddedEvalSampler, PerSampleSeed, ResumableDataLoader, ResumableSampler,
                       ResumeMismatch, UnrepeatedSampler, eval_sampler, keep_real, real_rows, check_resume, refused_resume, sample_seed, shards_parameters,
                       sigterm_safe_worker_init, worker_init)
from .batch_sampling import BatchListLoader, BatchListSampler
from .empty_batches import (SKIPPED, data_may_skip_files, is_skipped, must_skip, nothing_to_evaluate,
                            skipped_prediction, skipped_step)
from .throughput import batch_size, items_in, metric_key, run_metric_key, unit_of
from .images import (DECODE_ERRORS, HIGH_DEPTH_MODES, IMAGE_DECODING, CorruptImageError, full_scale, open_rgb,
                     orientation, oriented_size, say_large_image, to_rgb, unreadable_image)
from .labels import LABELS_KEY, Labels, checkpoint_labels, data_labels, match_labels
from .folders import found_path, nested_folders_hint, scan_class_folders, unnested
from .text import is_utf16, to_utf8_advice
from .module import DATA_KEY, FINGERPRINT_KEY, TaskDataModule, data_fingerprint, describe_fingerprint, same_data
from .preprocessing import LAYOUT_ONLY, describe_transforms

__all__ = ["MarkedPadding", "PaddedEvalSampler", "eval_sampler", "keep_real", "real_rows", "PerSampleSeed", "ResumableDataLoader", "ResumableSampler", "ResumeMismatch", "UnrepeatedSampler",
           "check_resume", "refused_resume", "sample_seed", "shards_parameters", "sigterm_safe_worker_init", "worker_init",
           "BatchListLoader", "BatchListSampler", "SKIPPED", "data_may_skip_files", "is_skipped", "must_skip",
           "nothing_to_evaluate", "skipped_prediction", "skipped_step", "batch_size", "items_in",
           "metric_key", "run_metric_key", "unit_of", "DECODE_ERRORS", "HIGH_DEPTH_MODES", "IMAGE_DECODING", "CorruptImageError", "full_scale",
           "say_large_image", "unreadable_image",
           "open_rgb", "orientation", "oriented_size", "to_rgb", "LABELS_KEY", "Labels", "checkpoint_labels",
           "data_labels", "match_labels", "found_path", "nested_folders_hint", "scan_class_folders", "unnested", "is_utf16", "to_utf8_advice", "TaskDataModule",
           "DATA_KEY", "FINGERPRINT_KEY", "data_fingerprint", "describe_fingerprint", "same_data", "LAYOUT_ONLY", "describe_transforms"]
