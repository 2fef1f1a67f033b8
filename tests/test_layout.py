"""`TableLayout` on hand-made layouts (exact expected tensors), and the synthetic builder."""

from __future__ import annotations

import torch

from mate_cli.layout import ID_FIELDS, TableLayout
from mate_cli.modeling.synthetic import filled_layout, layout_from_cells
from tests.modeling.random_layouts import random_layout, shaped_layout


def two_examples() -> TableLayout:
    """Example 0: ``[CLS] q [SEP] | h1 h2 | r1c1 r1c2 | r2c1 r2c2 | pad``.

    Example 1 (scrambled, to test the sort): positions 0, 2, 6 are the query set,
    ``(row, column)`` of the table tokens 1: (2, 1), 3: (1, 2), 4: (2, 2), 5: (1, 1);
    positions 7-9 are padding.
    """
    return TableLayout.from_lists(
        [
            {
                "segment_ids": [0, 0, 0, 1, 1, 1, 1, 1, 1],
                "row_ids": [0, 0, 0, 0, 0, 1, 1, 2, 2],
                "column_ids": [0, 0, 0, 1, 2, 1, 2, 1, 2],
            },
            {
                "segment_ids": [0, 1, 0, 1, 1, 1, 0],
                "row_ids": [0, 2, 0, 1, 2, 1, 0],
                "column_ids": [0, 1, 0, 2, 2, 1, 0],
            },
        ],
        seq_len=10,
    )


ROW_PERM = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 2, 6, 3, 5, 1, 4, 7, 8, 9]]
COLUMN_PERM = [[0, 1, 2, 3, 5, 7, 4, 6, 8, 9], [0, 2, 6, 1, 5, 3, 4, 7, 8, 9]]


def test_sort_order_puts_query_first_then_groups_in_position_order_then_padding():
    layout = two_examples()
    for view, expected in (("row", ROW_PERM), ("column", COLUMN_PERM)):
        perm, inverse = layout.sort_order(view)
        assert perm.tolist() == expected, view
        x = torch.arange(100, 120).view(2, 10)
        assert torch.equal(x.gather(1, perm).gather(1, inverse), x)
        assert torch.equal(inverse.gather(1, perm), torch.arange(10).expand(2, 10))
    assert layout.sort_order("row")[0] is layout.sort_order("row")[0]  # cached
    assert torch.equal(layout.sort_order(view="column")[0], torch.tensor(COLUMN_PERM))  # by keyword too


def test_head_sort_order_stacks_row_views_for_the_first_round_ratio_heads():
    layout = two_examples()
    row, column = layout.sort_order("row"), layout.sort_order("column")
    for heads, ratio, num_row in ((5, 0.4, 2), (4, 0.5, 2), (3, 0.0, 0), (3, 1.0, 3)):
        perm, inverse = layout.head_sort_order(heads, ratio)
        assert perm.shape == inverse.shape == (2, heads, 10)
        for h in range(heads):
            expected = row if h < num_row else column
            assert torch.equal(perm[:, h], expected[0]) and torch.equal(inverse[:, h], expected[1]), (heads, ratio, h)


def test_group_ids_are_zero_for_query_id_plus_one_for_table_and_largest_for_padding():
    layout = two_examples()
    row, column = layout.group_ids("row"), layout.group_ids("column")
    mask = layout.attention_mask
    pad = int(row[0, 9])
    assert (row[~mask] == pad).all() and (column[~mask] == pad).all()
    assert pad > max(int(row[mask].max()), int(column[mask].max()))
    assert row[mask].tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3] + [0, 3, 0, 2, 3, 2, 0]
    assert column[mask].tolist() == [0, 0, 0, 2, 3, 2, 3, 2, 3] + [0, 2, 0, 3, 3, 2, 0]


def test_from_lists_pads_masks_and_zero_fills_missing_fields():
    layout = TableLayout.from_lists(
        [
            {"segment_ids": [0, 1, 1], "row_ids": [0, 1, 2], "column_ids": [0, 1, 1], "cell_ids": [0, 1, 2]},
            {"segment_ids": [0, 0], "column_ranks": [3, 4]},
        ]
    )
    assert layout.seq_len == 3
    assert layout.attention_mask.tolist() == [[True, True, True], [True, True, False]]
    assert layout.attention_mask.dtype == torch.bool
    assert layout.segment_ids.tolist() == [[0, 1, 1], [0, 0, 0]]
    assert layout.row_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert layout.cell_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert layout.column_ranks.tolist() == [[0, 0, 0], [3, 4, 0]]
    for name in ("prev_labels", "inv_column_ranks", "numeric_relations"):
        assert getattr(layout, name).tolist() == [[0, 0, 0], [0, 0, 0]], name
    assert TableLayout.from_lists([{"segment_ids": [0]}], seq_len=4).attention_mask.tolist() == [[True] + [False] * 3]


def test_allowed_is_the_mate_pattern_of_one_head_type():
    # [CLS] [SEP] | header (row 0, col 1) | r1c1 r1c2 | pad
    layout = TableLayout.from_lists(
        [{"segment_ids": [0, 0, 1, 1, 1], "row_ids": [0, 0, 0, 1, 1], "column_ids": [0, 0, 1, 1, 2]}], seq_len=6
    )
    everything = [1, 1, 1, 1, 1, 0]
    row = [everything, everything, [1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 1, 0], [1, 1, 0, 1, 1, 0], everything]
    column = [everything, everything, [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0], everything]
    assert layout.allowed("row")[0].int().tolist() == row
    assert layout.allowed("column")[0].int().tolist() == column


# ----------------------------------------------------------- synthetic builder
def test_layout_from_cells_follows_tapas_conventions_exactly():
    # query of 1 token; header (1, 2 tokens); one data row (2, 1 tokens); 2 padding
    layout = layout_from_cells([1], [[[1, 2], [2, 1]]], pad=2)
    assert layout.segment_ids.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]]
    assert layout.row_ids.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0]]
    assert layout.column_ids.tolist() == [[0, 0, 0, 1, 2, 2, 1, 1, 2, 0, 0]]
    assert layout.cell_ids.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0]]
    assert layout.attention_mask.tolist() == [[True] * 9 + [False] * 2]


def test_random_and_shaped_layouts_follow_tapas_conventions():
    for layout in (random_layout(4, seed=5), shaped_layout([(3, 2, 2), (5, 4, 3)], extra_pad=2)):
        for b in range(layout.batch_size):
            real = layout.attention_mask[b]
            n = int(real.sum())
            assert real[:n].all() and not real[n:].any()  # padding last
            seg = layout.segment_ids[b]
            assert seg[0] == 0 and (seg[:n] == 1).any()
            q_len = int((seg[:n] == 0).sum())
            assert (seg[q_len:n] == 1).all()  # [CLS] query [SEP], then the table
            assert (layout.row_ids[b, :q_len] == 0).all() and (layout.column_ids[b, :q_len] == 0).all()
            header = (layout.row_ids[b] == 0) & (seg == 1)
            assert header.any() and (layout.cell_ids[b][header] == 0).all()
            assert (layout.cell_ids[b][(layout.row_ids[b] > 0)] > 0).all()
            assert all((getattr(layout, name)[b, n:] == 0).all() for name in ID_FIELDS)


def test_shaped_layout_has_the_asked_shapes_and_filled_layout_fills_the_length():
    layout = shaped_layout([(3, 2, 2), (5, 4, 3)], extra_pad=2, seed=1)
    assert layout.is_query.sum(1).tolist() == [5, 7]
    assert layout.row_ids.amax(1).tolist() == [2, 4] and layout.column_ids.amax(1).tolist() == [2, 3]
    assert layout.seq_len == int(layout.attention_mask.sum(1).max()) + 2
    filled = filled_layout(1000, 2, query_tokens=20, columns=3, cell_tokens=10)
    assert filled.attention_mask.all() and filled.is_query.sum(1).tolist() == [20, 20]
    assert int(filled.column_ids.max()) == 3 and not torch.equal(filled.row_ids[0], filled.row_ids[1])


def test_a_batch_pads_to_its_longest_or_to_a_multiple_never_past_the_cap():
    from mate_cli.layout import batch_width

    lists = [[1] * 70, [1] * 3]
    assert batch_width(lists) == 70
    assert batch_width(lists, multiple=64) == 128
    assert batch_width(lists, multiple=64, cap=100) == 100  # dataset.max_length bounds the rounding
    assert batch_width([[1] * 128], multiple=64, cap=512) == 128


def test_the_collator_pads_a_batch_to_the_multiple_with_masked_tokens():
    from mate_cli.data.datamodule import Collator

    layout = {name: [0, 1, 1] for name in ID_FIELDS}
    example = {"input_ids": [101, 7, 102], "layout": layout, "question_id": "q", "table_id": "t",
               "cell_coords": [[0, 0]], "candidates": [1]}  # fmt: skip
    plain, rounded = Collator(0)([example]), Collator(0, multiple=8, cap=512)([example])
    assert plain.input_ids.shape == (1, 3) and rounded.input_ids.shape == (1, 8)
    assert rounded.layout.attention_mask.tolist() == [[True] * 3 + [False] * 5]
    assert torch.equal(rounded.input_ids[:, :3], plain.input_ids) and rounded.input_ids[0, 3:].eq(0).all()


def test_a_padding_multiple_below_one_is_one_line(sample_root):
    import pytest

    from mate_cli.data.datamodule import HybridQADataModule
    from mate_cli.errors import MateError

    for bad in (0, -8, True):
        with pytest.raises(MateError, match=r"^dataset\.pad_to_multiple_of=.*a whole number >= 1, or null$"):
            HybridQADataModule(root=str(sample_root), pad_to_multiple_of=bad)
