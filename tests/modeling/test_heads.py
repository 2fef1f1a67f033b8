"""Cell head pooling and the MML loss (paper §4.1)."""

import torch

from mate_cli.modeling.heads import CellSelectionHead, first_candidate_loss, mml_loss, pool_cells
from mate_cli.layout import TableLayout


def test_pool_cells_is_mean_of_each_cells_tokens():
    token_logits = torch.tensor([[9.0, 1.0, 3.0, 5.0, 7.0, 100.0]])
    cell_ids = torch.tensor([[0, 1, 1, 2, 2, 0]])
    out = pool_cells(token_logits, cell_ids, num_cells=3)
    assert out[0, 1].item() == 2.0 and out[0, 2].item() == 6.0
    assert out[0, 0] == torch.finfo(out.dtype).min and out[0, 3] == torch.finfo(out.dtype).min


def test_head_ignores_padding_tokens():
    torch.manual_seed(0)
    head = CellSelectionHead(8)
    hidden = torch.randn(1, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    cells = torch.tensor([[0, 1, 1, 2, 2]])  # padding token carries cell id 2 by mistake
    layout = TableLayout(
        attention_mask=mask, segment_ids=(cells > 0).long(), row_ids=cells, column_ids=cells, cell_ids=cells
    )
    logits = head(hidden, layout, 2)
    expected = head.token_scorer(hidden[0, 3]).squeeze()
    torch.testing.assert_close(logits[0, 2], expected)


def test_mml_equals_cross_entropy_with_one_candidate():
    torch.manual_seed(1)
    logits = torch.randn(3, 6, requires_grad=True)
    cell_mask = torch.ones(3, 6, dtype=torch.bool)
    cell_mask[:, 0] = False
    cell_mask[2, 5] = False
    target = torch.tensor([2, 4, 1])
    cand = torch.zeros(3, 6, dtype=torch.bool)
    cand[torch.arange(3), target] = True
    loss = mml_loss(logits, cell_mask, cand)
    ref = torch.nn.functional.cross_entropy(logits.masked_fill(~cell_mask, float("-inf")), target)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(first_candidate_loss(logits, cell_mask, cand), ref)


def test_mml_gradient_flows_only_through_p():
    """grad L = -sum_z q(z) grad log p(z) with q detached: check against that formula."""
    torch.manual_seed(2)
    logits = torch.randn(1, 7, requires_grad=True)
    cell_mask = torch.ones(1, 7, dtype=torch.bool)
    cell_mask[0, 0] = False
    cand = torch.zeros(1, 7, dtype=torch.bool)
    cand[0, [2, 3, 6]] = True
    mml_loss(logits, cell_mask, cand).backward()

    z = logits.detach().clone().requires_grad_(True)
    log_p = torch.log_softmax(z.masked_fill(~cell_mask, float("-inf")), -1)
    q = torch.softmax(log_p.detach().masked_fill(~cand, float("-inf")), -1)
    (-(q[cand] * log_p[cand]).sum()).backward()
    torch.testing.assert_close(logits.grad, z.grad)
    # With q a constant the gradient is p - q on valid cells; a non-detached q would differ.
    p = log_p.detach().exp()
    torch.testing.assert_close(logits.grad[0, 1:], (p - q)[0, 1:])


def test_mml_skips_examples_without_candidates():
    logits = torch.randn(2, 4, requires_grad=True)
    cell_mask = torch.ones(2, 4, dtype=torch.bool)
    cand = torch.zeros(2, 4, dtype=torch.bool)
    cand[0, 2] = True
    loss = mml_loss(logits, cell_mask, cand)
    loss.backward()
    assert torch.all(logits.grad[1] == 0)
    none = mml_loss(logits, cell_mask, torch.zeros_like(cand))
    assert none.item() == 0.0 and none.requires_grad
