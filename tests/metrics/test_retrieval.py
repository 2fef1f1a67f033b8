import torch

from mate_cli.metrics.retrieval import hits_at_k


def test_hits_at_k_counts_candidates_in_top_k_and_missing_as_miss():
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, 2.0], [0.0, 1.0, 9.0, 8.0, 7.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    cell_mask = torch.ones(3, 5, dtype=torch.bool)
    cell_mask[:, 0] = False
    cand = torch.zeros(3, 5, dtype=torch.bool)
    cand[0, 1] = True  # rank 1
    cand[1, 4] = True  # rank 3
    # example 2 has no candidate: a miss at every k
    expected = {1: 1 / 3, 3: 2 / 3, 5: 2 / 3}
    for k, value in expected.items():
        assert abs(hits_at_k(logits, cell_mask, cand, k).float().mean().item() - value) < 1e-6


def test_hits_never_picks_masked_cells():
    logits = torch.tensor([[100.0, 0.0, 1.0]])
    cell_mask = torch.tensor([[False, True, True]])
    cand = torch.tensor([[True, False, False]])  # a candidate on a masked slot never counts
    assert not hits_at_k(logits, cell_mask, cand, 3).any()
