"""The head's lexical block: its terms, its tf-idf rows, what it adds to the ranking (in the resolver's head and in
the calibration's cross-fitted cases) and its stored form. The registries are synthetic and seeded: capabilities
come in twins that share one direction, so only the words of their examples tell them apart."""

from __future__ import annotations

import numpy as np

from routing import calibration as cal
from routing.lexical import Lexicon, terms

DIM = 32


def test_terms_are_words_and_cjk_characters_with_their_pairs():
    assert terms("where is my parcel") == ["where", "is", "my", "parcel", "where is", "is my", "my parcel"]
    # one-letter words are no terms; inside Chinese every character is one, pairs included
    assert terms("a 订单") == ["订", "单", "订 单"]
    assert "物 流" in terms("订单物流到哪了") and "流" in terms("订单物流到哪了")


def test_a_text_gets_the_same_row_alone_or_in_a_batch():
    lexicon = Lexicon.fit(["reset my pin", "block my card", "card arrival date", "pin change"])
    batch = lexicon.transform(["my card pin", "nothing known here", "card card arrival"]).toarray()
    for i, text in enumerate(["my card pin", "nothing known here", "card card arrival"]):
        np.testing.assert_allclose(lexicon.transform([text]).toarray()[0], batch[i])
    assert np.allclose(np.linalg.norm(batch[[0, 2]], axis=1), 1.0)
    assert not batch[1].any()  # terms outside the vocabulary are ignored
    # sublinear tf: a repeated word weighs more, not twice as much
    row = batch[2]
    card, arrival = lexicon.index["card"], lexicon.index["arrival"]
    assert row[card] > 0 and row[arrival] > 0


def _registry(seed: int, k: int = 24, n: int = 10):
    """k capabilities in pairs that share one direction (their vectors alone often confuse a pair); each capability
    has a word of its own in every example, next to a word drawn at random."""
    rng = np.random.default_rng(seed)
    shared = cal._unit(rng.normal(size=(k // 2, DIM)))
    own = cal._unit(rng.normal(size=(k, DIM)))
    vocabulary = [f"w{i}" for i in range(k)]
    examples, texts, fresh = [], [], []
    for c in range(k):
        # twins' centroids are about 0.9 apart (not one family), but each example's noise outweighs what is its own
        noise = cal._unit(rng.normal(size=(n + 3, DIM)))  # 3 more: new requests (``fresh``)
        drawn = cal._unit(shared[c // 2] + 0.35 * own[c] + 1.2 * noise).astype(np.float32)
        examples.append(drawn[:n])
        fresh.append(drawn[n:])
        words = [vocabulary[c]] * n
        texts.append([f"please {w} {vocabulary[int(rng.integers(k))]} now" for w in words])
    return examples, cal.RegistryTexts(examples=texts, negatives=[[] for _ in range(k)],
                                       extras=[np.zeros((0, DIM), np.float32) for _ in range(k)],
                                       extra_texts=[[] for _ in range(k)]), fresh


def test_the_head_tells_apart_what_only_the_words_tell_apart():
    examples, texts, fresh = _registry(0)
    rows = list(range(len(examples)))
    plain = cal.fit_head(examples, rows)
    head = cal.fit_head(examples, rows, texts)
    assert plain.L is None and head.L is not None

    def right(h):
        return sum(int(np.argmax(h.logits(rows, q, h.words(f"please w{c} w0 now"))) == c)
                   for c in range(len(examples)) for q in fresh[c][:3])

    # on the vector alone many go to the twin; with the words nearly none do
    assert right(head) >= 0.9 * 3 * len(examples)
    assert right(plain) < 0.7 * 3 * len(examples)
    # and the reasons can name the word that carried it
    assert "w5" in [w for w, _ in head.word_evidence(5, head.words("please w5 w0 now"))]
    assert plain.word_evidence(5, plain.words("please w5 w0 now")) == []


def test_the_calibration_scores_its_cases_with_the_same_lexical_head():
    examples, texts, fresh = _registry(3)
    negatives = [np.zeros((0, DIM), np.float32) for _ in examples]
    F_plain, right_plain, oos_plain, _, _, _ = cal.simulated_cases(examples, negatives, head=True)
    F_words, right_words, oos_words, _, _, _ = cal.simulated_cases(examples, negatives, head=True, texts=texts)
    assert len(F_plain) == len(F_words)
    # the held-back examples of twin capabilities are ranked right once the words are learnt
    assert right_words[~oos_words].mean() > right_plain[~oos_plain].mean() + 0.2


def test_the_stored_head_gives_the_same_logits():
    examples, texts, fresh = _registry(2)
    head = cal.fit_head(examples, [100 + c for c in range(len(examples))], texts)
    again = cal.Head.from_bytes(head.to_bytes())
    rows = [0, 3, 5]
    q = examples[3][0]
    np.testing.assert_allclose(again.logits(rows, q, again.words("please w3 w1 now")), head.logits(rows, q, head.words("please w3 w1 now")),
                               rtol=1e-5, atol=1e-5)
    assert list(again.version_ids) == [100 + c for c in range(len(examples))]
    # a head stored by an older release (no lexical block) still loads and ranks on the vector alone
    plain = cal.Head(version_ids=head.version_ids, W=head.W, b=head.b)
    old = cal.Head.from_bytes(plain.to_bytes())
    assert old.L is None
    np.testing.assert_allclose(old.logits(rows, q, old.words("please w3 w1 now")), plain.logits(rows, q), rtol=1e-5, atol=1e-5)


def test_above_the_cost_bound_the_head_keeps_the_descriptions_but_not_the_words():
    examples, texts, _ = _registry(4)
    texts.extras = [e[:1] for e in examples]  # a "description" row per capability
    texts.extra_texts = [[f"about w{c}"] for c in range(len(examples))]
    texts.lexical = False  # what calibration_refresh sets above LEXICAL_MAX_CAPABILITIES
    rows = list(range(len(examples)))
    head = cal.fit_head(examples, rows, texts)
    assert head.L is None and head.lexicon is None
    assert not np.allclose(head.W, cal.fit_head(examples, rows).W)  # the extra rows still train it
