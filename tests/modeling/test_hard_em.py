"""Hard EM for WikiTQ's aggregation (``model.head.aggregation_supervision=hard_em``).

:func:`consistent_selection` on a hand-built table: 2 question tokens, a header, and four
data rows in two columns, one token per cell. Column 1 holds text, column 2 the numbers
10, 20, 30, 40. The model's cell logits, column logits and operator probabilities are set
by hand, so each case knows which selection a decode would make and which one is the most
probable that gives the answer.
"""

from __future__ import annotations

import math

import pytest
import torch

from mate_cli.layout import TableLayout
from mate_cli.modeling.tapas_heads import LOG_ZERO, CellIndex, TapasHeadConfig, TapasQAHead, consistent_selection

ROWS, COLUMNS = 8, 4
NUMBERS = [10.0, 20.0, 30.0, 40.0]


def table() -> tuple[TableLayout, torch.Tensor]:
    """The layout and the per-token numbers (NaN: none)."""
    rows = [0, 0] + [0, 0] + [r for r in range(1, 5) for _ in range(2)]
    columns = [0, 0] + [1, 2] + [1, 2] * 4
    layout = TableLayout.from_lists([{"segment_ids": [0, 0] + [1] * 10, "row_ids": rows, "column_ids": columns}])
    values = torch.tensor([[math.nan] * 4 + [v for n in NUMBERS for v in (math.nan, n)]])
    return layout, values


def logits_for(text: list[float], numbers: list[float]) -> torch.Tensor:
    """Token logits: the question and header at -5, then per row (text cell, number cell)."""
    return torch.tensor([[-5.0] * 4 + [x for pair in zip(text, numbers) for x in pair]])


def columns_for(text: float, numbers: float) -> torch.Tensor:
    return torch.tensor([[LOG_ZERO, text, numbers, LOG_ZERO]])


def operators(sum_: float = 0.0, average: float = 0.0, count: float = 0.0) -> torch.Tensor:
    return torch.log_softmax(torch.tensor([[0.0, sum_, average, count]]), dim=-1)


def select(answer: float, token_logits, column_logits, operator_log_probs):
    layout, values = table()
    index = CellIndex(layout, ROWS, COLUMNS)
    found, operator, column, cells, candidates, _ = consistent_selection(
        token_logits, column_logits, index, values, torch.tensor([answer]), operator_log_probs
    )
    picked = sorted(int(c) // COLUMNS for c in cells[0].nonzero().flatten())  # the rows of the chosen cells
    if found:  # the cells and the candidates are the chosen column's
        assert all(int(c) % COLUMNS == int(column) for c in cells[0].nonzero().flatten())
        assert sorted(int(c) for c in candidates[0].nonzero().flatten()) == [
            r * COLUMNS + int(column) for r in range(1, 5)
        ]
    return bool(found), int(operator), int(column), picked


def test_count_takes_the_models_own_top_cells():
    """COUNT 2 in the text column (where the model's column is): its two highest cells, not any two."""
    found, operator, column, rows = select(
        2.0, logits_for([5.0, -1.0, 3.0, -2.0], [-3.0] * 4), columns_for(2.0, -2.0), operators(count=1.0)
    )
    assert (found, operator, column, rows) == (True, 2, 1, [1, 3])


def test_a_sum_over_the_models_order():
    """SUM 50 = 40 + 10, the model's two highest numbers; AVERAGE of them is 25, COUNT 2."""
    found, operator, column, rows = select(
        50.0, logits_for([-3.0] * 4, [4.0, -2.0, -1.0, 6.0]), columns_for(-2.0, 2.0), operators(sum_=1.0)
    )
    assert (found, operator, column, rows) == (True, 0, 2, [1, 4])


def test_a_single_cell_holding_the_answer_wherever_the_model_ranks_it():
    """30 is no sum or average of a prefix of the model's order (40, 10, 20, 30) but one
    cell holds it: its SUM and AVERAGE both give it; the operator the model prefers wins."""
    for preferred, expected in (({"average": 2.0}, 1), ({"sum_": 2.0}, 0)):
        found, operator, column, rows = select(
            30.0, logits_for([-3.0] * 4, [2.0, 1.0, -4.0, 3.0]), columns_for(-2.0, 2.0), operators(**preferred)
        )
        assert (found, operator, column, rows) == (True, expected, 2, [3])


def test_the_most_probable_column_wins_when_both_give_the_answer():
    """COUNT 1 can be any single cell of either column: the column the model prefers, its top cell."""
    token_logits = logits_for([-1.0, 2.0, -3.0, -4.0], [-2.0, -3.0, 1.0, -4.0])
    for column_logits, expected in ((columns_for(3.0, -3.0), (1, [2])), (columns_for(-3.0, 3.0), (2, [3]))):
        found, operator, column, rows = select(1.0, token_logits, column_logits, operators(count=3.0))
        assert (found, operator) == (True, 2) and (column, rows) == expected


@pytest.mark.parametrize("answer", [7.0, 5.0, math.nan])
def test_no_consistent_selection(answer):
    """7 and 5 are no count (4 rows), no single number, no sum or average of a prefix; NaN is no scalar answer."""
    found, *_ = select(
        answer, logits_for([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]), columns_for(0.0, 0.0), operators()
    )
    assert not found


def wtq_config(supervision: str, answer_loss_cutoff: float) -> TapasHeadConfig:
    """TAPAS's WikiTQ head settings on the table above, with the answer supervision to test."""
    return TapasHeadConfig(
        num_aggregation_labels=4,
        use_answer_as_supervision=True,
        cell_selection_preference=0.2,
        huber_loss_delta=0.121194,
        temperature=0.0352513,
        answer_loss_cutoff=answer_loss_cutoff,
        max_num_rows=ROWS,
        max_num_columns=COLUMNS,
        aggregation_supervision=supervision,
    )


def head_loss(supervision: str, answer: float, seed: int = 0) -> torch.Tensor:
    """The WikiTQ head's per-example loss on the table above for a random encoder state."""
    config = wtq_config(supervision, answer_loss_cutoff=1e9)
    torch.manual_seed(seed)
    head = TapasQAHead(16, config).eval()
    layout, values = table()
    hidden, pooled = torch.randn(1, 12, 16), torch.randn(1, 16)
    labels = torch.zeros(1, 12, dtype=torch.long)
    return head(hidden, pooled, layout, labels, torch.tensor([answer]), values, torch.ones(1, 12)).loss


def test_hard_em_keeps_tapas_loss_where_no_selection_gives_the_answer():
    assert torch.equal(head_loss("hard_em", 7.0), head_loss("expected", 7.0))
    assert not torch.allclose(head_loss("hard_em", 30.0), head_loss("expected", 30.0))


def test_hard_em_trains_the_decode_onto_the_answer():
    """A few steps on the hard EM loss alone move the head's decode (arg-max column, cells above
    0.5, arg-max operator) to a selection whose result is the answer, 30: one cell of the numbers."""
    config = wtq_config("hard_em", answer_loss_cutoff=0.664694)
    torch.manual_seed(0)
    head = TapasQAHead(16, config, dropout=0.0)
    layout, values = table()
    hidden, pooled = torch.randn(1, 12, 16), torch.randn(1, 16)
    labels = torch.zeros(1, 12, dtype=torch.long)
    optimiser = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(30):
        optimiser.zero_grad()
        head(hidden, pooled, layout, labels, torch.tensor([30.0]), values, torch.ones(1, 12)).loss.sum().backward()
        optimiser.step()
    out = head.eval()(hidden, pooled, layout)
    selected = (torch.sigmoid(out.logits[0]) > 0.5) & (layout.row_ids[0] > 0)  # one token per cell
    numbers = [v for v in values[0][selected].tolist() if not math.isnan(v)]
    operator = int(out.aggregation_logits.argmax())
    result = {1: sum(numbers), 2: sum(numbers) / max(len(numbers), 1), 3: int(selected.sum())}.get(operator)
    assert result == 30.0, (operator, numbers, int(selected.sum()))
