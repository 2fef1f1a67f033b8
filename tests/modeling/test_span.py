"""PointR span head (paper §4.2): valid spans, band scores = MLP([h_s; h_e]), loss, overfitting."""

import functools
import itertools

import pytest
import torch

from mate_cli.modeling.span import SpanHead, gold_band_index, span_loss, valid_span_mask


def brute_valid(context, max_len, start_ok=None, end_ok=None):
    """Set of (b, start, end) with every token in context, end - start < max_len."""
    out = set()
    batch, seq = context.shape
    for b, i in itertools.product(range(batch), range(seq)):
        for j in range(i, min(seq, i + max_len)):
            if all(context[b, i : j + 1]) and (start_ok is None or start_ok[b, i]) and (end_ok is None or end_ok[b, j]):
                out.add((b, i, j))
    return out


def as_set(mask):
    return {(b, i, i + d) for b, i, d in mask.nonzero().tolist()}


def test_valid_span_mask_is_inside_the_context_only():
    # [CLS] q q [SEP] c c c [SEP] pad | [CLS] q [SEP] c c c c c [SEP]
    context = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    mask = valid_span_mask(context, 3)
    assert mask.shape == (2, 9, 3)
    assert as_set(mask) == brute_valid(context, 3)
    assert (0, 4, 6) in as_set(mask) and (0, 5, 7) not in as_set(mask)  # would cover the [SEP]
    assert (1, 3, 6) not in as_set(mask)  # longer than 3 tokens
    assert not mask[0, :4].any() and not mask[0, 7:].any()


def test_valid_span_mask_handles_a_gap_and_word_boundaries():
    torch.manual_seed(0)
    context = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 0]], dtype=torch.bool)  # a non-context token in the middle
    start_ok = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1]], dtype=torch.bool)  # token 4 is a ## piece
    end_ok = torch.tensor([[0, 1, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    mask = valid_span_mask(context, 4, start_ok, end_ok)
    assert as_set(mask) == brute_valid(context, 4, start_ok, end_ok)
    assert (0, 0, 3) not in as_set(mask)  # crosses the gap
    for _ in range(5):
        ctx = torch.rand(3, 20) > 0.3
        s, e = torch.rand(3, 20) > 0.2, torch.rand(3, 20) > 0.2
        assert as_set(valid_span_mask(ctx, 6, s, e)) == brute_valid(ctx, 6, s, e)


def test_band_scores_equal_an_mlp_on_the_concatenated_endpoints():
    torch.manual_seed(1)
    hidden_size, width = 8, 4
    head = SpanHead(hidden_size, width, mlp_hidden=5, initializer_range=0.5)
    hidden = torch.randn(2, 7, hidden_size)
    context = torch.ones(2, 7, dtype=torch.bool)
    context[:, 0] = False
    scores, valid = head(hidden, context)
    w1 = torch.cat([head.start_proj.weight, head.end_proj.weight], dim=1)  # W1 acting on [h_s; h_e]
    for b, i, d in valid.nonzero().tolist():
        pair = torch.cat([hidden[b, i], hidden[b, i + d]])
        expected = head.out(torch.nn.functional.gelu(w1 @ pair + head.start_proj.bias))
        torch.testing.assert_close(scores[b, i, d], expected.squeeze(), rtol=1e-5, atol=1e-5)
    assert torch.all(scores[~valid] == torch.finfo(scores.dtype).min)


def test_loss_is_cross_entropy_over_valid_spans_and_skips_missing_gold():
    torch.manual_seed(2)
    scores = torch.randn(3, 6, 3, requires_grad=True)
    context = torch.tensor([[0, 1, 1, 1, 1, 0]] * 3, dtype=torch.bool)
    valid = valid_span_mask(context, 3)
    masked = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
    gold_start, gold_end = torch.tensor([2, 1, -1]), torch.tensor([3, 4, -1])  # example 1: 4 tokens > band
    loss, used = span_loss(masked, valid, gold_start, gold_end)
    assert used.tolist() == [True, False, False]
    spans = sorted(as_set(valid[:1]))
    logits = torch.stack([scores[0, i, j - i] for _, i, j in spans])
    expected = -torch.log_softmax(logits, 0)[spans.index((0, 2, 3))]
    torch.testing.assert_close(loss, expected)
    assert gold_band_index(gold_start, gold_end, 3).tolist() == [2 * 3 + 1, -1, -1]
    none, used = span_loss(masked, valid, torch.tensor([-1, -1, -1]), torch.tensor([-1, -1, -1]))
    assert none.item() == 0.0 and none.requires_grad and not used.any()


def test_decode_picks_the_best_valid_span_and_flags_empty_contexts():
    head = SpanHead(4, 3)
    scores = torch.zeros(2, 5, 3)
    scores[0, 0, 0] = 50.0  # invalid (not context), must be ignored
    scores[0, 2, 1] = 5.0
    context = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    valid = valid_span_mask(context, 3)
    start, end, prob = head.decode(scores.masked_fill(~valid, -1e9), valid)
    assert (start.tolist(), end.tolist()) == ([2, -1], [3, -1])
    assert 0.5 < prob[0].item() <= 1.0 and prob[1].item() == 0.0


@pytest.mark.filterwarnings("ignore")
def test_loss_decreases_on_a_tiny_overfit_batch_with_real_minilm(sample_root, tmp_path):
    from mate_cli.data.span import SpanDataModule
    from mate_cli.lit_modules.span import SpanModule
    from mate_cli.modeling.encoder import TableEncoder

    torch.manual_seed(0)
    dm = SpanDataModule(root=str(sample_root), max_length=48, cache_dir=str(tmp_path), batch_size=2, limit_questions=4)
    dm.setup("fit")
    batch = next(b for b in iter(dm.train_dataloader()) if bool((b.gold_start >= 0).all()))
    encoder = TableEncoder.from_pretrained("minilm", "dense", max_length=48, hidden_dropout=0.0, attention_dropout=0.0)
    module = SpanModule(encoder, optimizer=functools.partial(torch.optim.AdamW, lr=2e-4), max_span_length=10)
    optimizer = module.optimizer(module.parameters())
    losses = []
    for _ in range(10):
        scores, valid = module(batch)
        loss, used = span_loss(scores, valid, batch.gold_start, batch.gold_end)
        assert used.all()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # from ~log(#valid spans) to well below it
    assert losses[-1] < 0.3 * losses[0], losses
    assert all(b < a + 0.1 for a, b in zip(losses, losses[1:])), losses
    # and a real Trainer validates it: the loss, EM and F1 of the split, logged under val/
    import lightning as L

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=2, default_root_dir=tmp_path)  # fmt: skip
    metrics = trainer.validate(module, dataloaders=dm.val_dataloader(), verbose=False)[0]
    assert sorted(metrics) == ["val/em", "val/f1", "val/loss"], metrics
    assert 0 <= metrics["val/em"] <= metrics["val/f1"] <= 100 and metrics["val/loss"] > 0, metrics  # percent
