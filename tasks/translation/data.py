"""The LightningDataModule for translation: parallel text in, token-budget batches out.

Knows ``vocab_size``, ``pad_index``, ``bos_index``, ``eos_index`` right after ``__init__`` (so a
CLI can link them into the model, as classification links ``num_classes``): the special ids are
fixed (:mod:`.vocab`), and ``vocab_size`` is ``data.vocab_size`` unless ``data.spm_model`` names
an existing model, whose own size is used (the only file read in ``__init__``). Text is read,
the SentencePiece model trained and the corpus encoded in :meth:`prepare_data` (once per node)
and found in the caches by :meth:`setup` (every rank); both are no-ops when the caches exist.

Batches: see :mod:`.dataset` (keys ``id``, ``src_tokens``, ``src_lengths``,
``prev_output_tokens``, ``target``, ``ntokens``, ``nsentences``) and :mod:`.sampler` (token
budget, DDP sharding, exact mid-epoch resume, filler batches marked by ``id`` -1 in evaluation).
Training pairs are cleaned as :mod:`.cleaning` says; the counts are in :attr:`reports` and
logged once, with every split side's ``<unk>`` pieces (:attr:`unknown`, stored with the encoded
arrays: nothing is encoded again); a side over ``unk_warn_percent`` gets one warning line, on
rank zero. ``references(split)`` gives the raw target lines of ``valid``/``test`` for sacreBLEU
(row ``id`` of a batch is the index into it) and :meth:`decode` turns ids back into text.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch.utils.data import DataLoader

from rescale_tasks.common.data import TaskDataModule, sigterm_safe_worker_init
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.system import loader_workers

from .binarize import UNK_WARN_PERCENT, UnknownPieces, unknown_pieces, unknown_warning
from .cleaning import CleanOptions, CleanReport, count_truncated, select_train
from .dataset import PairDataset
from .pipeline import CorpusSettings, PreparedCorpus, prepare_corpus
from .prepared import find_prepared, unused_reason
from .sampler import TokenBatchLoader, TokenBatchSampler
from .vocab import BOS, EOS, PAD, UNK, SpmOptions, load_spm

__all__ = ["TranslationDataModule"]

log = logging.getLogger(__name__)

DEFAULT_SRC_LANG, DEFAULT_TGT_LANG, DEFAULT_VOCAB_SIZE = "en", "de", 32000

_STAGE_SPLITS = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",), "predict": ("test",)}


@rank_zero_only
def _warn(line: str) -> None:
    log.warning(line)


class TranslationDataModule(TaskDataModule):
    """Parallel text under ``root`` (``<split>.<lang>`` files or ``<split>.tsv``; :mod:`.corpus`).

    Args:
        root: folder with the ``train``/``valid``/``test`` splits.
        src_lang, tgt_lang: language codes (file suffixes in the ``files`` layout); None: those
            ``rescale prepare-translation`` recorded for ``root`` (:mod:`.prepared`), else en, de.
        layout: ``auto``, ``files`` or ``tsv``.
        spm_model: a SentencePiece ``.model`` with ids bos 0, pad 1, eos 2, unk 3; None trains
            (or finds the cached) joint model on the training text.
        vocab_size, model_type: of the model trained when ``spm_model`` is None (vocab_size None:
            the recorded model of ``prepare-translation`` and its size, else 32000).
        max_tokens: padded positions per batch tensor (fairseq ``--max-tokens``), per rank.
        max_source_positions, max_target_positions: longest sequences with eos (the model's limits).
        clean: training-pair cleaning (:class:`~.cleaning.CleanOptions`; a dict works too).
        cache_dir: where models and encoded arrays go (default ``<root>/rescale_cache``, or
            ``~/.cache/rescale/translation`` when ``root`` is read-only).
        num_workers, pin_memory, persistent_workers: DataLoader options.
        seed: batch composition and order (the same on every rank).
        unk_warn_percent: warn when more than this percent of a split side's pieces are ``<unk>``
            (text the SentencePiece model cannot spell).
    """

    pad_index, bos_index, eos_index, unk_index = PAD, BOS, EOS, UNK

    def __init__(self, root: str, src_lang: str | None = None, tgt_lang: str | None = None,
                 layout: Literal["auto", "files", "tsv"] = "auto", spm_model: str | None = None,
                 vocab_size: int | None = None, model_type: Literal["bpe", "unigram"] = "bpe",
                 max_tokens: int = 4096, max_source_positions: int = 1024, max_target_positions: int = 1024,
                 clean: CleanOptions | None = None, cache_dir: str | None = None, num_workers: int = 2,
                 pin_memory: bool = True, persistent_workers: bool = True, seed: int = 0,
                 unk_warn_percent: float = UNK_WARN_PERCENT):
        super().__init__()
        # what `rescale prepare-translation` recorded fills in what is not set (languages, vocabulary)
        prepared = find_prepared(root, cache_dir, src_lang, tgt_lang)
        src_lang = src_lang or (prepared.src_lang if prepared else DEFAULT_SRC_LANG)
        tgt_lang = tgt_lang or (prepared.tgt_lang if prepared else DEFAULT_TGT_LANG)
        unused = (unused_reason(root, prepared, vocab_size, layout, cache_dir)
                  if prepared and spm_model is None else None)
        if prepared and spm_model is None and not unused:
            spm_model = prepared.spm_model
        vocab_size = vocab_size or (prepared.vocab_size if prepared else DEFAULT_VOCAB_SIZE)
        # not the data seed: runs with other seeds share one vocabulary
        spm_options = SpmOptions(vocab_size=vocab_size, model_type=model_type)
        if prepared and prepared.options and vocab_size == prepared.vocab_size:
            spm_options = prepared.options  # as prepare-translation trains it
        self.save_hyperparameters()
        for key, value, least in (("max_tokens", max_tokens, 2), ("max_source_positions", max_source_positions, 2),
                                  ("max_target_positions", max_target_positions, 2)):
            if value < least:
                raise ConfigError(f"data.{key} must be at least {least}, got {value}.")
        if num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}.")
        if not 0 <= unk_warn_percent <= 100:
            raise ConfigError(f"data.unk_warn_percent must be a percentage in [0, 100], got {unk_warn_percent:g}.")
        self.clean = CleanOptions(**clean) if isinstance(clean, dict) else (clean or CleanOptions())
        self.settings = CorpusSettings(root, src_lang, tgt_lang, layout, spm_model, spm_options, cache_dir)
        if unused:  # said once the options are known to be valid
            rank_zero_info(unused)
        self.max_tokens, self.seed, self.unk_warn_percent = max_tokens, seed, unk_warn_percent
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions
        self.num_workers, self.pin_memory, self.persistent_workers = num_workers, pin_memory, persistent_workers
        self.vocab_size = vocab_size
        self.processor = None
        if spm_model and Path(os.path.expanduser(spm_model)).is_file():
            self.processor = load_spm(spm_model)  # its size is the vocabulary the model must have
            self.vocab_size = self.processor.piece_size()
        # the values used, not the config's None (LightningCLI saves the config's values)
        used = {"src_lang": src_lang, "tgt_lang": tgt_lang, "spm_model": spm_model, "vocab_size": self.vocab_size}
        self.hparams.update(used)
        self._hparams_initial.update(used)
        self.prepared: PreparedCorpus | None = None
        self.datasets: dict[str, PairDataset] = {}
        self.train_indices: np.ndarray | None = None
        self.reports: dict[str, CleanReport] = {}
        self.unknown: list[UnknownPieces] = []
        self._references: dict[str, list[str]] = {}

    def run_labels(self) -> dict[str, str]:
        """What a run's W&B name and group may name (``{pair}-6L``): the languages of the data."""
        src, tgt = self.settings.src_lang, self.settings.tgt_lang
        return {"src_lang": src, "tgt_lang": tgt, "pair": f"{src}-{tgt}"}

    # --- preparing --------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Train/find the SentencePiece model and encode every split (local rank 0 only)."""
        prepare_corpus(self.settings)

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:
            prepared = prepare_corpus(self.settings)
            pieces = prepared.processor.piece_size()
            if pieces != self.vocab_size:  # data.spm_model was created or replaced after __init__
                raise DataError(f"{prepared.spm_model} (data.spm_model) has {pieces} pieces but the model "
                                f"was sized for {self.vocab_size}; set --data.vocab_size {pieces}.")
            datasets = {name: PairDataset(encoded, self.max_source_positions, self.max_target_positions)
                        for name, encoded in prepared.encoded.items()}
            self._select(prepared, datasets)
            self.prepared, self.processor, self.datasets = prepared, prepared.processor, datasets
            langs = (self.settings.src_lang, self.settings.tgt_lang)
            self.unknown = unknown_pieces(prepared.encoded, langs)
            rates = ", ".join(f"{name} " + "/".join(f"{c.percent:.2f}%" for c in self.unknown if c.split == name)
                              for name in prepared.encoded)
            rank_zero_info("translation data: " + "; ".join(r.line() for r in self.reports.values())
                           + f"; vocabulary {self.vocab_size} ({prepared.spm_model}); <unk> pieces "
                           f"({'/'.join(langs)}): {rates}")
            for count in self.unknown:
                if count.percent > self.unk_warn_percent:
                    _warn(unknown_warning(count, prepared.spm_model, self.unk_warn_percent,
                                          "--data.unk_warn_percent", self._spelling_fix(count)))
        for split in _STAGE_SPLITS.get(stage or "", ()):
            self._dataset(split)

    def limit_positions(self, positions: int) -> None:
        """Fit the sequence limits within a network of ``positions`` positions (its
        ``max_positions``): training pairs longer than that are left out and valid/test sentences
        cut to it, as for ``max_source_positions``/``max_target_positions``, which a network with
        fewer positions could not take (a longer evaluation sentence would end the run). Said in
        one line with the new counts when it changes them."""
        limits = (min(self.max_source_positions, positions), min(self.max_target_positions, positions))
        if limits == (self.max_source_positions, self.max_target_positions):
            return
        self.max_source_positions, self.max_target_positions = limits
        if self.prepared is None:
            return
        before = {name: report.line() for name, report in self.reports.items()}
        self.datasets = {name: PairDataset(dataset.encoded, *limits) for name, dataset in self.datasets.items()}
        self._select(self.prepared, self.datasets)
        changed = [r.line() for name, r in self.reports.items() if r.line() != before.get(name)]
        if changed:
            rank_zero_info(f"translation data: the network's {positions} positions are the sequence limits "
                           f"(data.max_source_positions/max_target_positions are more): " + "; ".join(changed))

    def _spelling_fix(self, count: UnknownPieces) -> str:
        """What makes the model spell the text of ``count``: another model, or more training text."""
        if self.settings.spm_model:
            return (f"prepare the corpus with a model trained on text of both languages: rescale prepare-translation "
                    f"{self.settings.root} --src_lang {self.settings.src_lang} --tgt_lang {self.settings.tgt_lang} "
                    "(without --spm_model, at --character_coverage 1.0) trains one on its train split")
        return "add text of that script to the train split, which the model is trained on"

    def _select(self, prepared: PreparedCorpus, datasets: dict[str, PairDataset]) -> None:
        """The training pairs kept by cleaning, and every split's report."""
        limits = (self.max_source_positions, self.max_target_positions)
        for name, dataset in datasets.items():
            src, tgt = dataset.encoded.src.sizes, dataset.encoded.tgt.sizes
            if name == "train":
                where = " and ".join(str(p) for p in prepared.sources["train"].paths)
                self.train_indices, report = select_train(src, tgt, self.clean, *limits, self.max_tokens, where)
            else:
                report = CleanReport(name, len(src), len(src), truncated=count_truncated(src, tgt, *limits))
            self.reports[name] = report

    def _dataset(self, split: str) -> PairDataset:
        """The pairs of ``split``; one line where it has no files, or where a split to evaluate (test;
        valid unless validation is off) has files without a line: such a split gave no score and no
        translation, and the command finished as if it had."""
        if self.prepared is None:
            self.setup()
        if split not in self.datasets:
            paths = self.prepared.sources[next(iter(self.prepared.sources))].paths
            names = (f"{split}.tsv" if len(paths) == 1 else
                     f"{split}.{self.settings.src_lang} and {split}.{self.settings.tgt_lang}")
            raise DataError(f"no {split} split in {paths[0].parent} (data.root): add {names}.")
        evaluated = split == "test" or (split == "valid" and getattr(self.trainer, "limit_val_batches", 1) != 0)
        if evaluated and not len(self.datasets[split]):
            paths = self.prepared.sources[split].paths
            raise DataError(f"{' and '.join(p.name for p in paths)} in {paths[0].parent} (data.root) "
                            f"{'are' if len(paths) > 1 else 'is'} empty: the {split} split has no sentence pair to "
                            "evaluate; write its pairs there, one per line.")
        return self.datasets[split]

    # --- the data fingerprint (run_summary.json's ``data``) ---------------------------------
    def fingerprint_root(self) -> str:
        return self.settings.root

    def fingerprint_files(self, split: str, dataset: PairDataset) -> list | None:
        """A split's text files and the SentencePiece model that turned them into tokens."""
        if self.prepared is None or split not in self.prepared.sources:
            return None
        return [*self.prepared.sources[split].paths, self.prepared.spm_model]

    # --- loaders ----------------------------------------------------------------------------
    def loader(self, split: str, num_replicas: int | None = None, rank: int | None = None) -> DataLoader:
        """The loader of ``split`` for rank ``rank`` of ``num_replicas`` (default: from
        ``torch.distributed``); training batches are shuffled and resumable."""
        dataset = self._dataset(split)
        train = split == "train"
        sampler = TokenBatchSampler(dataset, self.train_indices if train else None, self.max_tokens,
                                    shuffle=train, seed=self.seed, num_replicas=num_replicas, rank=rank)
        workers = loader_workers(self.num_workers)  # at most the usable cores
        kwargs = dict(num_workers=workers, pin_memory=self.pin_memory and torch.accelerator.is_available(),
                      persistent_workers=self.persistent_workers and workers > 0,
                      worker_init_fn=sigterm_safe_worker_init() if workers > 0 else None,
                      # a private generator: creating an iterator never draws from the global RNG
                      generator=torch.Generator().manual_seed(self.seed))
        if train:
            return TokenBatchLoader(dataset, sampler, **kwargs)
        return DataLoader(dataset, sampler=sampler, batch_size=None, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")

    def predict_dataloader(self) -> DataLoader:
        """``predict`` translates the test split."""
        return self.loader("test")

    # --- text -------------------------------------------------------------------------------
    def references(self, split: str) -> list[str]:
        """The raw target lines of ``split`` (line ``id`` of a batch row), for sacreBLEU."""
        self._dataset(split)
        if split not in self._references:
            self._references[split] = list(self.prepared.sources[split].lines(1))
        return self._references[split]

    def sources(self, split: str) -> list[str]:
        """The raw source lines of ``split``."""
        self._dataset(split)
        return list(self.prepared.sources[split].lines(0))

    def _processor(self):
        if self.processor is None:
            self.setup()
        return self.processor

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Detokenized text of one sequence: stops at the first eos, skips bos and pad."""
        ids = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
        if EOS in ids:
            ids = ids[:ids.index(EOS)]
        return self._processor().decode([i for i in ids if i not in (BOS, PAD)])

    def encode(self, text: str) -> torch.Tensor:
        """Source tokens of one sentence as a model input row: pieces + eos, int64 [S]."""
        pieces = self._processor().encode(text, out_type=int)[:self.max_source_positions - 1]
        return torch.tensor(pieces + [EOS], dtype=torch.int64)
