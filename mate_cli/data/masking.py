"""Whole-word masking for masked-LM pre-training (BERT; TAPAS pre-trains tables this way, MATE App. A.1).

Text and table tokens are masked alike; the layout is untouched. Randomness comes only from the
``random.Random`` passed in (seeding: :class:`~mate_cli.data.pretraining.MaskedTables`).
"""

from __future__ import annotations

import random
from typing import Sequence

#: label of positions that are not predicted (PyTorch's cross-entropy ignore_index)
IGNORE = -100


def continuation_table(tokenizer) -> list[bool]:
    """``table[id]``: whether vocabulary entry ``id`` continues a word (``##...``)."""
    vocab = tokenizer.get_vocab()
    table = [False] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        table[index] = token.startswith("##")
    return table


def word_spans(input_ids: Sequence[int], continues: Sequence[bool], special_ids: set[int]) -> list[list[int]]:
    """Positions grouped by word, in order: a piece starting with ``##`` continues the word before it; special
    tokens ([CLS], [SEP], [PAD], ...) are left out."""
    words: list[list[int]] = []
    for position, token in enumerate(input_ids):
        if token in special_ids:
            continue
        if words and continues[token] and words[-1][-1] == position - 1:
            words[-1].append(position)
        else:
            words.append([position])
    return words


def mask_words(
    input_ids: Sequence[int],
    words: list[list[int]],
    rng: random.Random,
    mask_id: int,
    vocab_size: int,
    rate: float = 0.15,
    max_predictions: int = 20,
) -> tuple[list[int], list[int]]:
    """``(masked ids, labels)``: labels hold the original id at predicted positions, ``IGNORE`` elsewhere.

    ``max(1, round(rate * words))`` words are picked at random (fewer if that would pass
    ``max_predictions`` pieces; a word longer than the room left is skipped). Each picked piece
    becomes ``mask_id`` with probability 0.8, a random vocabulary id with 0.1, and stays itself
    with 0.1: the 80/10/10 draw is per piece, as BERT's whole-word masking does it.
    """
    masked, labels = list(input_ids), [IGNORE] * len(input_ids)
    if not words:
        return masked, labels
    wanted = max(1, int(round(rate * len(words))))
    chosen = 0
    predicted = 0
    for index in rng.sample(range(len(words)), len(words)):
        if chosen >= wanted or predicted >= max_predictions:
            break
        word = words[index]
        if predicted + len(word) > max_predictions:
            continue
        chosen += 1
        predicted += len(word)
        for position in word:
            labels[position] = masked[position]
            draw = rng.random()
            if draw < 0.8:
                masked[position] = mask_id
            elif draw < 0.9:
                masked[position] = rng.randrange(vocab_size)
    return masked, labels
