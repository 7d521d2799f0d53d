"""Translation with an encoder-decoder Transformer under any residual scheme (post-LN, pre-LN,
and the normalization-free ``rescale``, ``rezero``, ``skipinit``): the training loss, BLEU
during validation, and the test set's hypotheses written beside its score.

- Training: fairseq's label-smoothed cross entropy (:mod:`.loss`, eps 0.1) summed over the
  target tokens of an update (every micro-batch of ``trainer.accumulate_grad_batches``, fairseq's
  ``--update-freq``, on every rank) and its gradient divided by their number before any clipping
  and the step (:meth:`TranslationModule.optimizer_step`), so each token weighs the same whatever
  rank and micro-batch it is in (fairseq's normalisation). Adam (0.9, 0.98) with the
  inverse-sqrt schedule (:class:`~rescale_tasks.common.training.InverseSqrtLR`), clipping and
  accumulation through the Trainer (``gradient_clip_val``, ``accumulate_grad_batches``), bf16 on
  GPUs with ``trainer.precision: bf16-mixed`` (the loss is computed in float32).
  Logged: ``train/loss_step``/``_epoch`` and ``train/nll_loss_step``/``_epoch`` per target token
  (natural log; fairseq logs base 2), ``train/ppl`` = exp(nll); a step's over every micro-batch of
  its update on every rank, weighted by tokens, as fairseq logs an update's. Epoch and evaluation
  means are token-weighted ``MeanMetric``s synced as sums (Lightning's own weighted epoch mean
  averages its integer token counts over ranks, truncating them: a 0.2% error seen with 2 ranks).
- Validation: the same loss per token over the whole validation set, and corpus BLEU
  (:mod:`.bleu`, its sacreBLEU signature printed once) of beam-search translations of the first
  ``val_bleu_sentences`` validation lines (0: no BLEU while training).
- Test: BLEU of the whole test set; ``hypotheses.test.txt`` (one detokenized line per source
  line, in corpus order) and ``bleu.test.json`` (score, signature, statistics) in the results
  folder, so any external scorer gives the same BLEU from the file.
- Predict: the test set's translations, decoded as the test decodes them, one detokenized line
  per source line in corpus order, in ``predictions.test.txt`` where ``test`` writes
  (:mod:`rescale_tasks.common.run.predictions`).

The SentencePiece model travels inside every checkpoint (``checkpoint["sentencepiece"]``, its
serialized bytes), so ``rescale translate --ckpt_path`` needs nothing else. So does the direction
(``checkpoint["translation_pair"]``: source and target language): data read the other way (the same
joint SentencePiece model) is refused in one line when the checkpoint is loaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Iterable, Optional

import sentencepiece as spm
import torch
from torchmetrics.aggregation import MeanMetric

from rescale_core.generation import GenerationConfig, best_tokens, generate

from ..common.checkpoints import non_finite_text, non_finite_weights
from ..common.data import skipped_prediction
from ..common.errors import ConfigError
from ..common.module import OptimizerFactory, RescaleTaskModule
from ..common.run import results_folder, write_result
from ..common.system import gather_by_key, sum_tensor_over_ranks, world_size
from ..common.training import inside_accumulation_window
from .bleu import STYLES, bleu_statistics, bleu_from_statistics
from .export import STEP_AT_ANY_LENGTH, translation_programs
from .loss import UpdateTokens, label_smoothed_nll_loss, scale_gradients, tokens_over_ranks

__all__ = ["TranslationModule", "HYPOTHESES_FILE", "BLEU_FILE", "refuse_diverged_weights"]

log = logging.getLogger(__name__)

HYPOTHESES_FILE = "hypotheses.test.txt"
#: the checkpoint entry holding the (source, target) languages the network translates
PAIR_KEY = "translation_pair"
BLEU_FILE = "bleu.test.json"


def fairseq_adam(params: Iterable) -> torch.optim.Optimizer:
    """The translation default: Adam at lr 7e-4 with betas (0.9, 0.98) (fairseq's Transformer
    recipe, Ott et al. 2018)."""
    return torch.optim.Adam(params, lr=7e-4, betas=(0.9, 0.98), eps=1e-8)


def refuse_diverged_weights(checkpoint: dict[str, Any], named: str) -> None:
    """One line refusing a checkpoint whose weights hold NaN or infinite values (saved after its run
    diverged), to translate, evaluate or train on: none of its hypotheses would finish, so every
    translation would be an empty line."""
    broken = non_finite_weights(checkpoint)
    if broken:
        raise ConfigError(f"{named}: {non_finite_text(broken)} (weights saved after the run diverged), from "
                          "which every translation would be an empty line and training would go on from NaN; give a "
                          "checkpoint saved before the divergence")


def _pieces(processor: spm.SentencePieceProcessor) -> list[str]:
    """The piece of every id of a SentencePiece model."""
    return [processor.id_to_piece(i) for i in range(processor.piece_size())]


class TranslationModule(RescaleTaskModule):
    """Translation with encoder-decoder Transformers; the arguments every task shares
    (``scheme_options``, ``lr_scheduler``, ``compile``, ``plan`` ...) are
    :class:`~rescale_tasks.common.module.RescaleTaskModule`'s.

    Args:
        network: a Transformer from ``rescale_core`` (``transformer_base``, ``transformer_big``,
            ``transformer_deep``, ``transformer_tiny``).
        scheme: a Transformer scheme (``rescale schemes``): ``post_ln``, ``pre_ln``, ``rescale``, ``rezero``,
            ``skipinit``, ``tfixup``, ``deepnorm``, ``dyt`` or ``derf`` (docs/transformers.md).
        network_options: :class:`~rescale_core.models.transformer.TransformerConfig` fields
            (``num_encoder_layers: 60``, ``dropout: 0.3`` ...) and ``share_embeddings``.
        vocab_size, pad_index, bos_index, eos_index: linked from the data module by the CLI.
        label_smoothing: epsilon of the smoothed loss.
        beam, len_penalty, length_penalty_style, max_len_a, max_len_b: decoding
            (:mod:`rescale_core.generation`; ``gnmt`` with 0.6 is Vaswani et al.'s penalty).
        val_bleu_sentences: BLEU during validation on the first N validation lines (0: off).
        bleu_style: ``sacrebleu`` or ``compound_split`` (the WMT14 En-De papers' convention).
        optimizer: as for every task; the default is :func:`fairseq_adam`.
    """

    throughput_unit = "target tokens"  # training throughput in target tokens/s (common.data.throughput)
    #: ``rescale export``: a search calls the decoding step at every prefix length (no TorchScript file of it)
    export_any_size_only = {"decode_step": STEP_AT_ANY_LENGTH}

    @staticmethod
    def throughput_items(batch: dict) -> int:
        """The target tokens of a batch, padding left out."""
        return int(batch["ntokens"])

    def __init__(self, network: str = "transformer_base", scheme: Optional[str] = None, *,
                 network_options: Optional[dict[str, Any]] = None, vocab_size: int = 32000, pad_index: int = 1,
                 bos_index: int = 0, eos_index: int = 2, label_smoothing: float = 0.1, beam: int = 4,
                 len_penalty: float = 1.0, length_penalty_style: str = "fairseq", max_len_a: float = 1.2,
                 max_len_b: int = 10, val_bleu_sentences: int = 1000, bleu_style: str = "sacrebleu",
                 optimizer: OptimizerFactory = fairseq_adam, **options: Any) -> None:
        if bleu_style not in STYLES:
            raise ConfigError(f"model.bleu_style must be one of {', '.join(STYLES)}, got {bleu_style!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing must lie in [0, 1), got {label_smoothing}")
        try:
            self.generation = GenerationConfig(beam=beam, max_len_a=max_len_a, max_len_b=max_len_b,
                                               len_penalty=len_penalty, length_penalty_style=length_penalty_style)
        except ValueError as err:
            raise ConfigError(f"model decoding settings: {err}") from None
        family = {"share_embeddings": True, **(network_options or {})}  # one joint SentencePiece vocabulary
        super().__init__(network, scheme, network_options=family, optimizer=optimizer,
                         network_kwargs={"src_vocab_size": vocab_size, "pad_index": pad_index}, **options)
        self.label_smoothing = label_smoothing
        self.pad_index, self.bos_index, self.eos_index = pad_index, bos_index, eos_index
        self.val_bleu_sentences = val_bleu_sentences
        self.bleu_style = bleu_style
        self.processor: Optional[spm.SentencePieceProcessor] = None
        self._trained_pair: Optional[tuple[str, str]] = None  # (source, target) languages of a loaded checkpoint
        self._bleu_stats: Optional[torch.Tensor] = None
        self._hypotheses: dict[int, str] = {}  # this rank's translations in test and predict, by line
        self._signature_shown = False
        self._partial_val_said = False  # the warning of a partial val/bleu, said once a run
        self._bleu_lines = 0  # the lines this rank scored in this evaluation
        self._update_tokens = UpdateTokens()  # the target tokens of the update being accumulated
        # per-token means weighted by target tokens, synced as sums (Lightning's own epoch mean
        # averages its integer token counts over ranks and truncates them); a batch whose loss is
        # not finite makes the mean NaN, as Lightning's own means do (torchmetrics' default drops
        # it with a warning, and a broken model would report the loss of its finite batches): its
        # NaN is "replaced" by NaN ("disable" would skip the check but also the weights)
        for split in ("train", "val", "test"):
            setattr(self, f"{split}_loss", MeanMetric(nan_strategy=float("nan")))
            setattr(self, f"{split}_nll", MeanMetric(nan_strategy=float("nan")))

    def forward(self, src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor) -> torch.Tensor:
        return self.net(src_tokens, prev_output_tokens)

    def network_inputs(self, batch) -> tuple:
        return batch["src_tokens"], batch["prev_output_tokens"]

    def export_programs(self, batch) -> list:
        """What ``rescale export`` writes: the encoder and one decoding step (:mod:`.export`)."""
        return translation_programs(self.net, batch["src_tokens"], batch["prev_output_tokens"])

    def export_metadata(self, datamodule: Any, folder: str, stem: str) -> dict[str, Any]:
        """The sidecar's ``translation``: the SentencePiece model (written as ``<stem>.spm.model`` beside
        the files, with its SHA-256), the special ids, the positions, what a line without a piece
        translates to (``no_pieces``: empty, blank, or of characters the normalisation drops), the
        decoding defaults of ``rescale translate``, and the sizes of the decoding step's key/value cache."""
        metadata = super().export_metadata(datamodule, folder, stem)
        processor = self.processor or getattr(datamodule, "processor", None)  # a checkpoint without one: the data's
        if processor is None:
            raise ConfigError("rescale export: neither the checkpoint nor the data module holds the SentencePiece "
                              "model the network reads: a runtime could not tokenize; give the data.root the run "
                              "was trained on")
        proto = processor.serialized_model_proto()
        name = f"{stem}.spm.model"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(proto)
        config, generation = self.net.config, self.generation
        metadata["translation"] = {
            "sentencepiece": name, "sentencepiece_sha256": hashlib.sha256(proto).hexdigest(),
            "bos": self.bos_index, "eos": self.eos_index, "pad": self.pad_index, "unk": processor.unk_id(),
            "vocab_size": processor.piece_size(), "max_positions": config.max_positions,
            "source": "the line's pieces, cut to max_positions - 1, then eos",
            # as rescale translate, test and predict: searched from eos alone, it would come out as words
            "no_pieces": "empty translation, not decoded",
            "decoding": {"beam": generation.beam, "len_penalty": generation.len_penalty,
                         "length_penalty_style": generation.length_penalty_style, "max_len_a": generation.max_len_a,
                         "max_len_b": generation.max_len_b, "min_len": generation.min_len,
                         "max_len": "int(max_len_a * non-pad source tokens + max_len_b), at most max_positions - 1",
                         "never": ["pad"], "start": "bos"},
            "cache": {"layers": config.num_decoder_layers, "heads": config.nhead,
                      "head_dim": config.d_model // config.nhead}}
        return metadata

    # --- the subword model ----------------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        processor = getattr(datamodule, "processor", None)
        if processor is None and datamodule is not None and hasattr(datamodule, "setup"):
            datamodule.setup(stage)
            processor = getattr(datamodule, "processor", None)
        if processor is not None:
            self.processor = processor
        if hasattr(datamodule, "limit_positions"):  # no sequence longer than the network takes
            datamodule.limit_positions(self.net.config.max_positions)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.processor is not None:
            checkpoint["sentencepiece"] = self.processor.serialized_model_proto()
        pair = self._trained_pair or self._data_pair()
        if pair is not None:
            checkpoint[PAIR_KEY] = list(pair)

    def _data_pair(self) -> Optional[tuple[str, str]]:
        """The data's (source, target) languages; None without a translation data module."""
        run_labels = getattr(self._datamodule(), "run_labels", None)
        labels = run_labels() if callable(run_labels) else None
        return (labels["src_lang"], labels["tgt_lang"]) if labels else None

    def _check_pair(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, data in the other direction (or another pair) than the checkpoint's:
        a joint SentencePiece model is the same both ways, so nothing else would tell."""
        recorded = checkpoint.get(PAIR_KEY)
        if not (isinstance(recorded, (list, tuple)) and len(recorded) == 2):
            return  # written before checkpoints recorded the pair
        self._trained_pair = (str(recorded[0]), str(recorded[1]))
        data = self._data_pair()
        if data is None or data == self._trained_pair:
            return
        (src, tgt), path = self._trained_pair, getattr(self._trainer, "ckpt_path", None)
        named = f"checkpoint {path} (--ckpt_path)" if path else "the checkpoint"
        raise ConfigError(f"{named} translates {src} into {tgt} but the data is read as {data[0]} into {data[1]} "
                          "(data.src_lang/data.tgt_lang, or the pair prepare-translation recorded last for data.root): "
                          f"every translation and score would be of the wrong text; pass --data.src_lang {src} "
                          f"--data.tgt_lang {tgt}")

    def check_checkpoint_data(self, checkpoint: dict[str, Any]) -> None:
        """Refuse data in another direction or pair, or tokenized by another SentencePiece model of
        the same size, than the checkpoint's, and weights that are NaN or infinite (one line each)."""
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        refuse_diverged_weights(checkpoint, f"checkpoint {path} (--ckpt_path)" if path else "the checkpoint")
        self._check_pair(checkpoint)
        proto = checkpoint.get("sentencepiece")
        if proto is not None and self.processor is not None and proto != self.processor.serialized_model_proto():
            # the pieces decide what the ids mean (the bytes also record e.g. the training threads)
            theirs = spm.SentencePieceProcessor()
            theirs.LoadFromSerializedProto(proto)
            pieces = [_pieces(p) for p in (theirs, self.processor)]
            if len(pieces[0]) == len(pieces[1]) and pieces[0] != pieces[1]:  # other sizes: the weights' shapes say it
                raise ConfigError(self._other_vocabulary())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        proto = checkpoint.get("sentencepiece")
        if proto is not None and self.processor is None:
            self.processor = spm.SentencePieceProcessor()
            self.processor.LoadFromSerializedProto(proto)

    def _other_vocabulary(self) -> str:
        """Why a checkpoint whose SentencePiece model is not the data's is refused, and what to do."""
        trainer = self._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        prepared = getattr(getattr(trainer, "datamodule", None), "prepared", None)
        model = getattr(prepared, "spm_model", None)
        named = f"checkpoint {path} (--ckpt_path)" if path else "the checkpoint"
        return (f"{named} was trained with another SentencePiece model than the "
                f"data's{f' ({model})' if model else ''}: its token ids would name other pieces and every "
                "translation and score be wrong; give the data.root (or data.spm_model) the run was trained on, "
                "or translate with rescale translate --ckpt_path, which uses the checkpoint's own model")

    def detokenize(self, tokens: torch.Tensor) -> str:
        ids = [int(t) for t in tokens.tolist() if int(t) not in (self.bos_index, self.pad_index)]
        if self.eos_index in ids:
            ids = ids[:ids.index(self.eos_index)]
        return self.processor.decode(ids)

    # --- steps ----------------------------------------------------------------------------
    def train_batch(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch["src_tokens"], batch["prev_output_tokens"])
        loss_sum, nll_sum = label_smoothed_nll_loss(logits, batch["target"], self.label_smoothing, self.pad_index)
        ntokens = int(batch["ntokens"])
        # DDP averages gradients over ranks, hence the world size; optimizer_step divides the
        # gradient by the tokens of the whole update (UpdateTokens)
        loss = loss_sum * (world_size() / self._update_tokens.add(tokens_over_ranks(ntokens)))
        sums = torch.stack([loss_sum.detach(), nll_sum.detach()])
        self.train_loss.update(sums[0] / max(ntokens, 1), weight=ntokens)
        self.train_nll.update(sums[1] / max(ntokens, 1), weight=ntokens)
        # the step's: per token of the whole update, every micro-batch and rank (fairseq logs an
        # update's), summed over the ranks once, at the update's last micro-batch (the logger
        # writes the step's values there only)
        self._update_tokens.add_sums(sums)
        if not inside_accumulation_window(self.trainer):
            update_loss, update_nll = self._update_tokens.per_token(
                lambda local: self.trainer.strategy.reduce(local, reduce_op="sum"))
            self.log("train/loss_step", update_loss, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/nll_loss_step", update_nll, on_step=True, on_epoch=False)
            self.log("train/ppl", update_nll.exp(), on_step=True, on_epoch=False)
        self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True)
        self.log("train/nll_loss_epoch", self.train_nll, on_step=False, on_epoch=True)
        return loss

    def on_train_start(self) -> None:
        super().on_train_start()
        self._update_tokens.reset()

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Lightning's step, with the gradients of the update made those of its loss summed over
        every micro-batch and rank divided by the target tokens of them all (fairseq's
        ``train_step``): the closure runs the update's last backward (DDP all-reduces the
        gradients in it); right after it, before the GradScaler's unscaling (a factor commutes
        with it), the callbacks' ``on_before_optimizer_step``, AGC, ``gradient_clip_val`` and the
        step, the gradients are multiplied by :meth:`UpdateTokens.gradient_factor`."""
        if optimizer_closure is None or self.trainer.strategy.handles_gradient_accumulation:
            # a strategy that accumulates itself (DeepSpeed) steps at every micro-batch: each is
            # divided by its own tokens
            self._update_tokens.reset()
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

        def closure():
            result = optimizer_closure()
            factor = self._update_tokens.gradient_factor(self.trainer.accumulate_grad_batches)
            scale_gradients((p for group in optimizer.param_groups for p in group["params"]), factor)
            return result

        return super().optimizer_step(epoch, batch_idx, optimizer, closure)

    def _eval_step(self, batch: dict, prefix: str, bleu_rows: Optional[int]) -> None:
        ntokens = int(batch["ntokens"])
        if ntokens > 0:  # filler batches (id -1) keep the ranks in step and count nothing
            logits = self(batch["src_tokens"], batch["prev_output_tokens"])
            loss_sum, nll_sum = label_smoothed_nll_loss(logits, batch["target"], self.label_smoothing,
                                                        self.pad_index)
            loss_metric, nll_metric = getattr(self, f"{prefix}_loss"), getattr(self, f"{prefix}_nll")
            loss_metric.update(loss_sum / ntokens, weight=ntokens)
            nll_metric.update(nll_sum / ntokens, weight=ntokens)
            self.log(f"{prefix}/loss", loss_metric, on_epoch=True, batch_size=ntokens)
            self.log(f"{prefix}/nll_loss", nll_metric, on_epoch=True, batch_size=ntokens)
        if bleu_rows is None or self.processor is None or self.trainer.sanity_checking:
            return
        ids = batch["id"]
        keep = (ids >= 0) & (ids < bleu_rows)
        kept = int(keep.sum())  # (one device sync)
        if not kept:
            return
        self._bleu_lines += kept
        translated = self._translate(batch, keep)
        split = "valid" if prefix == "val" else "test"
        references = self.trainer.datamodule.references(split)
        hyps = list(translated.values())
        refs = [references[line] for line in translated]
        if prefix == "test":
            self._hypotheses.update(translated)
        stats = torch.tensor(bleu_statistics(hyps, refs, self.bleu_style), dtype=torch.int64)
        self._bleu_stats = stats if self._bleu_stats is None else self._bleu_stats + stats

    def _translate(self, batch: dict, keep: torch.Tensor) -> dict[int, str]:
        """``{line: detokenized translation}`` of the rows of ``batch`` that ``keep`` marks (beam
        search with the module's decoding settings). A source without a piece (an empty line)
        is translated as an empty line, as ``rescale translate`` translates it, not decoded."""
        ids = batch["id"]
        empty = batch["src_tokens"].ne(self.pad_index).sum(dim=1).le(1)  # eos alone
        out = {int(ids[row]): "" for row in (keep & empty).nonzero().flatten().tolist()}
        rows = (keep & ~empty).nonzero().flatten()
        if len(rows):
            results = generate(self.net, batch["src_tokens"][rows], bos=self.bos_index, eos=self.eos_index,
                               config=self.generation)
            out.update((int(ids[row]), self.detokenize(best_tokens(nbest)))
                       for row, nbest in zip(rows.tolist(), results))
        return out

    def evaluate_batch(self, batch: dict, stage: str) -> None:
        # BLEU on the first val_bleu_sentences validation lines, on every test line
        self._eval_step(batch, stage, (self.val_bleu_sentences or None) if stage == "val" else 1 << 62)

    def on_validation_epoch_start(self) -> None:
        self._bleu_stats, self._bleu_lines = None, 0

    def on_test_epoch_start(self) -> None:
        self._bleu_stats, self._hypotheses, self._bleu_lines = None, {}, 0

    def _log_bleu(self, key: str):
        """``(result, lines)``: the corpus BLEU from the statistics of every rank (None where no rank
        scored a sentence) and the lines it scored on every rank (a collective: every rank calls it)."""
        stats = self._bleu_stats if self._bleu_stats is not None else torch.zeros(10, dtype=torch.int64)
        scored = torch.tensor([int(self._bleu_stats is not None), self._bleu_lines], dtype=torch.int64)
        stats, scored, lines = sum_tensor_over_ranks(torch.cat([stats, scored])).split([10, 1, 1])
        if int(scored) == 0:  # no sentence scored on any rank (every translation empty still scores: 0)
            return None, int(lines)
        result = bleu_from_statistics(stats.tolist(), self.bleu_style)
        self.log(key, result.score, sync_dist=False)  # the same on every rank (summed statistics)
        if not self._signature_shown and self.trainer.is_global_zero:
            log.info(f"sacreBLEU signature: {result.signature}")
            for logger in self.trainer.loggers:
                summary = getattr(getattr(logger, "experiment", None), "summary", None)
                if summary is not None:
                    summary["bleu_signature"] = result.signature
            self._signature_shown = True
        return result, int(lines)

    def on_validation_epoch_end(self) -> None:
        if self.val_bleu_sentences and not self.trainer.sanity_checking:
            result, scored = self._log_bleu("val/bleu")
            if result is None or not self.trainer.is_global_zero or self._partial_val_said:
                return
            expected = min(self.val_bleu_sentences, len(self.trainer.datamodule.references("valid")))
            if scored < expected:  # a partial pass (trainer.limit_val_batches)
                log.warning(f"warning: val/bleu covers {scored} of the first {expected} validation "
                            "lines (model.init_args.val_bleu_sentences): the batches of the others did not run "
                            "(trainer.limit_val_batches), and as the batches go by length it scores the lines of "
                            "some lengths only, a number not comparable with a whole validation's; leave out "
                            "--trainer.limit_val_batches to score them all")
                self._partial_val_said = True

    def on_test_epoch_end(self) -> None:
        result, _ = self._log_bleu("test/bleu")
        by_line = gather_by_key(self._hypotheses)  # a collective
        if not self.trainer.is_global_zero or result is None:
            return
        count = len(self.trainer.datamodule.references("test"))
        write_result(self.trainer, HYPOTHESES_FILE, self._lines(by_line, count), count, "hypotheses")
        score = {"bleu": result.score, "signature": result.signature, "style": self.bleu_style,
                 "statistics": result.statistics, "sentences": len(by_line), "lines": count,
                 "hypotheses": HYPOTHESES_FILE}
        if len(by_line) < count:  # a partial pass (trainer.limit_test_batches) scores the lines it translated
            log.warning(self._untranslated(f"test BLEU {result.score:.2f} covers", len(by_line), count, "test",
                                           HYPOTHESES_FILE, "so scoring that file against the references gives "
                                           "another number; leave out --trainer.limit_test_batches to score the "
                                           "whole test set"))
        write_result(self.trainer, BLEU_FILE, json.dumps(score, indent=1), None, "BLEU score")
        log.info(f"test BLEU {result.score:.2f} ({result.signature}); written to {results_folder(self.trainer)}: "
                 f"{HYPOTHESES_FILE}, {BLEU_FILE}")

    @staticmethod
    def _untranslated(what: str, translated: int, count: int, stage: str, file: str, then: str) -> str:
        """The warning line of a partial pass (``trainer.limit_<stage>_batches``): which lines it left
        empty in ``file``."""
        return (f"warning: {what} {translated} of the {count} test lines: the other {count - translated} were not "
                f"translated (trainer.limit_{stage}_batches) and are empty lines in {file}, {then}")

    @staticmethod
    def _lines(by_line: dict[int, str], count: int) -> str:
        """One translation per source line of a split of ``count`` lines, in its order (a line
        without one, e.g. an empty source line, is empty)."""
        return "".join(by_line.get(i, "") + "\n" for i in range(count))

    # --- prediction -----------------------------------------------------------------------
    def on_predict_epoch_start(self) -> None:
        self._hypotheses = {}

    def predict_batch(self, batch: dict) -> dict[int, str] | None:
        keep = batch["id"] >= 0
        if not bool(keep.any()):  # a filler batch keeping the ranks in step
            return skipped_prediction()
        translated = self._translate(batch, keep)
        self._hypotheses.update(translated)
        return translated

    def on_predict_epoch_end(self) -> None:
        by_line = gather_by_key(self._hypotheses)  # a collective
        if self.trainer.is_global_zero:
            count = len(self.trainer.datamodule.references(self.predict_split))
            path = self.write_predictions("txt", self._lines(by_line, count), count, "translations")
            if len(by_line) < count:
                log.warning(self._untranslated("predict translated", len(by_line), count, "predict",
                                               os.path.basename(path), "as if their translations were empty; "
                                               "leave out --trainer.limit_predict_batches to translate them all"))
