"""Greedy and beam search (``rescale_core.generation``): beam search against an exhaustive
search, greedy = beam 1, padding never changes a result, scores equal teacher-forced
log-probabilities, length limits and penalties, finished sentences leave the batch."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import rescale_core
from rescale_core.generation import (GenerationConfig, Hypothesis, beam_search, best_tokens, generate,
                                     greedy_search, length_penalty, max_lengths)

V, BOS, PAD, EOS = 20, 0, 1, 2
TOL = dict(atol=1e-4, rtol=1e-5)
IDS = dict(bos=BOS, eos=EOS)


def token_lists(nbest: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens.tolist() for h in hyps] for hyps in nbest]


def copy_batch(n: int, g: torch.Generator):
    """Sources of 2..7 words (right padded) and their copies as targets."""
    lens = torch.randint(2, 8, (n,), generator=g)
    S = int(lens.max())
    src = torch.randint(3, V, (n, S), generator=g)
    src[torch.arange(S)[None] >= lens[:, None]] = PAD
    tgt_in = torch.full((n, S + 1), PAD)
    tgt_out = torch.full((n, S + 1), PAD)
    for i, L in enumerate(lens.tolist()):
        tgt_in[i, 0], tgt_in[i, 1:L + 1] = BOS, src[i, :L]
        tgt_out[i, :L], tgt_out[i, L] = src[i, :L], EOS
    return src, tgt_in, tgt_out


@pytest.fixture(scope="module")
def model():
    """A Transformer trained for 60 steps to copy its input: it ends its outputs at varied
    lengths and is unsure enough that beam search and greedy search disagree."""
    torch.manual_seed(0)
    m = rescale_core.create_model("transformer_tiny", scheme="pre_ln", src_vocab_size=V,
                                  dropout=0.0, share_embeddings=True)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(60):
        src, tgt_in, tgt_out = copy_batch(32, g)
        loss = F.cross_entropy(m(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


@pytest.fixture(scope="module")
def sources():
    src, _, _ = copy_batch(10, torch.Generator().manual_seed(1))
    return src


def teacher_forced(model, src_row: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Log-probabilities of ``tokens + [eos]`` after bos, recomputed without any cache."""
    src = src_row[src_row.ne(PAD)][None]
    tgt_in = torch.tensor([[BOS] + tokens])
    with torch.no_grad():
        lp = model(src, tgt_in).float().log_softmax(-1)[0]
    return lp.gather(1, torch.tensor(tokens + [EOS])[:, None])[:, 0]


def check_hypothesis(model, src_row, h: Hypothesis, alpha=1.0, style="fairseq"):
    toks = h.tokens.tolist()
    assert PAD not in toks and EOS not in toks
    assert h.positional_scores.shape == (len(toks) + 1,)
    torch.testing.assert_close(h.positional_scores, teacher_forced(model, src_row, toks), **TOL)
    lp = length_penalty(len(toks) + 1, alpha, style)
    assert h.score == pytest.approx(h.log_prob / lp, abs=1e-5)


def test_beam_search_equals_exhaustive_search():
    """Vocabulary 5 (bos, pad, eos and two words; bos may be generated, pad never), at most 3
    tokens before EOS: 40 possible outputs. A beam of 64 holds all of them, so its n-best list
    must be every output, scored and ordered as an exhaustive search scores them, under either
    length penalty; and with min_len=1 the empty output is missing."""
    torch.manual_seed(3)
    model = rescale_core.create_model("transformer_tiny", scheme="post_ln", src_vocab_size=5,
                                      tie_output=False).eval()
    with torch.no_grad():
        model.output_projection.weight.mul_(8.0)  # spread the probabilities
    src = torch.tensor([[3, 4, 3, 4, 4], [4, 3, PAD, PAD, PAD]])
    words = [0, 3, 4]
    outputs = [list(t) for n in range(4) for t in itertools.product(words, repeat=n)]
    assert len(outputs) == 40
    for style, alpha, min_len in (("fairseq", 1.0, 0), ("gnmt", 0.6, 0), ("fairseq", 0.0, 1)):
        nbest = beam_search(model, src, **IDS, beam=64, max_len_a=0.0, max_len_b=3,
                            min_len=min_len, len_penalty=alpha, length_penalty_style=style)
        for i, hyps in enumerate(nbest):
            with torch.no_grad():
                expected = sorted(((float(teacher_forced(model, src[i], o).sum())
                                    / length_penalty(len(o) + 1, alpha, style), o)
                                   for o in outputs if len(o) >= min_len), reverse=True)
            got = [(h.score, h.tokens.tolist()) for h in hyps]
            assert len(got) == len(expected) == 40 - min_len
            assert [o for _, o in got] == [o for _, o in expected], (style, i)
            torch.testing.assert_close(torch.tensor([s for s, _ in got]),
                                       torch.tensor([s for s, _ in expected]), **TOL)
            # a small beam finds no better output than the exhaustive best
            small = beam_search(model, src[i:i + 1], **IDS, beam=2, max_len_a=0.0,
                                max_len_b=3, min_len=min_len, len_penalty=alpha,
                                length_penalty_style=style)[0]
            assert len(small) == 2 and small[0].score <= expected[0][0] + 1e-5


def fairseq_beam(model, src: torch.Tensor, beam: int, max_len: int, min_len: int, alpha: float, style: str):
    """fairseq's ``SequenceGenerator`` for one sentence, step by step from its description, every
    log-probability recomputed without a cache: at step 0 the one empty prefix; each step the
    ``min(2 * beam, candidates - 1)`` best extensions (pad never; EOS not before ``min_len``, only
    EOS at ``max_len``); those ending in EOS among the first ``beam`` finish (until ``beam`` have),
    scored by their summed log-probability / lp(tokens + EOS); the first ``beam`` others go on;
    the search ends with ``beam`` finished or at ``max_len``. ``(score, tokens)``, best first."""
    prefixes, finished = [([], 0.0)], []
    for step in range(max_len + 1):
        candidates = []
        for b, (tokens, score) in enumerate(prefixes):
            with torch.no_grad():
                lp = model(src, torch.tensor([[BOS] + tokens]))[0, -1].float().log_softmax(-1)
            lp[PAD] = -math.inf
            if step >= max_len:
                lp = torch.where(torch.arange(len(lp)) == EOS, lp, -math.inf)
            elif step < min_len:
                lp[EOS] = -math.inf
            candidates += [(score + float(lp[v]), b, v) for v in range(len(lp))]
        best = sorted(candidates, key=lambda c: -c[0])[:min(2 * beam, len(candidates) - 1)]
        for score, b, v in best[:beam]:
            if v == EOS and score > -math.inf and len(finished) < beam:
                finished.append((score / length_penalty(step + 1, alpha, style), prefixes[b][0]))
        if len(finished) == beam or step == max_len:
            break
        going_on = [c for c in best if not (c[2] == EOS and c[0] > -math.inf)][:beam]
        prefixes = [(prefixes[b][0] + [v], score) for score, b, v in going_on]
    return sorted(finished, key=lambda f: -f[0])


def test_a_small_beam_finds_what_fairseqs_search_finds():
    """With beams far narrower than the 7-word vocabulary, the batched search returns exactly the
    hypotheses (tokens, scores, order) of fairseq's algorithm run one sentence at a time: which
    candidates finish, which go on, when a sentence stops."""
    torch.manual_seed(5)
    model = rescale_core.create_model("transformer_tiny", scheme="post_ln", src_vocab_size=7,
                                      tie_output=False).eval()
    with torch.no_grad():
        model.output_projection.weight.mul_(6.0)  # peaked enough that EOS ends beams at varied steps
    src = torch.tensor([[3, 4, 5, 6, 2], [6, 5, 2, PAD, PAD]])
    for beam, alpha, style, min_len in ((2, 1.0, "fairseq", 1), (3, 0.6, "gnmt", 2)):
        nbest = beam_search(model, src, **IDS, beam=beam, max_len_a=0.0, max_len_b=5, min_len=min_len,
                            len_penalty=alpha, length_penalty_style=style)
        for row, hyps in zip(src, nbest):
            expected = fairseq_beam(model, row[row.ne(PAD)][None], beam, 5, min_len, alpha, style)
            assert [h.tokens.tolist() for h in hyps] == [tokens for _, tokens in expected], (beam, style)
            torch.testing.assert_close(torch.tensor([h.score for h in hyps]),
                                       torch.tensor([score for score, _ in expected]), **TOL)


def test_beam_hypotheses_are_teacher_forced_scores(model, sources):
    """Every returned hypothesis (beams reordered, sentences dropped on the way) scores exactly
    what the model gives its tokens without a cache; n-best lists are sorted, beam long."""
    for style, alpha in (("fairseq", 1.0), ("gnmt", 0.6)):
        nbest = beam_search(model, sources, **IDS, beam=4, max_len_a=1.0, max_len_b=2,
                            len_penalty=alpha, length_penalty_style=style)
        assert len(nbest) == len(sources)
        for src_row, hyps in zip(sources, nbest):
            assert len(hyps) == 4
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            assert len({tuple(h.tokens.tolist()) for h in hyps}) == 4
            for h in hyps:
                check_hypothesis(model, src_row, h, alpha, style)


def test_greedy_equals_beam_one_and_a_cache_free_greedy(model, sources):
    greedy = greedy_search(model, sources, **IDS, max_len_a=1.0, max_len_b=2)
    beam1 = beam_search(model, sources, **IDS, beam=1, max_len_a=1.0, max_len_b=2)
    assert len({len(h.tokens) for h in greedy}) > 2  # varied lengths: sentences finish apart
    for src_row, g, (b,) in zip(sources, greedy, beam1):
        assert g.tokens.tolist() == b.tokens.tolist()
        assert g.score == pytest.approx(b.score, abs=1e-6)
        check_hypothesis(model, src_row, g)
        # the argmax of the full decode at every step, no cache; EOS, unless forced at max_len
        prefix, n = [BOS], len(g.tokens)
        src = src_row[src_row.ne(PAD)][None]
        with torch.no_grad():
            while len(prefix) <= n + 1:
                prefix.append(int(model(src, torch.tensor([prefix]))[0, -1].argmax()))
        assert prefix[1:n + 1] == g.tokens.tolist()
        assert prefix[n + 1] == EOS or n == src.size(1) + 2
    # the beam finds outputs greedy search misses, with a better score (a non-trivial test)
    nbest = beam_search(model, sources, **IDS, beam=4, max_len_a=1.0, max_len_b=2)
    better = [n[0].score > g.score + 1e-6 for n, g in zip(nbest, greedy)]
    assert any(better) and all(n[0].score >= g.score - 1e-6 for n, g in zip(nbest, greedy))
    # generate(): the config's search
    config = GenerationConfig(beam=1, max_len_a=1.0, max_len_b=2)
    out = generate(model, sources, **IDS, config=config)
    assert token_lists(out) == token_lists([[h] for h in greedy])
    config = GenerationConfig(max_len_a=1.0, max_len_b=2)  # beam 4
    assert token_lists(generate(model, sources, **IDS, config=config)) == token_lists(nbest)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_padding_never_changes_a_result(model, sources, search):
    """Each sentence translated alone (no padding) and inside the padded batch, a batch padded
    further and a left-padded batch: identical tokens, equal scores."""
    def run(src):
        if search == "greedy":
            return [[h] for h in greedy_search(model, src, **IDS, max_len_a=1.0, max_len_b=2)]
        return beam_search(model, src, **IDS, beam=3, max_len_a=1.0, max_len_b=2)

    batch = run(sources)
    wider = run(torch.cat([sources, torch.full((len(sources), 5), PAD)], 1))
    left = run(torch.stack([torch.cat([row[row.eq(PAD)], row[row.ne(PAD)]]) for row in sources]))
    for i, src_row in enumerate(sources):
        alone = run(src_row[src_row.ne(PAD)][None])[0]
        for other in (batch[i], wider[i], left[i]):
            assert [h.tokens.tolist() for h in other] == [h.tokens.tolist() for h in alone]
            torch.testing.assert_close(torch.tensor([h.score for h in other]),
                                       torch.tensor([h.score for h in alone]), **TOL)


def test_length_limits(model, sources, monkeypatch):
    lens = sources.ne(PAD).sum(1).tolist()
    assert max_lengths(model, sources, 0.5, 1) == [int(0.5 * n + 1) for n in lens]
    assert max_lengths(model, sources, 1000.0, 0) == [model.config.max_positions - 1] * len(lens)
    # no output longer than its sentence's own limit; EOS forced there
    limits = dict(max_len_a=0.5, max_len_b=0)
    for hyps in (greedy_search(model, sources, **IDS, **limits),
                 [n[0] for n in beam_search(model, sources, **IDS, **limits)]):
        assert all(len(h.tokens) <= int(0.5 * n) for h, n in zip(hyps, lens))
        assert any(len(h.tokens) == int(0.5 * n) for h, n in zip(hyps, lens))
    # a model that never wants EOS stops exactly at the limit; one that always wants it at min_len
    decode_step = model.decode_step
    for eos_shift, expect in ((-50.0, lambda n: int(0.5 * n + 1)), (50.0, lambda n: 2)):
        def shifted(tokens, cache):
            logits = decode_step(tokens, cache).clone()
            logits[..., EOS] += eos_shift
            return logits

        monkeypatch.setattr(model, "decode_step", shifted)
        limits = dict(max_len_a=0.5, max_len_b=1, min_len=2)
        for hyps in (greedy_search(model, sources, **IDS, **limits),
                     [n[0] for n in beam_search(model, sources, **IDS, beam=2, **limits)]):
            assert [len(h.tokens) for h in hyps] == [expect(n) for n in lens]
    monkeypatch.undo()
    # min_len above a sentence's limit: the forced EOS wins
    short = greedy_search(model, sources, **IDS, max_len_a=0.0, max_len_b=1, min_len=5)
    assert all(len(h.tokens) == 1 for h in short)


def test_length_penalties():
    assert length_penalty(4, 1.0) == 4.0 and length_penalty(4, 0.0) == 1.0
    assert length_penalty(4, 0.6, "fairseq") == pytest.approx(4 ** 0.6)
    assert length_penalty(4, 0.6, "gnmt") == pytest.approx((9 / 6) ** 0.6)
    assert length_penalty(1, 1.0, "gnmt") == 1.0
    with pytest.raises(ValueError, match="length_penalty_style"):
        length_penalty(3, 1.0, "wu")
    with pytest.raises(ValueError, match="beam"):
        GenerationConfig(beam=0)
    with pytest.raises(ValueError, match="length_penalty_style"):
        GenerationConfig(length_penalty_style="hf")


@pytest.mark.parametrize("settings, refused", [
    (dict(max_len_a=0.0, max_len_b=0), "allow no token: every translation .* would be empty"),
    (dict(len_penalty=math.nan), "len_penalty must be a finite number, got nan"),
    (dict(len_penalty=-math.inf), "len_penalty must be a finite number"),
    (dict(max_len_a=math.inf), "max_len_a must be a finite number"),
    (dict(max_len_a=-1.0), "max_len_a and max_len_b must be >= 0, got -1.0 and 10"),
    (dict(max_len_b=-1), "max_len_a and max_len_b must be >= 0"),
], ids=["no-token", "nan-penalty", "infinite-penalty", "infinite-a", "negative-a", "negative-b"])
def test_settings_no_search_can_decode_with_are_refused(settings, refused, sources):
    """Lengths that allow no token, negative or not finite, and a penalty that is not finite: a
    ValueError naming them, from the settings and from each search before the model is called."""
    with pytest.raises(ValueError, match=refused):
        GenerationConfig(**settings)
    for search in (greedy_search, beam_search):
        with pytest.raises(ValueError, match=refused):
            search(None, sources, **IDS, **settings)


def test_finished_sentences_leave_the_batch_in_eval_mode(model, sources, monkeypatch):
    calls = []
    decode_step = model.decode_step

    def spy(tokens, cache):
        calls.append((tokens.size(0), model.training))
        return decode_step(tokens, cache)

    monkeypatch.setattr(model, "decode_step", spy)
    model.train()
    try:
        beam_search(model, sources, **IDS, beam=4, max_len_a=1.0, max_len_b=2)
        assert model.training and all(m.training for m in model.modules())  # restored
    finally:
        model.eval()
    rows = [r for r, _ in calls]
    assert not any(training for _, training in calls)  # dropout off while searching
    assert rows[0] == 4 * len(sources) and rows == sorted(rows, reverse=True) and rows[-1] < rows[0]
    assert all(r % 4 == 0 for r in rows)


def test_greedy_decode_wraps_greedy_search(model, sources):
    out = model.greedy_decode(sources, BOS, EOS, max_len=6)
    hyps = greedy_search(model, sources, **IDS, max_len_a=0.0, max_len_b=6, min_len=0)
    assert out.shape[1] == max(min(len(h.tokens) + 1, 6) for h in hyps)
    for row, h in zip(out, hyps):
        expect = (h.tokens.tolist() + [EOS])[:6]
        assert row.tolist() == expect + [PAD] * (out.shape[1] - len(expect))
    with pytest.raises(ValueError, match="pad"):
        greedy_search(model, sources, bos=BOS, eos=PAD)
    assert rescale_core.beam_search is beam_search and "generation" in rescale_core.__all__
    assert not math.isinf(hyps[0].score)


def test_a_model_of_non_finite_scores_finishes_no_beam_and_translates_to_nothing(sources):
    """A diverged model (NaN weights): every beam dies, so a sentence has no hypothesis, and its
    best tokens are none (an empty line), not an error."""
    broken = rescale_core.create_model("transformer_tiny", scheme="pre_ln", src_vocab_size=V, dropout=0.0,
                                       share_embeddings=True).eval()
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(float("nan"))
    nbest = generate(broken, sources, **IDS, config=GenerationConfig(beam=2))
    assert nbest == [[]] * len(sources)
    assert [best_tokens(hyps).tolist() for hyps in nbest] == [[]] * len(sources)
