"""TAPAS's heads: a saved ``TapasForQuestionAnswering`` / ``TapasForSequenceClassification``
loads into our modules and gives the same logits AND the same loss on the same labels.

The references are ``transformers`` models with small random configs (every head tensor
randomised, so nothing is zero by luck), saved with ``save_pretrained`` and loaded through
the path users take (``TableEncoder.from_pretrained`` + the task module's ``pretrained``).
The inputs are TAPAS-style token types (tests/modeling/test_encoder_parity.py), with
labels on whole cells inside one column, and per-cell numbers for the regression loss.
"""

from __future__ import annotations

import functools
import logging
import math

import pytest
import torch

from mate_cli.lit_modules.entailment import EntailmentModule
from mate_cli.lit_modules.table_qa import TableQAModule, aggregate_answer, top_cell_hits
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from mate_cli.modeling.tapas_heads import TapasHeadConfig, token_numeric_values
from tests.modeling.table_batches import VOCAB, table_batch

transformers = pytest.importorskip("transformers")
log = logging.getLogger(__name__)
TOLERANCE = 1e-5

WTQ = dict(
    num_aggregation_labels=4,
    use_answer_as_supervision=True,
    answer_loss_cutoff=0.664694,
    cell_selection_preference=0.207951,
    huber_loss_delta=0.121194,
    temperature=0.0352513,
    select_one_column=True,
    allow_empty_column_selection=False,
    aggregation_loss_weight=1.0,
)
SQA = dict(num_aggregation_labels=0, select_one_column=True, allow_empty_column_selection=False, temperature=1.0)


def tiny_config(**head) -> "transformers.TapasConfig":
    return transformers.TapasConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        max_num_rows=8,
        max_num_columns=6,
        **head,
    )


def randomise(model) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("tapas."):
                param.copy_(torch.randn_like(param) * 0.5)


def cell_labels(layout: TableLayout, seed: int, answered: list[bool]) -> torch.Tensor:
    """1 on every token of 1-2 random data cells of one column per answered example."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.zeros_like(layout.row_ids)
    for i, has in enumerate(answered):
        table = layout.attention_mask[i] & (layout.row_ids[i] > 0)
        if not has or not bool(table.any()):
            continue
        columns = layout.column_ids[i][table].unique()
        column = columns[torch.randint(len(columns), (1,), generator=generator)]
        rows = layout.row_ids[i][table & (layout.column_ids[i] == column)].unique()
        chosen = rows[torch.randperm(len(rows), generator=generator)[:2]]
        labels[i] = (table & (layout.column_ids[i] == column) & torch.isin(layout.row_ids[i], chosen)).long()
    return labels


def cell_ids_of(layout: TableLayout) -> torch.Tensor:
    """Our cell ids (1.. per data (row, column), 0 elsewhere), as the tokenizer writes them."""
    ids = torch.zeros_like(layout.row_ids)
    for i in range(layout.batch_size):
        table = layout.attention_mask[i] & (layout.row_ids[i] > 0)
        keys = layout.row_ids[i] * 1000 + layout.column_ids[i]
        unique = keys[table].unique()
        ids[i][table] = torch.searchsorted(unique, keys[table]) + 1
    return ids


def numbers(layout: TableLayout, cell_ids: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-cell numbers (a third of the cells without one) -> per-token (values, scale)."""
    generator = torch.Generator().manual_seed(seed)
    cells = int(cell_ids.max()) + 1
    values = torch.rand(layout.batch_size, cells, generator=generator) * 3
    values[torch.rand(values.shape, generator=generator) < 0.33] = math.nan
    return token_numeric_values(values, cell_ids)


def load_pair(tmp_path, reference_class, module_factory, **head):
    torch.manual_seed(0)
    reference = reference_class(tiny_config(**head))
    randomise(reference)
    reference.eval().save_pretrained(tmp_path)
    encoder = TableEncoder.from_pretrained(tmp_path, "dense")
    module = module_factory(
        encoder=encoder, optimizer=functools.partial(torch.optim.AdamW), pretrained=str(tmp_path)
    ).eval()
    return reference, module


def run_ours(module, input_ids, layout, labels, float_answer, values, scale):
    with torch.no_grad():
        hidden = module.encoder(input_ids, layout)
        return module.head(hidden, module.encoder.pooler(hidden), layout, labels, float_answer, values, scale)


def run_reference(reference, input_ids, layout, labels, float_answer, values, scale):
    with torch.no_grad():
        return reference(
            input_ids=input_ids,
            attention_mask=layout.attention_mask.long(),
            token_type_ids=layout.token_type_ids,
            labels=labels,
            float_answer=float_answer,
            numeric_values=values,
            numeric_values_scale=scale,
        )


def scaled_diff(ours: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |ours - expected| relative to the value's size (absolute below 1): WikiTQ's
    temperature (0.035) puts cell logits in the hundreds, where one float32 rounding step
    is 1.5e-5, and CPUs of other vector widths round the same sums differently."""
    return ((ours - expected).abs() / expected.abs().clamp(min=1.0)).max().item()


def compare(record_property, name, ours, expected, mask):
    log.info("%s: loss %.4f", name, float(expected.loss))
    diffs = {
        "logits": scaled_diff(ours.logits[mask], expected.logits[mask]),
        "loss": scaled_diff(ours.loss.mean(), expected.loss),
    }
    if expected.logits_aggregation is not None:
        diffs["aggregation"] = scaled_diff(ours.aggregation_logits, expected.logits_aggregation)
    for key, value in diffs.items():
        log.info("max scaled |diff| %s %s = %.3e", name, key, value)
        record_property(f"max_abs_diff[{name}.{key}]", f"{value:.3e}")
    assert float(expected.loss) > 0.01
    assert all(v <= TOLERANCE for v in diffs.values()), diffs


# ------------------------------------------------------------------ WikiTQ: selection + aggregation
WTQ_CASES = {
    # TAPAS's WTQ settings: scalar answers aggregate (Huber loss, cutoff), text answers select
    "wtq": ({}, 4, [True, True, False, False, True, False], [math.nan, 2.0, 3.5, 0.4, 1.0, 1.5]),
    # a preference of 1.0 turns every scalar answer with an answer cell into cell selection
    "wtq_preference": (
        {"cell_selection_preference": 1.0, "answer_loss_cutoff": None},
        7,
        [True, True, False, True],
        [1.0, 2.0, 3.0, math.nan],
    ),
}


@pytest.mark.parametrize("case", sorted(WTQ_CASES))
def test_wtq_head_matches_tapas_for_question_answering(case, tmp_path, record_property):
    changes, seed, answered, answers = WTQ_CASES[case]
    reference, module = load_pair(
        tmp_path,
        transformers.TapasForQuestionAnswering,
        functools.partial(TableQAModule, task="wtq"),
        **{**WTQ, **changes},
    )
    assert module.head_config.temperature == pytest.approx(WTQ["temperature"])  # from the checkpoint's config
    input_ids, layout = table_batch(seed=seed, lengths=[40] * len(answered))  # unpadded (see the module docstring)
    labels = cell_labels(layout, seed=seed + 1, answered=answered)
    float_answer = torch.tensor(answers)
    values, scale = numbers(layout, cell_ids_of(layout), seed=seed + 2)
    expected = run_reference(reference, input_ids, layout, labels, float_answer, values, scale)
    ours = run_ours(module, input_ids, layout, labels, float_answer, values, scale)
    compare(record_property, case, ours, expected, layout.attention_mask)


# ------------------------------------------------------------------ SQA: selection only, padded batch
def test_sqa_head_matches_tapas_for_question_answering(tmp_path, record_property):
    reference, module = load_pair(
        tmp_path, transformers.TapasForQuestionAnswering, functools.partial(TableQAModule, task="sqa"), **SQA
    )
    assert not hasattr(module.head, "aggregation_classifier")
    input_ids, layout = table_batch(seed=10, lengths=[44, 30, 21, 38])  # padded; every example has an answer
    labels = cell_labels(layout, seed=11, answered=[True] * 4)
    expected = run_reference(reference, input_ids, layout, labels, None, None, None)
    ours = run_ours(module, input_ids, layout, labels, None, None, None)
    # TAPAS averages padding into the query cell (0, 0); its tokens' (masked, ~-1e4) logits differ
    table_tokens = layout.attention_mask & (layout.column_ids > 0)
    compare(record_property, "sqa", ours, expected, table_tokens)
    with torch.no_grad():  # without labels: the logits TAPAS predicts from
        hidden = module.encoder(input_ids, layout)
        plain = module.head(hidden, module.encoder.pooler(hidden), layout)
        reference_plain = reference(
            input_ids=input_ids, attention_mask=layout.attention_mask.long(), token_type_ids=layout.token_type_ids
        )
    mask = table_tokens
    assert (plain.logits - reference_plain.logits).abs()[mask].max().item() <= TOLERANCE


# ------------------------------------------------------------------ TabFact: classification
def test_entailment_head_matches_tapas_for_sequence_classification(tmp_path, record_property):
    reference, module = load_pair(tmp_path, transformers.TapasForSequenceClassification, EntailmentModule)
    input_ids, layout = table_batch(seed=12, lengths=[40, 33, 25])
    gold = torch.tensor([1, 0, 1])
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids,
            attention_mask=layout.attention_mask.long(),
            token_type_ids=layout.token_type_ids,
            labels=gold,
        )
        hidden = module.encoder(input_ids, layout)
        logits = module.head(module.encoder.pooler(hidden))
        loss = torch.nn.functional.cross_entropy(logits, gold)
    diff = (logits - expected.logits).abs().max().item()
    loss_diff = abs(float(loss) - float(expected.loss))
    record_property("max_abs_diff[tabfact.logits]", f"{diff:.3e}")
    record_property("max_abs_diff[tabfact.loss]", f"{loss_diff:.3e}")
    assert diff <= TOLERANCE and loss_diff <= TOLERANCE


# ------------------------------------------------------------------ pieces
def test_head_settings_yaml_over_checkpoint_over_defaults():
    config = TapasHeadConfig.from_checkpoint(
        {"temperature": 2.0, "huber_loss_delta": None}, {"temperature": 0.5, "huber_loss_delta": 0.1, "max_num_rows": 9}
    )
    assert (config.temperature, config.huber_loss_delta, config.max_num_rows) == (2.0, 0.1, 9)
    assert config.max_num_columns == 32  # TAPAS's default


def test_token_numeric_values_scale_is_the_cell_token_count():
    cell_ids = torch.tensor([[0, 1, 1, 2, 0]])
    values, scale = token_numeric_values(torch.tensor([[math.nan, 4.0, math.nan]]), cell_ids)
    assert scale.tolist() == [[1.0, 2.0, 2.0, 1.0, 1.0]]
    assert values[0, 1:3].tolist() == [4.0, 4.0] and math.isnan(values[0, 3]) and math.isnan(values[0, 0])


@pytest.mark.parametrize(
    "operator, expected", [("NONE", ["a", "b"]), ("COUNT", ["2"]), ("SUM", ["5"]), ("AVERAGE", ["2.5"])]
)
def test_aggregate_answer(operator, expected):
    assert aggregate_answer(operator, ["a", "b"], [2.0, 3.0]) == expected


def test_cell_top1_scores_the_most_probable_cell_of_the_questions_with_an_answer_cell():
    none = torch.finfo(torch.float32).min  # cell_probs: column 0 and cells without a token
    probs = torch.tensor(
        [
            [none, 0.2, 0.3, 0.1],  # the top cell (2) is the answer, though below the 0.5 threshold
            [none, 0.4, 0.1, none],  # the top cell (1) is not; the answer (3) lost its tokens to the cut
            [none, 0.9, 0.1, 0.1],  # no answer cell (a scalar answer): not counted
        ]
    )
    answer = torch.tensor([[False, False, True, False], [False, False, False, True], [False] * 4])
    assert top_cell_hits(probs, answer).tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "settings, fix",
    [
        ({"num_aggregation_labels": 3}, "use 0"),
        ({"num_aggregation_labels": 4, "use_answer_as_supervision": False}, "use_answer_as_supervision=true"),
        ({**WTQ, "cell_selection_preference": None}, "cell_selection_preference"),
        ({**WTQ, "huber_loss_delta": None}, "huber_loss_delta"),
        ({"average_approximation_function": "median"}, "ratio"),
        ({"aggregation_supervision": "mml"}, "expected, hard_em"),
    ],
)
def test_head_settings_that_cannot_train_are_one_line_errors(settings, fix):
    from mate_cli.errors import MateError

    with pytest.raises(MateError, match=fix):
        TapasHeadConfig.from_checkpoint(settings, None)


# ------------------------------------------------------------------ Gumbel options
def test_relaxed_bernoulli_draws_are_near_0_or_1_with_the_raw_logits_odds():
    """TAPAS's use_gumbel_for_cells at its WikiTQ temperature: draws are nearly hard, and a
    cell is on with probability sigmoid(raw logit), where raw = temperature x the head's logit."""
    from mate_cli.modeling.tapas_heads import relaxed_bernoulli

    temperature = 0.0352513
    raw = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    torch.manual_seed(0)
    draws = relaxed_bernoulli((raw / temperature).expand(20000, 4), temperature)
    assert ((draws < 0.01) | (draws > 0.99)).float().mean() > 0.9
    assert torch.allclose((draws > 0.5).float().mean(0), torch.sigmoid(raw), atol=0.02)


def test_gumbel_options_change_the_training_loss_only():
    """With the options on, the head's loss in training mode comes from draws (two calls
    differ); in evaluation mode it is the plain expected result, the same as with them off."""
    from mate_cli.modeling.tapas_heads import TapasQAHead

    settings = dict(
        num_aggregation_labels=4,
        use_answer_as_supervision=True,
        cell_selection_preference=0.207951,
        huber_loss_delta=0.121194,
        temperature=0.0352513,
        answer_loss_cutoff=1e9,
    )
    plain = TapasQAHead(16, TapasHeadConfig(**settings))
    drawn = TapasQAHead(16, TapasHeadConfig(**settings, use_gumbel_for_cells=True, use_gumbel_for_aggregation=True))
    drawn.load_state_dict(plain.state_dict())
    layout = TableLayout.from_lists([{"segment_ids": [0] * 3 + [1] * 6, "row_ids": [0] * 3 + [1, 1, 2, 2, 3, 3],
                                      "column_ids": [0] * 3 + [1, 2] * 3}])  # fmt: skip
    torch.manual_seed(1)
    hidden, pooled = torch.randn(1, 9, 16), torch.randn(1, 16)
    labels = torch.zeros(1, 9, dtype=torch.long)
    values = torch.tensor([[math.nan] * 3 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    scale = torch.ones(1, 9)
    args = (hidden, pooled, layout, labels, torch.tensor([7.0]), values, scale)
    for head in (plain, drawn):
        head.eval()
    assert torch.equal(plain(*args).loss, drawn(*args).loss)
    drawn.train()
    drawn.dropout.p = 0.0
    first, second = drawn(*args).loss, drawn(*args).loss
    assert not torch.equal(first, second)


@pytest.mark.parametrize("select_one_column", [True, False])
@pytest.mark.parametrize("average_logits_per_cell", [False, True])
def test_the_logits_a_prediction_decodes_are_the_loss_calls(select_one_column, average_logits_per_cell):
    """`mate predict` (no labels) and `mate eval` (the loss call) decode the same logits, whatever the head options."""
    from mate_cli.modeling.tapas_heads import TapasQAHead

    config = TapasHeadConfig(
        **{**SQA, "select_one_column": select_one_column}, average_logits_per_cell=average_logits_per_cell
    )
    head = TapasQAHead(16, config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        head.output_weights.normal_()
        head.column_output_weights.normal_()
    layout = TableLayout.from_lists([{"segment_ids": [0] * 3 + [1] * 8, "row_ids": [0] * 3 + [1, 1, 1, 2, 2, 3, 3, 3],
                                      "column_ids": [0] * 3 + [1, 1, 2, 1, 2, 1, 2, 2]}])  # fmt: skip
    hidden, pooled = torch.randn(1, 11, 16), torch.randn(1, 16)
    labels = torch.zeros(1, 11, dtype=torch.long)
    labels[0, 3:6] = 1
    torch.testing.assert_close(head(hidden, pooled, layout).logits, head(hidden, pooled, layout, labels).logits)


def test_a_head_config_changed_after_its_check_is_still_refused_at_the_loss():
    """TapasHeadConfig refuses aggregation labels without answer supervision when built; one changed
    afterwards (a mutable dataclass) is refused by the loss instead of training weakly supervised."""
    from mate_cli.errors import MateError
    from mate_cli.modeling.tapas_heads import TapasQAHead

    head = TapasQAHead(16, TapasHeadConfig(**WTQ))
    head.config.use_answer_as_supervision = False
    layout = TableLayout.from_lists([{"segment_ids": [0, 1, 1], "row_ids": [0, 1, 1], "column_ids": [0, 1, 2]}])
    labels = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(MateError, match="use_answer_as_supervision=true"):
        head(
            torch.randn(1, 3, 16),
            torch.randn(1, 16),
            layout,
            labels,
            torch.tensor([1.0]),
            torch.ones(1, 3),
            torch.ones(1, 3),
        )


@pytest.mark.parametrize("operators_logit, cutoff", [(-4.0, WTQ["answer_loss_cutoff"]), (4.0, None)])
def test_the_loss_call_says_how_each_example_was_supervised(operators_logit, cutoff):
    """``aggregate``: a one-number answer found in a cell trains as cell selection while the operators hold at most
    ``cell_selection_preference``, as an aggregation above it; one found in no cell always aggregates; a text answer
    never does. ``answer_kept``: 0 where ``answer_loss_cutoff`` zeroed an aggregating example's loss."""
    from mate_cli.modeling.tapas_heads import TapasQAHead

    head = TapasQAHead(16, TapasHeadConfig(**{**WTQ, "answer_loss_cutoff": cutoff})).eval()
    with torch.no_grad():
        head.aggregation_classifier.weight.zero_()
        head.aggregation_classifier.bias.copy_(torch.tensor([0.0, operators_logit, operators_logit, operators_logit]))
    layout = TableLayout.from_lists(
        [
            {
                "segment_ids": [0] * 3 + [1] * 6,
                "row_ids": [0] * 3 + [1, 1, 2, 2, 3, 3],
                "column_ids": [0] * 3 + [1, 2] * 3,
            }
        ]
        * 3
    )
    labels = torch.zeros(3, 9, dtype=torch.long)
    labels[0, 3] = 1  # example 0's answer, 2.0, is in a cell; example 1's, 70.0, in none; example 2's is a text
    values = torch.tensor([[math.nan] * 3 + [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]] * 3)
    torch.manual_seed(0)
    out = head(torch.randn(3, 9, 16), torch.randn(3, 16), layout, labels,
               torch.tensor([2.0, 70.0, math.nan]), values, torch.ones(3, 9))  # fmt: skip
    assert out.aggregate.tolist() == [0.0 if operators_logit < 0 else 1.0, 1.0, 0.0]
    # 70 is far from any expected result of these cells: the cutoff zeroes that loss, and only where there is one
    assert out.answer_kept[1].item() == (0.0 if cutoff is not None else 1.0)
    assert out.answer_kept[2].item() == 1.0  # not aggregating: nothing to cut
