"""Random TAPAS-style tables as padded batches with their layouts, for checks against transformers' models
(tests/modeling/test_encoder_parity.py, test_mlm.py)."""

from __future__ import annotations

import torch

from mate_cli.layout import TableLayout
from tests.helpers import layout_from_token_type_ids

#: the vocabulary of the random tables (ids 0-4: padding and the special tokens)
VOCAB = 97


def table_example(generator: torch.Generator, length: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One TAPAS-style example: [CLS] query [SEP] header cells, data cells; then padding.

    Returns ``input_ids [seq]`` and ``token_type_ids [seq, 7]``.
    """

    def rand(high: int, size=()) -> torch.Tensor:
        return torch.randint(0, high, size, generator=generator)

    ids, types = [2], [[0] * 7]
    query = 3 + int(rand(5))
    ids += rand(VOCAB - 5, (query,)).add(5).tolist() + [3]
    types += [[0] * 7] * (query + 1)
    columns = 2 + int(rand(3))
    row = 0
    while len(ids) < length:
        for column in range(1, columns + 1):
            rank = 0 if row == 0 else int(rand(8))
            for _ in range(1 + int(rand(3))):
                ids.append(5 + int(rand(VOCAB - 5)))
                types.append([1, column, row, int(rand(2)), rank, (8 - rank) % 8, int(rand(10))])
        row += 1
    ids, types = ids[:length], types[:length]
    pad = seq_len - length
    return torch.tensor(ids + [0] * pad), torch.tensor(types + [[0] * 7] * pad)


def table_batch(seed: int, lengths: list[int], scrambled: bool = False) -> tuple[torch.Tensor, TableLayout]:
    """A padded batch and its layout. ``scrambled``: random rows/columns per token, so
    cells are not contiguous (stresses the per-cell position reset)."""
    generator = torch.Generator().manual_seed(seed)
    seq_len = max(lengths)
    pairs = [table_example(generator, n, seq_len) for n in lengths]
    input_ids = torch.stack([p[0] for p in pairs])
    token_types = torch.stack([p[1] for p in pairs])
    mask = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]
    if scrambled:
        table = token_types[..., 0] == 1
        token_types[..., 1] = torch.where(table, torch.randint(0, 4, mask.shape, generator=generator), 0)
        token_types[..., 2] = torch.where(table, torch.randint(0, 5, mask.shape, generator=generator), 0)
    return input_ids, layout_from_token_type_ids(token_types, mask)
