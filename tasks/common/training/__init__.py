"""What training a task's network takes: the network built by name, the optimizer over the core's
parameter groups and its schedule (both checked before any data work), the speed switches, the
callbacks every run has, and the network's inputs taken from a batch.

- ``networks``: ``rescale_core`` networks built from a task config, one-line errors for bad names
- ``optim``: the optimizer over the core's parameter groups, and its learning-rate schedule
- ``schedules``: learning-rate schedules stepped every optimizer step (warm-up, multi-step, cosine)
- ``class_paths``: the class a config's ``class_path`` names
- ``optim_check``: the configured optimizer and schedule, checked before any data work
- ``acceleration``: channels_last and ``torch.compile`` of the network, checkpoint keys kept
- ``callbacks``: divergence detection and learned-scalar logging
- ``ema``: an exponential moving average of the weights as a training option (the official NF code's)
- ``clipping``: adaptive gradient clipping as a training option: its checks, the layers it leaves alone
- ``inputs``: the network's positional inputs taken from a batch, whatever the task
"""
from .networks import check_network, create_network, default_scheme, resolved_architecture
from .optim import accepts, build_optimizer, build_scheduler, default_sgd, training_state_differences
from .schedules import ConstantLR, InverseSqrtLR, IterationMultiStepLR, WarmupCosineLR, WarmupMultiStepLR
from .class_paths import class_of, init_parameters
from .optim_check import check_lr_batch, check_optimization, warn_unscaled_lr
from .acceleration import as_memory_format, compile_in_place, memory_format_of, use_channels_last
from .callbacks import (DivergenceMonitor, LearnedScalarsLogger, TrainingDiverged, inside_accumulation_window,
                        optimizer_step_due)
from .ema import WeightEMA, ema_decay_at
from .clipping import (check_agc_is_on, check_agc_options, clipped_parameters, output_layers,
                       pending_gradient_scale)
from .inputs import batch_size_of, network_inputs, take_samples

__all__ = ["check_network", "create_network", "default_scheme", "resolved_architecture", "accepts",
           "build_optimizer", "build_scheduler", "default_sgd", "training_state_differences", "ConstantLR",
           "InverseSqrtLR", "IterationMultiStepLR",
           "WarmupCosineLR", "WarmupMultiStepLR", "class_of", "init_parameters", "check_lr_batch", "check_optimization",
           "warn_unscaled_lr", "as_memory_format",
           "compile_in_place", "memory_format_of", "use_channels_last", "DivergenceMonitor",
           "LearnedScalarsLogger", "TrainingDiverged", "inside_accumulation_window", "optimizer_step_due", "WeightEMA", "ema_decay_at", "check_agc_is_on", "check_agc_options", "clipped_parameters", "output_layers",
           "pending_gradient_scale",
           "batch_size_of", "network_inputs", "take_samples"]
