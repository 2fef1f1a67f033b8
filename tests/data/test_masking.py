"""Whole-word masking on the real MiniLM vocabulary."""

from __future__ import annotations

import random
from collections import Counter

from mate_cli.data.masking import IGNORE, continuation_table, mask_words, word_spans


def encode(tokenizer, text):
    return tokenizer(text)["input_ids"]


def test_words_group_continuation_pieces_and_skip_specials(tokenizer):
    ids = encode(tokenizer, "the kilbrannan unbelievably xylophonist")
    pieces = tokenizer.convert_ids_to_tokens(ids)
    words = word_spans(ids, continuation_table(tokenizer), set(tokenizer.all_special_ids))
    assert [[pieces[p] for p in word] for word in words] == [
        ["the"],
        ["ki", "##lb", "##ran", "##nan"],
        ["un", "##bel", "##ie", "##va", "##bly"],
        ["x", "##yl", "##op", "##hon", "##ist"],
    ]
    assert words[0] == [1]  # [CLS] at 0 and [SEP] at the end are in no word


def test_whole_words_are_masked_together_at_the_rate(tokenizer):
    text = " ".join(["embankments of the ashford unbelievably long river"] * 20)
    ids = encode(tokenizer, text)
    words = word_spans(ids, continuation_table(tokenizer), set(tokenizer.all_special_ids))
    masked, labels = mask_words(
        ids, words, random.Random(0), tokenizer.mask_token_id, tokenizer.vocab_size, rate=0.15, max_predictions=10_000
    )
    picked = [w for w in words if labels[w[0]] != IGNORE]
    assert len(picked) == round(0.15 * len(words))
    for word in words:  # all of a word's pieces are predicted, or none
        assert len({labels[p] == IGNORE for p in word}) == 1
    assert all(labels[p] == ids[p] for p in range(len(ids)) if labels[p] != IGNORE)
    assert masked[0] == ids[0] and masked[-1] == ids[-1]  # [CLS], [SEP] never touched
    assert all(masked[p] == ids[p] for p in range(len(ids)) if labels[p] == IGNORE)


def test_eighty_ten_ten_and_the_prediction_cap(tokenizer):
    ids = list(range(1000, 3000))
    words = [[p] for p in range(len(ids))]
    outcome = Counter()
    for seed in range(20):
        masked, labels = mask_words(ids, words, random.Random(seed), 103, 30522, rate=0.5, max_predictions=10_000)
        for p, label in enumerate(labels):
            if label != IGNORE:
                outcome["mask" if masked[p] == 103 else "kept" if masked[p] == ids[p] else "random"] += 1
    total = sum(outcome.values())
    assert abs(outcome["mask"] / total - 0.8) < 0.02
    assert abs(outcome["random"] / total - 0.1) < 0.02 and abs(outcome["kept"] / total - 0.1) < 0.02
    _, labels = mask_words(ids, words, random.Random(0), 103, 30522, rate=0.5, max_predictions=20)
    assert sum(label != IGNORE for label in labels) == 20


def test_the_same_rng_masks_the_same_way(tokenizer):
    ids = encode(tokenizer, "which county is the town of ashford in")
    words = word_spans(ids, continuation_table(tokenizer), set(tokenizer.all_special_ids))
    first = mask_words(ids, words, random.Random(7), tokenizer.mask_token_id, tokenizer.vocab_size)
    assert first == mask_words(ids, words, random.Random(7), tokenizer.mask_token_id, tokenizer.vocab_size)
    assert mask_words(ids, [], random.Random(7), 103, 10) == (ids, [IGNORE] * len(ids))
