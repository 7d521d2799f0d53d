"""The translation data pipeline on real English-German text (gettext catalogue pairs of the suite).

SentencePiece training and its cache, the memory-mapped encoded corpus and its cache, exact
cleaning counts on planted bad pairs, token-budget batches (budget, coverage, seeded order,
DDP sharding, mid-epoch resume, padding efficiency), evaluation batches under DDP, the TSV
layout, the prepare command and one-line errors.
"""
from __future__ import annotations

import math
import pickle
import random
import unicodedata
from collections import Counter

import lightning as L
import numpy as np
import pytest
import sentencepiece as spm
import torch
from lightning.fabric.utilities.types import _Stateful
from torch.utils.data import DistributedSampler

from rescale_tasks.common.data import ResumeMismatch
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.translation import binarize, prepare
from rescale_tasks.translation.batching import padding_efficiency
from rescale_tasks.translation.corpus import read_lines
from rescale_tasks.translation.data import TranslationDataModule
from rescale_tasks.translation.sampler import TokenBatchLoader

PAD, BOS, EOS = 1, 0, 2
NO_CLEAN = {"len_ratio": None}  # UI strings: "OK" -> "Bestätigen" is a fine pair


def make_dm(root, **overrides) -> TranslationDataModule:
    kwargs = dict(vocab_size=500, num_workers=0, clean=NO_CLEAN, max_tokens=1024)
    kwargs.update(overrides)
    return TranslationDataModule(str(root), **kwargs)


@pytest.fixture(scope="module")
def dm(parallel_root) -> TranslationDataModule:
    module = make_dm(parallel_root)
    module.setup("fit")
    return module


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


def epoch(loader, number: int) -> list[dict]:
    loader.sampler.set_epoch(number)
    return list(loader)


def ids_of(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def plain(text: str) -> bool:
    """Text that SentencePiece's NFKC normalisation leaves as it is."""
    return (text == " ".join(unicodedata.normalize("NFKC", text).split())
            and not any(unicodedata.category(c) == "Cf" for c in text))


def spelled(dm, text: str) -> bool:
    """Text whose every character the subword model knows (a character too rare for the
    vocabulary, such as a translator's typo, becomes unk)."""
    return dm.processor.unk_id() not in dm.processor.encode(text)


# --- SentencePiece ------------------------------------------------------------------------------
def test_sentencepiece_model_is_trained_once_and_cached(parallel_root, tmp_path, monkeypatch):
    first = make_dm(parallel_root, cache_dir=str(tmp_path))
    assert (first.vocab_size, first.pad_index, first.bos_index, first.eos_index) == (500, PAD, BOS, EOS)
    first.prepare_data()
    models = list(tmp_path.glob("spm-*.model"))
    assert len(models) == 1
    stamp = models[0].stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("SentencePiece was trained again")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    again = make_dm(parallel_root, cache_dir=str(tmp_path))
    again.setup("fit")
    assert again.prepared.spm_model == models[0] and models[0].stat().st_mtime_ns == stamp
    processor = again.processor
    assert processor.piece_size() == 500
    assert [processor.bos_id(), processor.pad_id(), processor.eos_id(), processor.unk_id()] == [0, 1, 2, 3]
    # other options are another model
    with pytest.raises(AssertionError, match="trained again"):
        make_dm(parallel_root, cache_dir=str(tmp_path), vocab_size=400).setup("fit")
    with pytest.raises(AssertionError, match="trained again"):
        make_dm(parallel_root, cache_dir=str(tmp_path), model_type="unigram").setup("fit")


def test_real_sentences_survive_encode_and_decode(dm, gettext_splits):
    for split in ("train", "valid"):
        texts = [text for pair in gettext_splits[split] for text in pair if plain(text) and spelled(dm, text)]
        assert len(texts) > 0.9 * 2 * len(gettext_splits[split])
        assert [dm.decode(dm.encode(text)) for text in texts] == texts
    # batch rows decode to their own line of the files
    batch = next(iter(dm.loader("valid")))
    sources, references = dm.sources("valid"), dm.references("valid")
    assert references == [t for _, t in gettext_splits["valid"]]
    for row, i in enumerate(batch["id"].tolist()):
        if all(plain(text) and spelled(dm, text) for text in (sources[i], references[i])):
            assert dm.decode(batch["src_tokens"][row]) == sources[i]
            assert dm.decode(batch["target"][row]) == references[i]
            assert dm.decode(batch["prev_output_tokens"][row]) == references[i]


def test_batch_layout(dm):
    batch = next(iter(dm.loader("train")))
    src, prev, target = batch["src_tokens"], batch["prev_output_tokens"], batch["target"]
    assert src.dtype == prev.dtype == target.dtype == torch.int64 and prev.shape == target.shape
    shifted = target[:, 1:] != PAD  # decoder input = bos + target, target = ... + eos
    assert (prev[:, 0] == BOS).all() and torch.equal(prev[:, 1:][shifted], target[:, :-1][shifted])
    assert torch.equal(batch["src_lengths"], src.ne(PAD).sum(1))
    rows = torch.arange(len(src))
    assert (src[rows, batch["src_lengths"] - 1] == EOS).all()
    assert (target[rows, target.ne(PAD).sum(1) - 1] == EOS).all()
    assert batch["ntokens"] == int(target.ne(PAD).sum()) and batch["nsentences"] == len(src)
    assert not (src == BOS).any() and not (target == BOS).any()  # bos only starts the decoder input


# --- the encoded corpus -------------------------------------------------------------------------
def test_encoded_corpus_is_memory_mapped_and_reused(parallel_root, tmp_path, monkeypatch):
    first = make_dm(parallel_root, cache_dir=str(tmp_path))
    first.setup("fit")
    files = sorted((tmp_path / "tokens").iterdir())
    assert len(files) == 3 * 2 * 3  # (bin, offsets, json) x 2 sides x 3 splits
    stamps = {f: f.stat().st_mtime_ns for f in files}
    tokens = first.datasets["train"].encoded.src.tokens
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16

    def no_encoding(*args, **kwargs):
        raise AssertionError("the corpus was encoded again")

    monkeypatch.setattr(binarize, "_encode_side", no_encoding)
    again = make_dm(parallel_root, cache_dir=str(tmp_path))
    again.setup("fit")
    assert {f: f.stat().st_mtime_ns for f in sorted((tmp_path / "tokens").iterdir())} == stamps
    a, b = first.datasets["train"].encoded, again.datasets["train"].encoded
    assert np.array_equal(a.src.offsets, b.src.offsets) and np.array_equal(a.tgt.tokens, b.tgt.tokens)
    # worker processes started by spawn/forkserver get paths, not copies of the arrays
    dataset = first.datasets["train"]
    key = next(iter(first.loader("train").sampler))
    shipped = pickle.dumps(dataset)
    assert len(shipped) < 2_000 < tokens.nbytes
    batch, copy = dataset[key], pickle.loads(shipped)[key]
    assert all(torch.equal(batch[k], copy[k]) for k in ("id", "src_tokens", "target"))


def test_tsv_layout_reads_the_same_pairs(gettext_splits, tmp_path, writers, dm):
    root = writers.tsv(tmp_path / "tsv", gettext_splits)
    tsv = make_dm(root, spm_model=str(dm.prepared.spm_model))
    tsv.setup("fit")
    assert tsv.prepared.sources["train"].layout == "tsv"
    for split in ("train", "valid", "test"):
        a, b = tsv.datasets[split].encoded, dm.datasets[split].encoded
        assert np.array_equal(a.src.tokens, b.src.tokens) and np.array_equal(a.tgt.offsets, b.tgt.offsets)
    assert ids_of(epoch(tsv.loader("train"), 3)) == ids_of(epoch(dm.loader("train"), 3))



def test_splits_of_either_layout_in_one_folder_are_all_read(gettext_splits, tmp_path, writers, dm):
    """train.en/train.de beside valid.tsv and test.tsv (WMT's dev and test sets often come apart from
    the training text): every split is read, none left out without a word."""
    root = writers.files(tmp_path / "mixed", {"train": gettext_splits["train"]})
    writers.tsv(root, {split: gettext_splits[split] for split in ("valid", "test")})
    mixed = make_dm(root, spm_model=str(dm.prepared.spm_model))
    mixed.setup("fit")
    assert {name: source.layout for name, source in mixed.prepared.sources.items()} == {
        "train": "files", "valid": "tsv", "test": "tsv"}
    for split in ("train", "valid", "test"):
        a, b = mixed.datasets[split].encoded, dm.datasets[split].encoded
        assert np.array_equal(a.src.tokens, b.src.tokens) and np.array_equal(a.tgt.offsets, b.tgt.offsets)
    assert mixed.references("test") == dm.references("test")


# --- cleaning -----------------------------------------------------------------------------------
def test_cleaning_counts_are_exact(dm, gettext_splits, tmp_path, writers):
    """Clean pairs plus planted pairs that each break exactly one rule (piece counts measured
    with the model the corpus is then encoded with)."""
    def count(text: str) -> int:
        return len(dm.processor.encode(text))

    def clean(s: str, t: str) -> bool:  # passes every rule below with a margin
        lo, hi = sorted((count(s), count(t)))
        return 1 <= lo and hi <= min(15, 3 * lo)

    rules = dict(clean={"max_len": 30, "len_ratio": 3.0, "drop_empty": True},
                 max_source_positions=20, max_target_positions=1024, max_tokens=24)
    train = gettext_splits["train"]
    base = [(s, t) for s, t in train if clean(s, t)][:300]
    english = [s for s, _ in train if count(s) >= 3]
    german = [t for _, t in train if count(t) >= 3]

    def joined(texts, low, high, skip=0):
        """A concatenation of consecutive real sentences with low..high pieces."""
        for start in range(skip, len(texts)):
            text = ""
            for piece in texts[start:]:
                text = f"{text} {piece}".strip()
                if count(text) > high:
                    break
                if count(text) >= low:
                    return text
        raise AssertionError("no such text")

    short = next(s for s, _ in base if count(s) <= 4)
    planted = {
        "empty": [("", train[0][1]), ("", train[1][1]), ("", train[2][1]), (train[3][0], "   "), (train[4][0], "")],
        "too_long": [(joined(english, 31, 60, k), joined(german, 5, 30, k)) for k in range(4)],
        "bad_ratio": [(short, joined(german, 3 * count(short) + 1, 30, k)) for k in range(3)],
        "over_positions": [(e, e) for e in (joined(english, 20, 23, k) for k in range(2))],
        "over_max_tokens": [(joined(english, 10, 18, k), joined(german, 24, 30, k)) for k in range(2)],
    }
    for name, pairs in planted.items():
        for s, t in pairs:  # each breaks its rule and no earlier one
            later = list(planted).index(name)
            assert later < 1 or (count(s) and count(t)), name
            assert later < 2 or max(count(s), count(t)) <= 30, name
            assert later < 3 or max(count(s), count(t)) <= 3 * min(count(s), count(t)), name
            assert later < 4 or count(s) + 1 <= 20, name
    lines = [(pair, None) for pair in base] + [(pair, name) for name, pairs in planted.items() for pair in pairs]
    random.Random(1).shuffle(lines)
    root = writers.files(tmp_path / "planted", {"train": [p for p, _ in lines],
                                                "valid": gettext_splits["valid"][:20]})
    module = make_dm(root, spm_model=str(dm.prepared.spm_model), **rules)
    module.setup("fit")
    report = module.reports["train"]
    expected = {name: len(pairs) for name, pairs in planted.items()}
    assert {name: getattr(report, name) for name in expected} == expected
    assert (report.total, report.kept) == (len(lines), len(base))
    assert module.train_indices.tolist() == [i for i, (_, rule) in enumerate(lines) if rule is None]
    print(f"\n{report.line()}")


def test_evaluation_splits_are_never_filtered_only_truncated(dm, parallel_root):
    module = make_dm(parallel_root, max_source_positions=8, max_target_positions=8, clean={"max_len": 5})
    module.setup("validate")
    sizes = module.datasets["valid"].encoded
    long = int(((sizes.src.sizes + 1 > 8) | (sizes.tgt.sizes + 1 > 8)).sum())
    report = module.reports["valid"]
    assert long > 0 and (report.total, report.kept, report.truncated) == (200, 200, long)
    batches = list(module.loader("valid"))
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(200))
    assert max(max(b["src_tokens"].shape[1], b["target"].shape[1]) for b in batches) == 8


# --- token-budget batches -----------------------------------------------------------------------
def test_batches_fit_the_budget_and_cover_every_pair_once(dm):
    loader = dm.loader("train")
    assert isinstance(loader, TokenBatchLoader) and isinstance(loader.sampler, DistributedSampler)
    for number in (0, 1):
        batches = epoch(loader, number)
        assert len(batches) == len(loader)
        for b in batches:
            assert len(b["id"]) * max(b["src_tokens"].shape[1], b["target"].shape[1]) <= dm.max_tokens
        ids = [i for b in batches for i in b["id"].tolist()]
        assert sorted(ids) == dm.train_indices.tolist() == list(range(2000))


def test_order_is_seeded_and_changes_every_epoch(dm, parallel_root):
    a, b = dm.loader("train"), make_dm(parallel_root).loader("train")
    assert ids_of(epoch(a, 0)) == ids_of(epoch(b, 0))
    assert ids_of(epoch(a, 0)) != ids_of(epoch(a, 1))
    assert sorted(map(tuple, ids_of(epoch(a, 0)))) == sorted(map(tuple, ids_of(epoch(a, 1))))  # same batches
    other = make_dm(parallel_root, seed=1).loader("train")
    assert ids_of(epoch(other, 0)) != ids_of(epoch(a, 0))


def test_two_ranks_get_equal_counts_and_split_the_epoch(dm):
    single = ids_of(epoch(dm.loader("train"), 2))
    ranks = [ids_of(epoch(dm.loader("train", num_replicas=2, rank=r), 2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == math.ceil(len(single) / 2)
    # rank r runs batches r, r + 2, ... of the one-process order; an odd count repeats the first
    padded = single + single[:len(ranks[0]) * 2 - len(single)]
    assert ranks[0] == padded[0::2] and ranks[1] == padded[1::2]
    seen = Counter(i for rank in ranks for batch in rank for i in batch)
    repeated = Counter(i for batch in padded[len(single):] for i in batch)
    assert seen == Counter(range(2000)) + repeated


def test_evaluation_under_two_ranks_sees_every_sentence_once(dm):
    single = list(dm.loader("valid"))
    assert ids_of(single) == ids_of(dm.loader("valid"))  # deterministic, no shuffle
    ranks = [list(dm.loader("valid", num_replicas=2, rank=r)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == math.ceil(len(single) / 2)
    real = [i for rank in ranks for b in rank for i in b["id"].tolist() if i >= 0]
    assert sorted(real) == list(range(200))
    fillers = [b for rank in ranks for b in rank if (b["id"] < 0).any()]
    assert len(fillers) == len(ranks[0]) * 2 - len(single)
    for b in fillers:
        assert (b["id"] == -1).all() and b["ntokens"] == 0 and b["nsentences"] == 0 and (b["target"] == PAD).all()
    three = [list(dm.loader("valid", num_replicas=3, rank=r)) for r in range(3)]
    assert len({len(r) for r in three}) == 1
    assert sorted(i for r in three for b in r for i in b["id"].tolist() if i >= 0) == list(range(200))


def test_resume_mid_epoch_continues_with_the_next_batch(dm, parallel_root):
    full = ids_of(epoch(dm.loader("train", num_replicas=2, rank=1), 1))
    first = dm.loader("train", num_replicas=2, rank=1)
    assert isinstance(first, _Stateful)  # Lightning saves its state in checkpoints
    first.sampler.set_epoch(1)
    it = iter(first)
    seen = [next(it)["id"].tolist() for _ in range(3)]
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_seen"] == 3

    resumed = make_dm(parallel_root).loader("train", num_replicas=2, rank=1)  # a new process
    resumed.load_state_dict(state)
    rest = ids_of(resumed)  # the epoch comes from the state
    assert seen + rest == full
    assert resumed.state_dict()["batches_seen"] == len(resumed)
    assert ids_of(epoch(resumed, 2)) == ids_of(epoch(dm.loader("train", num_replicas=2, rank=1), 2))
    # a position means other batches under another layout: continuing that epoch is refused in
    # one line; the next epoch starts from its top
    other = dm.loader("train")
    other.load_state_dict(state)
    with pytest.raises(ResumeMismatch, match="num_replicas 2, this run has num_replicas 1"):
        epoch(other, 1)
    other.load_state_dict(state)
    assert ids_of(epoch(other, 2)) == ids_of(epoch(dm.loader("train"), 2))


def test_worker_processes_give_the_same_batches(dm, parallel_root):
    with_workers = make_dm(parallel_root, num_workers=2, persistent_workers=False)
    with_workers.setup("fit")
    a, b = epoch(with_workers.loader("train"), 1), epoch(dm.loader("train"), 1)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert all(torch.equal(x[k], y[k]) for k in ("id", "src_tokens", "prev_output_tokens", "target"))


def test_padding_efficiency_of_length_buckets(dm):
    dataset = dm.datasets["train"]
    batches = dm.loader("train").sampler.batches
    bucketed = padding_efficiency(batches, dataset.src_sizes, dataset.tgt_sizes)
    order = np.random.default_rng(0).permutation(2000)
    shuffled = padding_efficiency([order[i:i + 64] for i in range(0, 2000, 64)], dataset.src_sizes, dataset.tgt_sizes)
    print(f"\npadding efficiency on {len(dataset)} real pairs: length-bucketed {dm.max_tokens}-token batches "
          f"{bucketed:.3f} ({len(batches)} batches), random 64-pair batches {shuffled:.3f}")
    assert bucketed > 0.8 and shuffled < 0.5


# --- the prepare command ------------------------------------------------------------------------
def test_prepare_command_builds_what_training_loads(parallel_root, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    assert prepare.main([str(parallel_root), "--vocab_size", "400", "--cache_dir", str(cache),
                         "--len_ratio", "0"]) == 0
    out = capsys.readouterr().out
    assert "train: 2000 pairs" in out and "valid: 200 pairs" in out and "padding efficiency" in out
    model = next(cache.glob("spm-bpe400-*.model"))
    assert f"recorded in {cache / 'prepared.json'}: en-de, vocabulary 400" in out
    assert f"train with --data.root {parallel_root} --data.cache_dir {cache}" in out

    def forbidden(*args, **kwargs):
        raise AssertionError("prepared data were built again")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", forbidden)
    monkeypatch.setattr(binarize, "_encode_side", forbidden)
    by_options = make_dm(parallel_root, vocab_size=400, cache_dir=str(cache))
    by_options.setup("fit")
    by_model = TranslationDataModule(str(parallel_root), spm_model=str(model), cache_dir=str(cache), num_workers=0)
    assert by_model.vocab_size == 400  # read from the model in __init__, ready for linking
    by_model.setup("fit")
    by_record = TranslationDataModule(str(parallel_root), cache_dir=str(cache), num_workers=0)  # nothing repeated
    assert (by_record.vocab_size, by_record.settings.spm_model) == (400, str(model.resolve()))
    by_record.setup("fit")


# --- one-line errors ----------------------------------------------------------------------------
def test_missing_folder_and_files(tmp_path, gettext_splits, writers):
    with pytest.raises(DataError) as err:
        make_dm(tmp_path / "nowhere").setup("fit")
    assert "not found" in one_line(err) and "nowhere" in str(err.value)
    root = writers.files(tmp_path / "one_side", {"train": gettext_splits["train"][:50]})
    (root / "train.de").unlink()
    with pytest.raises(DataError) as err:
        make_dm(root).setup("fit")
    assert "train.de is missing" in one_line(err)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as err:
        make_dm(empty).setup("fit")
    assert "train.en and train.de" in one_line(err)


def _english_spanish(folder):
    folder.mkdir()
    (folder / "train.en").write_text("Hello.\nThe house is red.\n", encoding="utf-8")
    (folder / "train.es").write_text("Hola.\nLa casa es roja.\n", encoding="utf-8")
    return folder


def test_another_language_pair_names_the_languages_and_the_flag(tmp_path, error_line):
    """An English-Spanish folder under the default en-de: the line names the folder's languages
    and the option to set, as the command at hand spells it."""
    from rescale_tasks.cli import main

    root = _english_spanish(tmp_path / "sword_en_es")
    assert main(["prepare-translation", str(root)]) == 2
    assert error_line() == (f"train.de is missing in {root} (the root argument) although train.en is there; "
                            "--tgt_lang is de but the folder holds languages en, es: pass --tgt_lang es")
    with pytest.raises(DataError) as err:  # rescale fit: the data module's own option
        make_dm(root).setup("fit")
    assert one_line(err).endswith("--data.tgt_lang is de but the folder holds languages en, es: "
                                  "pass --data.tgt_lang es")
    (root / "train.en").rename(root / "train.fr")  # neither side of en-de: both options named
    assert main(["prepare-translation", str(root)]) == 2
    assert error_line().endswith("the folder holds languages es, fr: pass --src_lang and --tgt_lang "
                                 "(e.g. --src_lang es --tgt_lang fr)")


def test_prepare_translation_names_its_own_arguments(tmp_path, gettext_splits, writers, error_line):
    """Its corpus folder is the positional root and its options have no ``data.`` prefix; ``rescale
    fit`` names the data module's."""
    from rescale_tasks.cli import main

    nowhere = tmp_path / "nowhere"
    assert main(["prepare-translation", str(nowhere)]) == 2
    assert error_line() == (f"translation data folder not found: {nowhere} (the root argument); pass the folder "
                            "holding train.en/train.de (or train.tsv).")
    with pytest.raises(DataError) as err:
        make_dm(nowhere).setup("fit")
    assert one_line(err).startswith(f"translation data folder not found: {nowhere} (data.root); point --data.root at")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["prepare-translation", str(empty)]) == 2
    assert error_line().endswith("; check the root argument, --src_lang/--tgt_lang and --layout.")
    assert main(["prepare-translation", str(empty), "--src_lang", "de"]) == 2
    assert error_line() == "--src_lang and --tgt_lang are both 'de'; give two languages."
    root = writers.files(tmp_path / "valid_only", {"valid": gettext_splits["valid"][:20]})
    assert main(["prepare-translation", str(root)]) == 2
    assert error_line() == (f"no training text in {root} (the root argument) to train the SentencePiece model on; "
                            "add the train split, or pass --spm_model PATH.")
    assert main(["prepare-translation", str(root), "--spm_model", str(tmp_path / "absent.model")]) == 2
    assert error_line() == (f"SentencePiece model not found: {tmp_path / 'absent.model'} (--spm_model); give an "
                            "existing .model file, or leave out --spm_model to train one on the training text.")
    assert main(["prepare-translation", str(root), "--cache_dir", str(root / "valid.en")]) == 2
    assert error_line() == (f"cache folder not writable: {root / 'valid.en'} (--cache_dir); point it at a folder "
                            "you can write to.")


def test_missing_validation_split(tmp_path, gettext_splits, writers, dm):
    root = writers.files(tmp_path / "no_valid", {"train": gettext_splits["train"][:100]})
    with pytest.raises(DataError) as err:
        make_dm(root, spm_model=str(dm.prepared.spm_model)).setup("fit")
    assert "no valid split" in one_line(err) and "valid.en and valid.de" in str(err.value)


def test_unequal_line_counts_name_the_file_and_both_counts(tmp_path, gettext_splits, writers):
    root = writers.files(tmp_path / "unequal", {"train": gettext_splits["train"][:300]})
    with open(root / "train.de", "a", encoding="utf-8") as f:
        f.write("eine Zeile zu viel\n")
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=200).setup("fit")
    message = one_line(err)
    assert "train.en has 300 lines but train.de has 301" in message and str(root) in message


def test_line_breaks_inside_sentences_do_not_shift_pairs(tmp_path, gettext_splits, writers, dm):
    """Only \\n ends a line: a \\r or U+2028 inside a sentence stays inside it."""
    pairs = list(gettext_splits["train"][:100])
    pairs[10] = (pairs[10][0] + "\u2028" + pairs[11][0], pairs[10][1] + "\r" + pairs[11][1])
    root = writers.files(tmp_path / "breaks", {"train": pairs})
    module = make_dm(root, spm_model=str(dm.prepared.spm_model))
    module.setup()
    assert len(module.datasets["train"]) == 100


def test_an_empty_split_to_evaluate_is_one_line_not_an_evaluation_of_nothing(tmp_path, gettext_splits, writers):
    """Zero-byte test files (a download that failed): `rescale test` finished with no BLEU and `predict`
    with no translation, and a fit whose valid files are empty never validated. One line naming the
    files instead; an empty valid split with validation off (`limit_val_batches 0`) still trains."""
    root = writers.files(tmp_path / "empty", {"train": gettext_splits["train"][:300], "valid": [], "test": []})
    assert (root / "test.en").read_bytes() == b"" == (root / "valid.de").read_bytes()
    for stage, split in (("test", "test"), ("predict", "test"), ("fit", "valid"), ("validate", "valid")):
        with pytest.raises(DataError) as err:
            make_dm(root, vocab_size=200).setup(stage)
        assert one_line(err) == (f"{split}.en and {split}.de in {root} (data.root) are empty: the {split} split "
                                 "has no sentence pair to evaluate; write its pairs there, one per line.")
    module = make_dm(root, vocab_size=200)
    module.trainer = L.Trainer(limit_val_batches=0, logger=False, enable_checkpointing=False, accelerator="cpu")
    module.setup("fit")
    assert len(module.val_dataloader()) == 0 and len(module.train_dataloader()) > 0


def test_a_test_split_whose_lines_break_with_cr_only_is_refused_not_read_as_one_pair(tmp_path, gettext_splits,
                                                                                     writers):
    """A valid or test split whose two files break lines with \\r alone has as many lines on each side
    (one): it was read as one pair, and BLEU scored one sentence of the whole file (`test: 1 of 1 pairs
    kept`). One line naming the file instead, for the files and the TSV layout alike; a file that merely
    ends with a \\r reads as before."""
    splits = {"train": gettext_splits["train"][:300], "valid": gettext_splits["valid"][:20],
              "test": gettext_splits["test"][:20]}
    root = writers.files(tmp_path / "files", splits)
    for name in ("test.en", "test.de"):
        (root / name).write_bytes((root / name).read_bytes().replace(b"\n", b"\r"))
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=200).setup("test")
    assert one_line(err).startswith(f"{root / 'test.en'} breaks lines with \\r only (classic Mac OS line endings)")
    tsv = writers.tsv(tmp_path / "tsv", splits)
    (tsv / "valid.tsv").write_bytes((tsv / "valid.tsv").read_bytes().replace(b"\n", b"\r"))
    with pytest.raises(DataError) as err:
        make_dm(tsv, vocab_size=200).setup("validate")
    assert one_line(err).startswith(f"{tsv / 'valid.tsv'} breaks lines with \\r only")
    one = writers.files(tmp_path / "one", {**splits, "test": splits["test"][:1]})
    for name in ("test.en", "test.de"):
        (one / name).write_bytes((one / name).read_bytes().replace(b"\n", b"\r"))
    module = make_dm(one, vocab_size=200)
    module.setup("test")
    assert module.reports["test"].total == 1


def test_lines_too_long_for_sentencepiece_are_named_and_so_are_cr_only_line_breaks(tmp_path, gettext_splits, writers):
    """SentencePiece leaves out lines over its byte limit: a corpus whose every line is one is not said
    to be empty. A file whose breaks are \\r only is one line: named as such, on either side."""
    cr = "breaks lines with \\r only (classic Mac OS line endings): convert the \\r to \\n (e.g. tr '\\r' '\\n'); as it is, " \
         "all of it is one line (lines are split on \\n), one sentence pair for the whole file."
    root = writers.files(tmp_path / "cr_only", {"train": gettext_splits["train"][:300]})
    for name in ("train.en", "train.de"):
        (root / name).write_bytes((root / name).read_bytes().replace(b"\n", b"\r"))
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=200).setup("fit")
    assert one_line(err) == f"{root / 'train.en'} {cr}"
    one_side = writers.files(tmp_path / "cr_one_side", {"train": gettext_splits["train"][:300]})
    (one_side / "train.de").write_bytes((one_side / "train.de").read_bytes().replace(b"\n", b"\r"))
    with pytest.raises(DataError) as err:
        make_dm(one_side, vocab_size=200).setup("fit")
    assert one_line(err) == f"{one_side / 'train.de'} {cr}"
    paragraphs = [tuple(" ".join(side) for side in zip(*gettext_splits["train"][i:i + 1000])) for i in (0, 1000)]
    root = writers.files(tmp_path / "paragraphs", {"train": paragraphs})
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=200).setup("fit")
    assert one_line(err).endswith("longer than SentencePiece's limit of 4192 bytes, which it leaves out; put one "
                                  "sentence on each line.")


def test_a_byte_order_mark_is_not_text(tmp_path, gettext_splits, writers, dm):
    """A UTF-8 byte-order mark opening a split file is read as no part of its first line: not in
    the references BLEU scores against, the sources translated, the text SentencePiece is trained
    on, nor a translated input."""
    splits = {"train": gettext_splits["train"][:100], "test": gettext_splits["test"][:20]}
    root = writers.files(tmp_path / "bom", splits)
    tsv = writers.tsv(tmp_path / "bom_tsv", splits)
    for path in (root / "train.en", root / "test.en", root / "test.de", tsv / "test.tsv"):
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    for folder in (root, tsv):
        module = make_dm(folder, spm_model=str(dm.prepared.spm_model))
        module.setup("test")
        assert module.references("test")[0] == splits["test"][0][1]
        assert module.sources("test")[0] == splits["test"][0][0]
    assert next(module.prepared.sources["train"].lines(0)) == splits["train"][0][0]
    with open(root / "test.en", "rb") as f:
        assert read_lines(f, "test.en")[0] == splits["test"][0][0]



@pytest.mark.parametrize("layout", ["files", "tsv"])
def test_a_utf16_file_is_named_as_such_with_its_conversion(tmp_path, gettext_splits, writers, dm, layout):
    """Windows PowerShell's > writes UTF-16: its line breaks are \\n\\0, so counted as UTF-8 lines it
    looked one line longer than its other side, and the Latin-1 conversion the usual message advises
    would make a valid UTF-8 file of garbage. It is named as UTF-16, with the conversion from UTF-16."""
    root = getattr(writers, layout)(tmp_path / layout, {"train": gettext_splits["train"][:100]})
    path = root / ("train.en" if layout == "files" else "train.tsv")
    path.write_bytes(path.read_text(encoding="utf-8").encode("utf-16"))
    with pytest.raises(DataError) as err:
        make_dm(root, spm_model=str(dm.prepared.spm_model)).setup("fit")
    assert one_line(err) == (f"{path} is not UTF-8: it is UTF-16 (it opens with a UTF-16 byte-order mark, as Windows "
                             "PowerShell's > and Notepad's 'Unicode' write): convert it to UTF-8 (e.g. iconv -f UTF-16 "
                             "-t UTF-8).")
    with open(path, "rb") as f, pytest.raises(DataError) as err:  # rescale translate's input
        read_lines(f, "train.en (--input)")
    assert one_line(err).startswith("train.en (--input) line 1 is not UTF-8 (") and "iconv -f UTF-16" in str(err.value)


def test_empty_corpus_after_cleaning(tmp_path, gettext_splits, writers, dm):
    root = writers.files(tmp_path / "all_long", {"train": gettext_splits["train"][:200]})
    with pytest.raises(DataError) as err:
        make_dm(root, spm_model=str(dm.prepared.spm_model), clean={"max_len": 1}).setup("fit")
    message = one_line(err)
    assert "no training pairs left after cleaning" in message and "too_long" in message
    assert "train.en" in message and "data.clean" in message


def test_spm_model_with_other_special_ids(tmp_path, gettext_splits, parallel_root):
    path = tmp_path / "default_ids.model"
    with open(path, "wb") as f:  # SentencePiece's defaults: unk 0, bos 1, eos 2, no pad
        text = [s for p in gettext_splits["train"][:500] for s in p]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=f, vocab_size=300,
                                       model_type="bpe", minloglevel=2)
    with pytest.raises(DataError) as err:
        TranslationDataModule(str(tmp_path), spm_model=str(path))
    message = one_line(err)
    assert "bos=1 pad=-1 eos=2 unk=0" in message and "--pad_id=1" in message and str(path) in message
    not_a_model = tmp_path / "text.model"
    not_a_model.write_text("hello")
    with pytest.raises(DataError) as err:
        TranslationDataModule(str(tmp_path), spm_model=str(not_a_model))
    assert "is not a SentencePiece model" in one_line(err)
    with pytest.raises(DataError) as err:
        make_dm(parallel_root, spm_model=str(tmp_path / "absent.model")).setup("fit")
    assert "SentencePiece model not found" in one_line(err)


def test_bad_tsv_lines_and_text(tmp_path, gettext_splits, writers):
    root = writers.tsv(tmp_path / "tsv", {"train": gettext_splits["train"][:100]})
    with open(root / "train.tsv", "a", encoding="utf-8") as f:
        f.write("one\ttwo\tthree\n")
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=200).setup("fit")
    assert "line 101 has 3 tab-separated fields" in one_line(err)
    # a line without a tab, a blank line: what is wrong and the fix for each, not "remove tabs"
    for line, said in ((f"{gettext_splits['train'][0][0]} {gettext_splits['train'][0][1]}\n",
                        "line 101 has no tab; a TSV corpus needs exactly 2 tab-separated fields per line "
                        "(source<TAB>target): put a tab between the source and the target sentence."),
                       ("\r\n", "line 101 is blank; a TSV corpus needs exactly 2 tab-separated fields per line "
                                 "(source<TAB>target): remove the line, or write a tab on it for a pair of empty "
                                 "sentences.")):
        lines = (root / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (root / "train.tsv").write_text("".join(lines[:100]) + line, encoding="utf-8")
        with pytest.raises(DataError) as err:
            make_dm(root, vocab_size=200).setup("fit")
        assert one_line(err).endswith(said)
    latin = writers.files(tmp_path / "latin", {"train": gettext_splits["train"][:50]})
    with open(latin / "train.de", "ab") as f:
        f.write("Größe\n".encode("latin-1"))
    with open(latin / "train.en", "a", encoding="utf-8") as f:
        f.write("size\n")
    with pytest.raises(DataError) as err:
        make_dm(latin, vocab_size=200).setup("fit")
    assert "train.de line 51 is not UTF-8" in one_line(err)


def test_vocabulary_too_large_for_the_text(tmp_path, gettext_splits, writers, error_line):
    """The limit and the option to lower, as the command at hand spells it."""
    from rescale_tasks.cli import main

    root = writers.files(tmp_path / "small", {"train": gettext_splits["train"][:40]})
    with pytest.raises(DataError) as err:
        make_dm(root, vocab_size=32000).setup("fit")
    message = one_line(err)
    assert "vocab_size=32000 is too large" in message and "--data.vocab_size" in message
    limit = message.split("use --data.vocab_size ")[1].split()[0]
    assert main(["prepare-translation", str(root)]) == 2  # its option is --vocab_size
    line = error_line()
    assert "vocab_size=32000 is too large" in line and f"use --vocab_size {limit} or less" in line
    assert "--data." not in line


def test_bad_options_are_config_errors(tmp_path):
    for kwargs, text in (({"max_tokens": 0}, "data.max_tokens"), ({"src_lang": "de"}, "both 'de'"),
                         ({"layout": "xml"}, "data.layout"), ({"clean": {"len_ratio": 0.5}}, "len_ratio"),
                         ({"model_type": "char"}, "model_type"), ({"vocab_size": 3}, "vocab_size")):
        with pytest.raises(ConfigError) as err:
            make_dm(tmp_path, **kwargs).setup("fit")
        assert text in one_line(err)


# --- inside Lightning ---------------------------------------------------------------------------
class _Recorder(L.LightningModule):
    """Records the ids of every batch it trains and validates on."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.trained, self.validated = [], []

    def training_step(self, batch, batch_idx):
        self.trained.append(batch["id"].tolist())
        return self.weight * batch["ntokens"]

    def validation_step(self, batch, batch_idx):
        self.validated.extend(i for i in batch["id"].tolist() if i >= 0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(module, datamodule, folder, ckpt_path=None, **trainer_options):
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=folder,
                        **trainer_options)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_lightning_uses_the_loaders_as_they_are_and_resumes_mid_epoch(parallel_root, tmp_path):
    full = _Recorder()
    trainer = _fit(full, make_dm(parallel_root), tmp_path / "full", enable_checkpointing=False)
    per_epoch = len(trainer.train_dataloader)
    assert len(full.trained) == 2 * per_epoch
    assert full.trained[:per_epoch] != full.trained[per_epoch:]  # set_epoch reached the sampler
    assert sorted(full.validated) == sorted(list(range(200)) * 2)  # each epoch validates every line once

    checkpoints = tmp_path / "ckpt"
    cut = per_epoch + 5
    first = _Recorder()
    _fit(first, make_dm(parallel_root), tmp_path / "first", max_steps=cut,
         callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=cut,
                                                        save_top_k=-1, filename="cut")])
    resumed = _Recorder()
    _fit(resumed, make_dm(parallel_root), tmp_path / "resumed", ckpt_path=str(checkpoints / "cut.ckpt"),
         enable_checkpointing=False)
    assert first.trained + resumed.trained == full.trained
