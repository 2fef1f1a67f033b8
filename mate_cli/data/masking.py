"""Whole-word masking for masked-LM pre-training (BERT's; TAPAS pre-trains tables this way, MATE App. A.1).

Text and table tokens are masked alike; the layout is untouched. All randomness comes from the ``rng`` passed in.
"""

from __future__ import annotations

import random
from typing import Sequence

#: label of positions that are not predicted (PyTorch's cross-entropy ignore_index)
IGNORE = -100


def continuation_table(tokenizer) -> list[bool]:
    vocab = tokenizer.get_vocab()
    table = [False] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        table[index] = token.startswith("##")
    return table


def word_spans(input_ids: Sequence[int], continues: Sequence[bool], special_ids: set[int]) -> list[list[int]]:
    """Positions grouped by word, in order, special tokens left out."""
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
    """``(masked ids, labels)``, labels ``IGNORE`` where nothing is predicted. ``max(1, round(rate * words))`` random
    words, fewer if they would pass ``max_predictions`` pieces; the 80/10/10 draw (mask / random id / kept) is per
    piece, as in BERT's whole-word masking."""
    masked, labels = list(input_ids), [IGNORE] * len(input_ids)
    if not words:
        return masked, labels
    wanted = max(1, int(round(rate * len(words))))
    chosen = predicted = 0
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
