"""Layouts on which every implementation of bucketed MATE is checked against the others:
``(make_layout, G, R)``, covering each way the bucketed structure can be exercised."""

from __future__ import annotations

from mate_cli.modeling.synthetic import filled_layout
from tests.modeling.random_layouts import random_layout


def with_hole(layout):
    """Padding inside the first example (tokens 3..5 masked): its real tokens are not a
    prefix, so the kernel gathers the dense rows' keys instead of reading them in order."""
    mask = layout.attention_mask.clone()
    mask[0, 3:6] = 0
    return layout.with_fields(attention_mask=mask)


CASES = [
    # (layout, G, R): Q inside the globals, rows/columns within R ...
    (
        lambda: random_layout(3, query_len=(2, 8), rows=(1, 3), cols=(1, 3), cell_tokens=(1, 3), pad=(0, 5), seed=1),
        16,
        16,
    ),
    # ... G smaller than |Q| (query tokens beyond G, table tokens never global) and segments longer than R
    (
        lambda: random_layout(2, query_len=(6, 12), rows=(3, 6), cols=(2, 4), cell_tokens=(1, 4), pad=(0, 7), seed=5),
        4,
        3,
    ),
    # ... G well past Q: the first row/column is global, some buckets read table globals
    (
        lambda: random_layout(2, query_len=(1, 3), rows=(2, 5), cols=(2, 3), cell_tokens=(1, 3), pad=(0, 3), seed=9),
        24,
        5,
    ),
    # more query-set rows than a kernel chunk has rows (8 buckets x R = 16): a chunk of
    # only dense rows, and the dense part's buffers outgrow the chunk's
    (
        lambda: random_layout(2, query_len=(17, 20), rows=(2, 4), cols=(2, 3), cell_tokens=(1, 3), pad=(0, 3), seed=2),
        24,
        2,
    ),
    # padding inside an example
    (
        lambda: with_hole(
            random_layout(2, query_len=(2, 4), rows=(2, 4), cols=(2, 3), cell_tokens=(1, 3), pad=(0, 3), seed=6)
        ),
        8,
        4,
    ),
    # a realistic long table, the paper's G and R
    (lambda: filled_layout(2048, query_tokens=60, columns=8, cell_tokens=15), 116, 42),
]
