"""The private names of Lightning, W&B, jsonargparse and torch the suite relies on, in one place.

Each entry says what is used, where, and why no public API does it. They hold on the versions the
suite pins (:data:`PINS`, pyproject.toml); ``tests/tasks/common/test_private_apis.py`` checks every
entry on the installed versions (that the name exists, a method's parameters, a checkpoint key),
so an upgrade that moves one fails that test first, naming the entry, before the behaviour built
on it breaks somewhere deeper. Nothing here is imported by the suite at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["PrivateApi", "PRIVATE_APIS", "PINS"]

#: the distributions whose private names are used, as pyproject.toml pins them, and the version the
#: entries were checked on
PINS = {
    "lightning": "lightning>=2.6,<2.7 (checked on 2.6.6)",
    "wandb": "wandb>=0.31,<0.40 (checked on 0.31.0)",
    "jsonargparse": "jsonargparse[signatures]>=4.40,<5",
    "torch": "torch==2.14.1",
    "torchmetrics": "torchmetrics>=1.9,<2 (checked on 1.9.0)",
}


@dataclass(frozen=True)
class PrivateApi:
    """One private name: ``owner.name`` (``owner`` a module or a class, by its import path)."""

    owner: str
    name: str
    kind: str  # "method", "function", "attribute" (of an instance), "name" (of a module) or "checkpoint key"
    used_by: str  # the suite's code that relies on it
    why: str  # why no public API does it
    parameters: Optional[tuple[str, ...]] = None  # a method's or function's parameter names

    @property
    def distribution(self) -> str:
        """The distribution :data:`PINS` pins it by."""
        return self.owner.split(".")[0]


PRIVATE_APIS = (
    PrivateApi("lightning.pytorch.cli.LightningCLI", "_parse_ckpt_path", "method",
               "common/cli/lightning_commands.py: RescaleCLI._parse_ckpt_path",
               "the one step between parsing and instantiation where the configured model can be checked "
               "against --ckpt_path before Lightning replaces it with the checkpoint's hyper-parameters, "
               "and the user's own model arguments put back after", ("self",)),
    PrivateApi("lightning.pytorch.cli.LightningCLI", "_dump_config", "method",
               "common/cli/lightning_commands.py: RescaleCLI._dump_config",
               "where Lightning dumps the parsed config for the checkpoint's hyper-parameters, checking it "
               "a second time (as long as the parse itself): no public hook or option skips that", ("self",)),
    PrivateApi("lightning.pytorch.cli.LightningCLI", "config_dump", "attribute",
               "common/cli/lightning_commands.py: RescaleCLI._dump_config",
               "the dumped config that Lightning's instantiators read the model's and data's arguments from"),
    PrivateApi("lightning.pytorch.cli.LightningCLI", "_subcommand_parsers", "attribute",
               "common/cli/lightning_commands.py: RescaleCLI.parse_arguments",
               "the subcommand's parser, whose keys a one-line parse error suggests"),
    PrivateApi("lightning.pytorch.loggers.WandbLogger", "_experiment", "attribute",
               "common/reporting/wandb_logger.py: SuiteWandbLogger.started, .experiment, discard_run, current_run "
               "(common/run/summary.py)",
               "whether the W&B run has started, without starting it (the public experiment starts it); set to "
               "None by discard_run once a refused run's segment is removed, so nothing logs into it"),
    PrivateApi("lightning.pytorch.loggers.WandbLogger", "_wandb_init", "attribute",
               "common/reporting/wandb_logger.py: SuiteWandbLogger.__init__, label_runs",
               "the wandb.init arguments: the run name and group filled from the data's labels before the "
               "run starts, and Lightning's anonymous=None left out (W&B warns about it at every run)"),
    PrivateApi("lightning.pytorch.loggers.WandbLogger", "_name", "attribute",
               "common/reporting/wandb_logger.py: label_runs",
               "the run name Lightning keeps beside _wandb_init, set to the filled-in name"),
    *(PrivateApi(f"lightning.fabric.loggers.{logger}", name, "attribute",
                 "common/reporting/wandb_logger.py: label_runs", why)
      for logger in ("CSVLogger", "TensorBoardLogger")
      for name, why in (("_name", "the name (the run's folder under save_dir), filled from the data's labels before "
                                  "the folder is made"),
                        ("_experiment", "whether the logger has made its writer (and its folder), without making it"))),
    PrivateApi("lightning.pytorch.callbacks.WeightAveraging", "_average_model", "attribute",
               "common/training/ema.py: WeightEMA",
               "the averaged copy (an AveragedModel, None outside fit), which WeightEMA starts from the initial "
               "weights and which tells a fit (whose checkpoints hold both weights) from an evaluation"),
    PrivateApi("lightning.pytorch.callbacks.ModelCheckpoint", "_fs", "attribute",
               "common/checkpoints/callbacks.py: LastCheckpoint (a ModelCheckpoint without dirpath)",
               "the filesystem ModelCheckpoint chose from its dirpath in __init__: set again with the "
               "dirpath the suite gives it later"),
    PrivateApi("lightning.pytorch.loops.fit_loop._FitLoop", "_combined_loader", "attribute",
               "common/checkpoints/callbacks.py: _load_train_loader_state",
               "the training loader in use, to hand it the saved loader position Lightning drops when a "
               "module builds the loader before the loops are restored"),
    PrivateApi("lightning.pytorch.loops.fit_loop._FitLoop", "_combined_loader_states_to_load", "attribute",
               "common/checkpoints/callbacks.py: _load_train_loader_state", "the saved loader position"),
    PrivateApi("lightning.pytorch.utilities.combined_loader.CombinedLoader", "_load_state_dicts", "method",
               "common/checkpoints/callbacks.py: _load_train_loader_state", "loads the saved loader position",
               ("self", "states")),
    PrivateApi("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "_should_accumulate", "method",
               "common/training/callbacks.py: inside_accumulation_window (LastCheckpoint's signal handler, "
               "on_train_batch_start/_end, on_validation_end; RunSummary.on_train_batch_end; "
               "TranslationModule.train_batch)",
               "whether the batch ends an optimizer step: a stop signal waits for the step's last batch, "
               "the loss curve takes one point per step, and a translation update's logged loss is summed "
               "over the ranks once",
               ("self",)),
    PrivateApi("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "_should_check_val_fx", "method",
               "common/checkpoints/callbacks.py: _validates_after_this_step (LastCheckpoint's step saves)",
               "whether a validation follows the step just trained (Lightning's own rule), so that last.ckpt saved "
               "before it makes a resume run it", ("self", "data_fetcher")),
    PrivateApi("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "restarted_on_last", "attribute",
               "common/checkpoints/callbacks.py: _resumed_before_epoch_end (LastCheckpoint.on_train_start)",
               "whether the epoch loop restarts with its last batch counted completed, as a file saved at the end of "
               "an epoch's last step that no validation follows is marked (resume_point)"),
    PrivateApi("lightning.pytorch.loops.evaluation_loop._EvaluationLoop", "_has_run", "attribute",
               "common/checkpoints/callbacks.py: _resumed_before_epoch_end, _end_resumed_epoch",
               "a restarting epoch loop ends only once a validation has run: a resume with no batch and no "
               "validation left in its epoch is let through to the epoch's end, and the flag put back there"),
    PrivateApi("lightning.pytorch.loops.fit_loop._FitLoop", "_restarting", "attribute",
               "common/checkpoints/callbacks.py: _end_resumed_epoch",
               "the fit loop's restart flag, which skips the plateau schedules' step at the epoch's end: ended "
               "there for a resume that only runs that end (the public setter would restart it again for a run "
               "bounded by max_steps)"),
    PrivateApi("lightning.pytorch.loops.fit_loop._FitLoop", "_data_fetcher", "attribute",
               "common/checkpoints/callbacks.py: _validates_after_this_step",
               "the training data fetcher, which _should_check_val_fx reads (the epoch's last batch)"),
    # the fit loop's state in a checkpoint, which the suite sets to where an uninterrupted run goes on
    *(PrivateApi("lightning.pytorch.loops.fit_loop._FitLoop", key, "checkpoint key",
                 f"common/checkpoints/callbacks.py: {function}", why)
      for key, function, why in (
          ("epoch_loop.state_dict/_batches_that_stepped", "resume_point",
           "the loggers' step in a checkpoint taken mid-step by a stop signal"),
          ("epoch_loop.batch_progress", "resume_point",
           "the training batch progress in a checkpoint taken at the end of a step a validation follows, "
           "counted completed as in one a stop signal takes during that validation"),
          ("epoch_loop.val_loop.batch_progress", "resume_point",
           "the validation progress in a checkpoint taken during a validation (or at the end of the step "
           "before one), set so a resume redoes it"),
          ("epoch_progress", "reopen_epoch",
           "the epoch counters in last.ckpt saved at the end of an epoch that max_steps cut short, set back to "
           "the epoch still open so a resume goes on at its next batch"))),
    PrivateApi("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "_batches_that_stepped", "attribute",
               "common/checkpoints/callbacks.py: ResumeState.on_load_checkpoint, teardown",
               "the step the loggers log at: validate/test of a checkpoint set it to the checkpoint's (Lightning "
               "restores the loops only to fit, so they logged at step 0)"),
    PrivateApi("lightning.pytorch.Trainer", "_logger_connector", "attribute",
               "common/checkpoints/callbacks.py: _restore_epoch_sums",
               "the logger connector whose first-batch flag a mid-epoch resume sets (below)"),
    PrivateApi("lightning.pytorch.trainer.connectors.logger_connector.logger_connector._LoggerConnector",
               "_first_loop_iter", "attribute", "common/checkpoints/callbacks.py: _restore_epoch_sums",
               "self.log starts an epoch's sums afresh at a loop's first batch: a resumed run's first batch "
               "is one in the middle of its epoch, whose restored sums must be kept"),
    PrivateApi("lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop", "_results", "attribute",
               "common/checkpoints/callbacks.py: _epoch_sums, _restore_epoch_sums (ResumeState)",
               "the running sums of the values logged with on_epoch=True in training: Lightning saves none "
               "in a checkpoint, so a run resumed mid-epoch would average only the batches after the resume"),
    PrivateApi("lightning.pytorch.trainer.connectors.logger_connector.result._ResultMetric", "_computed",
               "attribute", "common/checkpoints/callbacks.py: _restore_epoch_sums",
               "the cached epoch value of a restored entry, cleared so it is computed from the restored sums"),
    PrivateApi("lightning.pytorch.trainer.connectors.logger_connector.result._ResultMetric", "_forward_cache",
               "attribute", "common/checkpoints/callbacks.py: _restore_epoch_sums",
               "the last step value of a restored entry, cleared with the sums it came from"),
    PrivateApi("lightning.pytorch.trainer.connectors.logger_connector.result._Sync", "_group", "attribute",
               "common/checkpoints/callbacks.py: _epoch_sums",
               "a logged value's process group: one logged with its own group is left out of the saved sums"),
    PrivateApi("torchmetrics.Metric", "_defaults", "attribute", "common/checkpoints/callbacks.py: _metric_states",
               "the names of a metric's states (its public state_dict holds none unless persistent)"),
    PrivateApi("torchmetrics.Metric", "_update_count", "attribute",
               "common/checkpoints/callbacks.py: _metric_states, _restore_epoch_sums",
               "how many updates a metric has had, restored with its states (compute warns at 0)"),
    PrivateApi("torchmetrics.Metric", "_computed", "attribute", "common/checkpoints/callbacks.py: _restore_epoch_sums",
               "the cached value of a restored metric, cleared so it is computed from the restored states"),
    PrivateApi("lightning.pytorch.trainer.connectors.signal_connector._SignalConnector", "register_signal_handlers",
               "method", "common/checkpoints/callbacks.py: LastCheckpoint._take_over_signals",
               "Lightning installs its SIGTERM handler here, before the sanity check and training start, "
               "where the suite takes the stop signals over and forwards them to it", ("self",)),
    PrivateApi("lightning.fabric.plugins.precision.amp", "_optimizer_handles_unscaling", "function",
               "common/training/clipping.py: pending_gradient_scale",
               "whether Lightning left fp16 AMP's gradients scaled for the optimizer's own step to unscale "
               "(a fused optimizer), Lightning's own test of it, so that AGC reads them as Lightning leaves them",
               ("optimizer",)),
    PrivateApi("lightning.fabric.utilities.cloud_io", "_is_local_file_protocol", "function",
               "common/checkpoints/files.py", "whether a checkpoint path is a local file (not s3://, gs://)",
               ("path",)),
    PrivateApi("lightning.pytorch.LightningModule", "_trainer", "attribute",
               "common/module.py, translation/module.py",
               "the trainer when one is attached, None otherwise (the public trainer raises when none is)"),
    PrivateApi("lightning.pytorch.LightningDataModule", "_hparams_initial", "attribute",
               "translation/data.py", "the hyper-parameters the data module reports, completed by what it "
               "read from its data"),
    PrivateApi("jsonargparse.ArgumentParser", "_subcommands_action", "attribute",
               "common/cli/parse_errors.py: _subcommands", "the subcommand names a parse error lists"),
    PrivateApi("jsonargparse.ArgumentParser", "_actions", "attribute", "common/cli/parse_errors.py: _parser_keys",
               "the option keys a parse error suggests (argparse's list of a parser's actions)"),
    PrivateApi("torch", "_foreach_norm", "name", "common/training/callbacks.py: DivergenceMonitor",
               "the norms of all gradients in one fused call (one host sync for the finiteness check)"),
    PrivateApi("torch", "_foreach_copy_", "name", "rescale_core/agc.py: adaptive_clip_grad_ (the agc_clip option)",
               "every clipped gradient written back from the one buffer AGC gathers them in, in one call"),
    PrivateApi("torch.distributed.fsdp._common_utils", "FSDP_WRAPPED_MODULE", "name",
               "rescale_core/analysis.py: residual_blocks (the learned scalars' names under FSDP)",
               "the attribute an FSDP unit holds its module by, in every qualified name through the unit; "
               "torch's public API gives no way to name a wrapped module as in the plain network"),
    PrivateApi("torch.nn.modules.conv", "_ConvNd", "name",
               "common/training/acceleration.py, rescale_core/analysis.py: dead_relu_fraction",
               "the base class of every convolution (1d, 2d, 3d, transposed)"),
    *(PrivateApi(owner, name, "name", f"rescale_core/layers.py: {user} (the plans' custom autograd functions)", why)
      for owner, name, user, why in (
          ("torch._C", "_are_functorch_transforms_active", "writes_into_buffers",
           "whether a torch.func transform (grad, vmap, jacrev) is tracing the call, where a buffer written by an "
           "out= op would not be batched or tracked: the check torch.autograd.Function.apply makes"),
          ("torch._C._functorch", "is_legacy_batchedtensor", "backward_writes_into_buffers",
           "whether a backward's gradient is batched by autograd's own vmap (is_grads_batched=True, "
           "jacobian(vectorize=True)), on which an out= op fails and which sets no flag a public call reads"))),
)
