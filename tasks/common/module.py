"""What every task's LightningModule does the same way: build its ``rescale_core`` network by
name, scheme and options; the speed switches (channels_last, ``torch.compile``); the optimizer
over the core's parameter groups and a per-step or per-epoch schedule; and refusing, in one line,
a checkpoint of another architecture. A task module subclasses :class:`RescaleTaskModule` and
adds only its steps, losses and metrics. What its labels mean travels in every checkpoint and is
matched to the data's by name when a checkpoint meets data (:mod:`.data.labels`). What ``predict``
writes goes where ``test`` writes, named by the split it predicted (:meth:`RescaleTaskModule.write_predictions`,
:mod:`.run.predictions`).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable, Optional

import lightning.pytorch as L
import torch

import rescale_core
from rescale_core.agc import adaptive_clip_grad_

from .checkpoints import check_checkpoint_compatible, trained_config_fix
from .data import (FINGERPRINT_KEY, LABELS_KEY, Labels, batch_size, checkpoint_labels, data_fingerprint, data_labels,
                   data_may_skip_files, describe_fingerprint, match_labels, must_skip, nothing_to_evaluate, same_data,
                   shards_parameters, skipped_prediction, skipped_step)
from .errors import ConfigError
from .run import PREDICTIONS_FILE, write_result
from .system import CODE_KEY, code_version, quiet_dependency_warnings
from .training import (accepts, as_memory_format, build_optimizer, build_scheduler, check_agc_options,
                       clipped_parameters, compile_in_place, create_network, default_sgd, output_layers,
                       pending_gradient_scale, resolved_architecture, training_state_differences,
                       use_channels_last)

__all__ = ["RescaleTaskModule", "OptimizerFactory", "SchedulerFactory", "accepts"]

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable], torch.optim.Optimizer]
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


class RescaleTaskModule(L.LightningModule):
    """The base of every task module. A task module's constructor takes ``network``, ``scheme``
    and its own arguments, and hands everything else (``**options``: the keyword-only arguments
    below) to this one; the CLI reads them from here (jsonargparse follows ``**options`` to this
    signature), and every argument of both ends up in ``hparams`` and the checkpoint.

    Steps: Lightning's ``training_step``, ``validation_step``, ``test_step`` and ``predict_step``
    live here, and pass a batch without samples over (every file of it bad and skipped:
    :mod:`.data.empty_batches`) the same way for every task; a task implements
    :meth:`train_batch`, :meth:`evaluate_batch` and :meth:`predict_batch` for the others.

    Args:
        network: a name from ``rescale_core.list_models()``.
        scheme: residual scheme (None: the network's own, e.g. ``rescale50`` fixes ``rescale``).
        scheme_options: overrides of scheme fields (``c``, ``gain``, ``measure_batches`` ...).
        network_options: family arguments (``depth``, ``width``, ``base_width`` ...).
        optimizer: optimizer factory (config: ``class_path``/``init_args``); its ``lr`` and
            ``weight_decay`` are the base values the parameter groups scale. Default: SGD at lr
            0.1, momentum 0.9, weight decay 1e-4 (:func:`~.training.optim.default_sgd`).
        lr_scheduler: scheduler factory; schedules of :mod:`rescale_tasks.common.training.schedules` get
            ``steps_per_epoch`` and ``max_epochs`` and step every optimizer step, plain torch
            schedulers step every epoch.
        norm_weight_decay: weight decay of norm-layer weights, DyT's and Derf's per-feature weight
            included (None: the optimizer's).
        channels_last: weights and input batches in channels_last memory format (conv networks).
        compile: ``torch.compile`` the network (:meth:`compiled_part`: a detector compiles its
            backbone; in place: checkpoints keep their keys, and load
            into an eager module and back). RescaleNet's measuring steps run eagerly; then one
            graph for training and one for evaluation, with no graph break.
        compile_mode: ``torch.compile``'s mode: None (default), ``reduce-overhead`` (CUDA graphs:
            no per-op launch cost in the steady state, on a GPU), ``max-autotune`` ...
        plan: the execution plan of the normalization-free blocks (:mod:`rescale_core.plans`):
            ``auto`` (lean on a GPU, folded on the CPU), ``lean`` (fewest ops per step, for an
            eager GPU step and for compiling), ``folded`` (fewest passes over the activations, for
            CPUs) or ``reference``; the same function and checkpoint under each.
        compile_options: further ``torch.compile`` arguments (``backend``, ``dynamic`` ...).
        agc_clip: Adaptive Gradient Clipping (Brock et al., ICML 2021; :mod:`rescale_core.agc`) at
            this threshold lambda (the paper's 0.01 at batch 4096, larger at smaller batches); None:
            off. Applied to the final gradients before every optimizer step
            (:meth:`configure_gradient_clipping`), before the Trainer's ``gradient_clip_val``, if set.
        agc_eps: the floor of a unit's weight norm in AGC (1e-3: a zero-initialised gain still
            learns).
        agc_clip_classifier: clip the network's output layers too (:meth:`output_layers`: the
            final linear layer, which the paper leaves unclipped; a detector's predictors).
        network_kwargs: what the task module adds to the network's arguments (``num_classes``,
            ``vocab_size`` ...: its own arguments, recorded as those, not here).
    """

    # handed to this constructor by the task module itself, never a configuration key
    internal_init_arguments = ("network_kwargs",)

    def __init__(self, network: str, scheme: Optional[str] = None, *,
                 scheme_options: Optional[dict[str, Any]] = None,
                 network_options: Optional[dict[str, Any]] = None,
                 optimizer: OptimizerFactory = default_sgd,
                 lr_scheduler: Optional[SchedulerFactory] = None,
                 norm_weight_decay: Optional[float] = None, channels_last: bool = False,
                 compile: bool = False, compile_mode: Optional[str] = None, plan: str = "auto",
                 compile_options: Optional[dict[str, Any]] = None, agc_clip: Optional[float] = None,
                 agc_eps: float = 1e-3, agc_clip_classifier: bool = False,
                 network_kwargs: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        if plan not in rescale_core.PLANS:
            raise ConfigError(f"model.init_args.plan={plan!r} is not an execution plan; use one of "
                              f"{', '.join(rescale_core.PLANS)} (auto: lean on a GPU, folded on the CPU)")
        check_agc_options(agc_clip, agc_eps)
        self.agc_clip, self.agc_eps, self.agc_clip_classifier = agc_clip, agc_eps, agc_clip_classifier
        kwargs = dict(network_options or {}, **(network_kwargs or {}))
        if scheme is not None:
            kwargs["scheme"] = scheme
        if scheme_options:
            kwargs["scheme_options"] = dict(scheme_options)
        self.net = self.build_network(network, **kwargs)
        self.scheme_name = getattr(getattr(self.net, "scheme", None), "name", scheme or "unknown")
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.norm_weight_decay = norm_weight_decay
        rescale_core.set_plan(self.net, plan)
        self.memory_format = use_channels_last(self.net) if channels_last else None
        #: what the network's outputs mean (the checkpoint's labels, else the data's it trains on)
        self.trained_labels: Optional[Labels] = None
        self._label_order: Optional[torch.Tensor] = None  # data label -> network label; None: the same
        self._unlabelled_checkpoint: Optional[str] = None
        self._label_notes: set[str] = set()
        self._may_skip_batches = True  # until setup knows the data module
        if compile:
            compile_in_place(self.compiled_part(), **{**({"mode": compile_mode} if compile_mode else {}),
                                                      **(compile_options or {})})
        # the arguments of this constructor and of the task module's (Lightning reads both frames);
        # the factories are rebuilt from the config, the network's task arguments are the task's own
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", "network_kwargs"])

    def compiled_part(self) -> torch.nn.Module:
        """What ``compile`` compiles: the whole network; a task whose network holds parts that no
        graph can hold (a detector's proposals and sampling) names the part that one can."""
        return self.net

    def build_network(self, network: str, **kwargs: Any) -> torch.nn.Module:
        """The task's network: ``create_network(network, **kwargs)``; a task whose network wraps
        the core model (a detector around a backbone) overrides this, as may a task module of
        one's own outside the suite to build a network outside ``rescale_core``'s registry (a
        torchvision model, a module of one's own): the ``rescale`` CLI then leaves ``network``
        to it (docs/cli.md, "Configs")."""
        return create_network(network, **kwargs)

    def as_input(self, x: torch.Tensor) -> torch.Tensor:
        """An input batch in the network's memory format (channels_last when asked for)."""
        return as_memory_format(x, self.memory_format)

    def network_inputs(self, batch) -> tuple:
        """The network's positional inputs taken from a batch of this task (the analysis probes
        run the network on them); by default the batch's first element."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return (self.as_input(x),)

    # --- steps ----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        quiet_dependency_warnings()  # a ddp_spawn rank is a fresh interpreter, without the command's filters
        # the same on every rank (one config): every rank votes in training_step, or none does
        self._may_skip_batches = data_may_skip_files(self._datamodule())
        if stage == "fit" and self.agc_clip is not None:
            self._check_agc_strategy(self.trainer.strategy)

    def training_step(self, batch, batch_idx: int):
        if must_skip(batch_size(batch), self._may_skip_batches):  # no sample here, or on another rank
            return skipped_step(self)
        return self.train_batch(batch, batch_idx)

    def validation_step(self, batch, batch_idx: int):
        return self.evaluate_nothing() if nothing_to_evaluate(batch) else self.evaluate_batch(batch, "val")

    def test_step(self, batch, batch_idx: int):
        return self.evaluate_nothing() if nothing_to_evaluate(batch) else self.evaluate_batch(batch, "test")

    def predict_step(self, batch, batch_idx: int):
        if nothing_to_evaluate(batch):
            self.evaluate_nothing()
            return skipped_prediction()
        return self.predict_batch(batch)

    def evaluate_nothing(self) -> None:
        """What an evaluation step (validate, test, predict) does with a batch left without samples
        (every file of it unreadable and skipped, :mod:`.data.empty_batches`): nothing, and it counts
        nothing. A task whose evaluation batches are not evened out over the ranks by a stand-in item
        (:func:`~.data.eval_sampler`) runs a forward on a stand-in input here, counted nowhere: under a
        strategy that shards the parameters every rank must run as many forwards as the others."""
        return None

    def train_batch(self, batch, batch_idx: int):
        """The task's training step on a batch that has samples: its loss (or Lightning's dict)."""
        raise NotImplementedError(f"{type(self).__name__} does not train: it defines no train_batch")

    def evaluate_batch(self, batch, stage: str):
        """The task's evaluation of a batch that has samples, for ``stage`` ``"val"`` or ``"test"``."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate: it defines no evaluate_batch")

    def predict_batch(self, batch):
        """The task's predictions for a batch that has samples."""
        raise NotImplementedError(f"{type(self).__name__} does not predict: it defines no predict_batch")

    # --- checkpoints ----------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint of another network, scheme or task size (runs
        before the weights are loaded, which would fail with a page of key/shape mismatches; a
        scheme's training-only options may differ unless ``fit`` resumes the checkpoint),
        then match the labels it was trained on to the data's (:mod:`.data.labels`)."""
        trainer = self._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        source = f"checkpoint {path}" if path else "the checkpoint"
        self._refuse_other_classes(checkpoint, source)
        check_checkpoint_compatible(checkpoint, self.hparams, self.state_dict(), source=source,
                                    strict=self.strict_loading, normalize=resolved_architecture,
                                    ckpt_path=str(path) if path else None,
                                    evaluating=trainer is None or trainer.state.fn != "fit")
        self.check_checkpoint_data(checkpoint)
        self.trained_labels = checkpoint_labels(checkpoint, source, self._datamodule())
        self._unlabelled_checkpoint = source if self.trained_labels is None else None
        self._match_data_labels()
        resumed = trainer is not None and trainer.state.fn == "fit" and bool(checkpoint.get("optimizer_states"))
        if resumed:  # after the labels' and the task's own refusals, which say more than "other data"
            self._check_resumed_data(checkpoint, source, str(path) if path else None)
            self._resumed_training = (checkpoint["optimizer_states"], checkpoint.get("lr_schedulers") or [], source,
                                      str(path) if path else None)
            if trainer.optimizers:  # a strategy that restores after its setup (FSDP): the run's are built
                self._check_resumed_training()

    def _refuse_other_classes(self, checkpoint: dict[str, Any], source: str) -> None:
        """A checkpoint of another class count whose recorded labels the data's do not hold: the line
        names the classes the data lacks or adds (:func:`~.data.labels.match_labels`), the cause,
        not the class count the architecture check would name (its fix, "run with the config the
        checkpoint was trained with", misleads where the config is that one and the data lost a
        class folder). Without recorded labels, or labels of which the data holds none (another
        data set), the architecture check says what it can."""
        saved = (checkpoint.get("hyper_parameters") or {}).get("num_classes")
        current = self.hparams.get("num_classes") if hasattr(self.hparams, "get") else None
        if saved is None or current is None or saved == current:
            return
        trained, data = checkpoint_labels(checkpoint, source, self._datamodule()), data_labels(self._datamodule())
        if trained is not None and data is not None and set(trained.names) & set(data.names):
            match_labels(trained, data)  # (sharing no label, it is another data set: the architecture line)

    def check_checkpoint_data(self, checkpoint: dict[str, Any]) -> None:
        """A task's own refusals of data the checkpoint cannot be read with (e.g. translation: another
        language pair, another SentencePiece model), in one line each: they run before the data
        fingerprint's check of a resume, whose line says only that the data differs."""

    #: ``rescale fit --resume_other_data true`` (set by the CLI): a resume whose checkpoint's run read
    #: other data than this run reads goes on (with a warning) instead of being refused
    resume_other_data: bool = False

    def _check_resumed_data(self, checkpoint: dict[str, Any], source: str, ckpt_path: Optional[str]) -> None:
        """Refuse, in one line, a ``fit --ckpt_path`` whose checkpoint's run read other data than
        this run reads (its data fingerprint, :meth:`~.data.TaskDataModule.data_fingerprint`: another
        class set, a changed split, another corpus): training on would pool two data sets into one
        run, its curves and its ``run_summary.json``. ``--resume_other_data true`` goes on with a
        warning; a checkpoint written before checkpoints carried a fingerprint resumes unchecked
        (one line says so). Evaluating a checkpoint on other data is never refused."""
        current = data_fingerprint(self._datamodule())
        if current is None:
            return
        saved = checkpoint.get(FINGERPRINT_KEY)
        if not isinstance(saved, dict):
            self._say(f"{source} records no data fingerprint (written before checkpoints carried one): resuming "
                      "without checking that its run read the data this run reads")
            return
        if same_data(saved, current):
            return
        what = (f"{source} was trained on other data than this run reads ({describe_fingerprint(saved, root=True)} "
                f"-> {describe_fingerprint(current, root=True)}, checkpoint -> this run)")
        if self.resume_other_data:
            if self._trainer is None or self._trainer.is_global_zero:
                log.warning(f"warning: {what}; resuming on this run's data (--resume_other_data): the run's curves "
                            "and summary pool both")
            return
        raise ConfigError(f"{what}, and resuming would pool both into one run: "
                          + trained_config_fix("resume with the data the run was trained on ({config}), drop "
                                               "--ckpt_path to start a new run on this data, or pass "
                                               "--resume_other_data true to train on with it", ckpt_path))

    def _check_resumed_training(self, optimizers: Optional[list] = None, schedulers: Optional[list] = None) -> None:
        """Refuse, in one line, a ``fit --ckpt_path`` whose checkpoint's optimizer or schedule was
        configured otherwise than this run's (another lr, weight decay, schedule, or the cosine's
        ``max_epochs``): Lightning restores the checkpoint's over the run's, which would train on
        with settings the run's config and ``rescale_config.yaml`` do not say. Runs once, as soon as
        the run's optimizers are built (``optimizers``/``schedulers``: those just built by
        :meth:`configure_optimizers`; else the Trainer's) and before Lightning restores the saved
        ones: from :meth:`configure_optimizers`, before any callback's ``on_fit_start`` saves the
        run's config and starts its W&B run, so a refused resume leaves no W&B segment of the run's
        id to ``wandb sync``."""
        resumed, self._resumed_training = getattr(self, "_resumed_training", None), None
        if resumed is None:
            return
        saved_optimizers, saved_schedulers, source, ckpt_path = resumed
        if optimizers is None:
            optimizers = self.trainer.optimizers
            schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        differences = training_state_differences(saved_optimizers, saved_schedulers, optimizers, schedulers or [])
        if differences:
            raise ConfigError(f"{source} was trained with another optimizer or learning-rate schedule than this run "
                              f"configures ({'; '.join(differences)}, checkpoint -> this run), and resuming restores "
                              "the checkpoint's: "
                              + trained_config_fix("resume with the config the run was trained with ({config}), or drop "
                                                   "--ckpt_path to start a new run with these", ckpt_path))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the labels the network was trained on, the code that trained it (under
        ``code``: :func:`~.system.provenance.code_version`; a checkpoint written before has none) and
        the data (under ``data_fingerprint``: :meth:`~.data.TaskDataModule.data_fingerprint`, which
        :meth:`_check_resumed_data` compares on resume; a checkpoint written before has none)."""
        checkpoint[CODE_KEY] = code_version()
        fingerprint = data_fingerprint(self._datamodule())
        if fingerprint is not None:  # which data it was trained on: a resume on other data is refused
            checkpoint[FINGERPRINT_KEY] = fingerprint
        labels = self.trained_labels or data_labels(self._datamodule())
        if labels is not None:
            checkpoint[LABELS_KEY] = labels.to_checkpoint()

    def export_metadata(self, datamodule: Any, folder: str, stem: str) -> dict[str, Any]:
        """What ``rescale export`` writes beside the files for a runtime to turn the outputs into
        results: the class names in output order (``classes``; ``class_ids``: the data set's ids of
        them, where it numbers them) and the data module's ``export_preprocessing()``, where it says.
        A task that needs more files (a tokenizer) writes them in ``folder`` as ``<stem>.<name>``."""
        labels = self.trained_labels or data_labels(datamodule)
        metadata: dict[str, Any] = {"classes": None if labels is None else list(labels.names)}
        if labels is not None and labels.ids is not None:
            metadata["class_ids"] = list(labels.ids)
        preprocessing = getattr(datamodule, "export_preprocessing", None)
        if callable(preprocessing):
            metadata["preprocessing"] = preprocessing()
        return metadata

    # --- what the labels mean -------------------------------------------------------------
    def _datamodule(self) -> Any:
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def _match_data_labels(self) -> None:
        """Match the network's labels to the data module's (every stage starts here, after any
        checkpoint is loaded): the order that maps the data's onto the network's, or one line
        refusing data with other label names. A network without labels yet learns the data's."""
        data = data_labels(self._datamodule())
        if data is None:
            self._label_order = None
            return
        if self.trained_labels is None:
            if self._unlabelled_checkpoint:
                self._say(f"labels: {self._unlabelled_checkpoint} records no label names (written before "
                          f"checkpoints carried them); its outputs are taken to follow {data.source}")
            self.trained_labels, self._label_order = data, None
            return
        order, note = match_labels(self.trained_labels, data)
        self._label_order = None if order is None else torch.tensor(order, dtype=torch.long)
        if note:
            self._say(note)

    def _say(self, line: str) -> None:
        """Log ``line`` once per run, on the first process."""
        if line not in self._label_notes and (self._trainer is None or self._trainer.is_global_zero):
            log.info(line)
        self._label_notes.add(line)

    def on_fit_start(self) -> None:
        self._check_resumed_training()
        self._refuse_fullgraph_while_measuring()
        self._match_data_labels()

    def _refuse_fullgraph_while_measuring(self) -> None:
        """``compile_options: {fullgraph: true}`` with mean-shift layers still to measure: the first
        training step's measuring runs eagerly (a graph break), which dynamo refuses with a page of
        traceback after compiling; one line instead, before anything is compiled (the weights of
        ``--ckpt_path`` are loaded by now: a run past its measuring compiles whole)."""
        if not (self.hparams.get("compile") and (self.hparams.get("compile_options") or {}).get("fullgraph")):
            return
        if any(m.measuring for m in rescale_core.mean_shift_layers(self.compiled_part())):
            raise ConfigError(f"model.init_args.compile_options fullgraph: true cannot compile this run's first "
                              f"steps: {rescale_core.layers.MEASURING_RUNS_EAGERLY}. Drop fullgraph (measuring ends "
                              "with one recompile), or resume with --ckpt_path from a checkpoint past those steps")

    def on_validation_start(self) -> None:
        self._match_data_labels()

    def on_test_start(self) -> None:
        self._match_data_labels()

    def on_predict_start(self) -> None:
        self._match_data_labels()

    def network_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The data's label indices as the network's (the checkpoint's order, :mod:`.data.labels`);
        unchanged when the two agree."""
        if self._label_order is None:
            return labels
        return self._label_order.to(labels.device)[labels]

    # --- what predict writes ---------------------------------------------------------------
    #: the data split ``predict`` reads (the data module's ``predict_dataloader``), naming its file
    predict_split = "test"

    def write_predictions(self, ext: str, data: str, count: int, unit: str = "predictions") -> str:
        """``predictions.<split>.<ext>`` written whole in the results folder (where ``test`` writes:
        ``--output_dir``, else beside the checkpoint's run) and named in the command's closing line
        (``count`` ``unit``); returns its path. Rank 0 calls it, once the rows of every rank are
        gathered (:mod:`.run.predictions`)."""
        name = PREDICTIONS_FILE.format(split=self.predict_split, ext=ext)
        return write_result(self.trainer, name, data, count, unit)

    # --- optimisation ---------------------------------------------------------------------
    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ConfigError(f"{type(self).__name__} has no optimizer: set model.init_args.optimizer "
                              "(class_path/init_args, e.g. torch.optim.SGD)")
        optimizer = build_optimizer(self.net, self.optimizer_factory, self.norm_weight_decay)
        factory = self.scheduler_factory
        if factory is None:
            self._check_resumed_training([optimizer], [])
            return optimizer
        max_epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else None
        steps_per_epoch = self._steps_per_epoch()
        scheduler, interval = build_scheduler(factory, optimizer, steps_per_epoch, max_epochs)
        self._check_resumed_training([optimizer], [scheduler])  # before anything of the run is written
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    # --- adaptive gradient clipping ----------------------------------------------------------
    def output_layers(self) -> list[torch.nn.Module]:
        """The layers whose outputs are the network's outputs, which AGC leaves unclipped unless
        ``agc_clip_classifier`` (the paper's final linear layer): by default the network's last
        ``nn.Linear`` (:func:`~.training.clipping.output_layers`: ``fc``, VGG's
        ``classifier[-1]``, the Transformer's ``output_projection``); a task whose network ends
        otherwise (a detector's predictors) names its own."""
        return output_layers(self.net)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer,
                                    gradient_clip_val: Optional[float] = None,
                                    gradient_clip_algorithm: Optional[str] = None) -> None:
        """AGC (``agc_clip``), then the Trainer's own clipping (``gradient_clip_val``), on the
        gradients the optimizer is about to step with.

        Why this hook (Lightning 2.6, ``plugins/precision/precision.py`` ``Precision._after_closure``
        and ``amp.py`` ``MixedPrecision.optimizer_step``): Lightning calls it once per optimizer
        step, inside ``optimizer.step``'s closure wrapper, after the closure has run every
        backward of the step; after ``scaler.unscale_`` under fp16 AMP (a GradScaler's step
        then still skips a step whose unscaled gradients were not finite: ``unscale_`` recorded
        that before AGC ran; bf16 and fp32 have no scaler; an optimizer that unscales in its own
        step, ``fused=True``, gets its gradients still scaled, and AGC clips them at lambda times
        the scale: :func:`~.training.clipping.pending_gradient_scale`); and after every callback's and
        this module's ``on_before_optimizer_step`` (the divergence monitor checks the raw gradients).
        With gradient accumulation it runs only at the step that closes the window, on the
        accumulated gradients (the batch gradient the paper clips). Under DDP the gradients are
        all-reduced by DDP's bucket hooks during the last backward of the window, the one run by
        this step's closure (``loops/optimization/automatic.py``: only the earlier backwards of
        the window run under ``_block_parallel_sync_behavior``, i.e. DDP's ``no_sync``), so
        every rank clips the same averaged gradients and the ranks stay identical (the 2-process
        test in ``tests/tasks/common/training/test_plans_and_compile.py`` trains with AGC and
        ends with the weights of one process given the global batch). The module's
        ``on_before_optimizer_step`` sees the same gradients; this hook is the one meant for
        changing them, and it takes the Trainer's clipping settings, so both clippings run here
        in a stated order. Not called under manual optimization (no task
        uses it) nor under DeepSpeed, which clips itself: sharded strategies are refused at fit
        start (:meth:`_check_agc_strategy`)."""
        if self.agc_clip is not None:
            excluded = None if self.agc_clip_classifier else self.output_layers()
            # an optimizer that unscales in its step (fused=True) sees fp16 AMP's scaled gradients here
            scale = pending_gradient_scale(self.trainer.precision_plugin, optimizer)
            adaptive_clip_grad_(clipped_parameters(optimizer, excluded), self.agc_clip * scale, self.agc_eps)
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    @staticmethod
    def _check_agc_strategy(strategy: Any) -> None:
        """Refuse AGC under a strategy whose ranks hold shards of the parameters (FSDP, DeepSpeed,
        model parallel): a unit's norm needs the whole unit."""
        if shards_parameters(strategy):
            raise ConfigError(f"model.init_args.agc_clip: adaptive gradient clipping needs whole parameters on "
                              f"every rank, and {type(strategy).__name__} shards them; train with ddp, or set "
                              "agc_clip: null")

    def _steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch of the training data (1 where it has no length). Counted from
        the loader, not from ``estimated_stepping_batches / max_epochs``: a ``max_steps`` that ends the
        run early must not squeeze the epochs of the schedule (warm-up, milestones, the cosine)."""
        trainer = self.trainer
        trainer.estimated_stepping_batches  # builds the training loader when it is not built yet
        batches = trainer.num_training_batches
        if not batches or batches == float("inf"):
            return 1
        return max(math.ceil(batches / trainer.accumulate_grad_batches), 1)
