"""DoT (Krichene et al. 2021) against its definitions: the selection keeps the query and the
top-K tokens (or whole columns by mean score), the task model on the kept tokens equals the
task model on every token with the others at ``s_t = -inf`` (App. A.3), J-DoT trains the
pruner through the attention and P-DoT does not, runs are named in the paper's notation, and
the answer cells lost to the selection are counted (not only those lost to the length cut).

The equivalence runs the real MiniLM on real CC-1024 TabFact batches of the bundled sample,
in float64 (in float32 the two computations differ by summation order, about 1e-5).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mate_cli.errors import MateError
from mate_cli.modeling.dot import (
    DoubleTransformer,
    answer_cells_kept,
    cells_with_tokens,
    column_scores,
    gather_layout,
    keep_rank,
    paper_name,
    select,
)
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import TableLayout
from tests.inprocess import build, compose_command

TOLERANCE = 1e-5


def dot_model(tmp_path, *overrides: str):
    cfg = compose_command(
        "train",
        [
            "experiment=tabfact_dot",
            "dataset.limit_questions=12",
            "dataset.batch_size=3",
            "model.dot.top_k=96",
            *overrides,
        ],
        tmp_path,
    )
    datamodule, model, _ = build(cfg, tmp_path)
    datamodule.setup("fit")
    return model.eval(), next(iter(datamodule.train_dataloader()))


@pytest.mark.parametrize(
    "attention", ["attention=dense", "attention=mate attention.variant=exact"], ids=["dense", "mate_exact"]
)
def test_the_task_model_on_the_kept_tokens_equals_it_on_every_token_with_the_others_at_minus_inf(
    attention, tmp_path, record_property
):
    model, batch = dot_model(tmp_path, *attention.split())
    model.double()  # the identity is exact; float64 keeps float32's summation-order noise (~1e-5 at 1024) out
    layout = batch.layout
    assert int(layout.attention_mask.sum(1).max()) > 96, "the sample must be long enough to prune"
    with torch.no_grad():
        positions = model.encoder.embeddings.position_ids(layout)
        pruned = model.dot(batch.input_ids, layout, positions)
        short = model.encoder(pruned.input_ids, pruned.layout)

        kept = torch.zeros_like(layout.attention_mask).scatter(1, pruned.index, pruned.layout.attention_mask)
        bias = torch.where(kept, pruned.scores, float("-inf"))
        full = model.encoder(batch.input_ids, layout.with_fields(key_bias=bias, position_ids=positions))
        unbiased = model.encoder(pruned.input_ids, pruned.layout.with_fields(key_bias=None))
    at_kept = full.gather(1, pruned.index[..., None].expand_as(short))
    real = pruned.layout.attention_mask
    assert int(real.sum()) < int(layout.attention_mask.sum())  # some tokens were pruned
    diff = float((at_kept - short)[real].abs().max())
    record_property("max_abs_diff", f"{diff:.3e}")
    assert diff <= TOLERANCE
    # and the scores matter: the same kept tokens without them compute something else
    assert float((unbiased - short)[real].abs().max()) > 1e-3


def layout_of(columns: list[list[int]]) -> TableLayout:
    """One example per list: column id per token; 0 = query-set token (segment 0)."""
    width = max(len(c) for c in columns)
    examples = [
        {"segment_ids": [int(c > 0) for c in cols], "column_ids": cols, "row_ids": [int(c > 0) for c in cols]}
        for cols in columns
    ]
    return TableLayout.from_lists(examples, seq_len=width)


def test_token_selection_keeps_the_query_set_then_the_best_table_tokens_in_input_order():
    layout = layout_of([[0, 0, 1, 1, 2, 2, 3], [0, 1, 2]])
    scores = torch.tensor([[-9.0, -9.0, -1.0, -5.0, -0.5, -3.0, -2.0], [-9.0, -1.0, -2.0, 0, 0, 0, 0]])
    index = select(keep_rank(scores, layout, 4, "token"), 4)
    assert index[0].tolist() == [0, 1, 2, 4]  # query (despite its scores), then the two best table tokens
    assert index[1].tolist() == [0, 1, 2, 3]  # shorter than K: every real token (and one padding slot)
    assert bool(keep_rank(scores, layout, 4, "token")[1, 3] == float("-inf"))


def test_column_selection_keeps_whole_columns_by_mean_score_while_they_fit():
    layout = layout_of([[0, 1, 1, 2, 2, 2, 3]])
    scores = torch.tensor([[-9.0, -1.0, -3.0, -0.5, -0.5, -0.5, -4.0]])
    means = column_scores(scores, layout)
    assert means[0].tolist() == [-9.0, -2.0, -2.0, -0.5, -0.5, -0.5, -4.0]
    rank = keep_rank(means, layout, 6, "column")  # room 5: column 2 (3 tokens), column 1 (2), not column 3
    index = select(rank, 6)
    assert index[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert bool(rank[0, 6] == float("-inf"))
    # a column that does not fit ends the selection (HEM's rule), even if a later one would fit
    rank = keep_rank(means, layout, 3, "column")
    assert (rank[0] > float("-inf")).tolist() == [True, False, False, False, False, False, False]


def test_column_mode_fills_the_slots_left_over_with_padding_only(tmp_path):
    """A dropped column's tokens may fill slots up to K; they must be padding in every field,
    or the heads count them (WikiTQ's expected COUNT/SUM reads row and cell ids)."""
    cfg = compose_command(
        "train",
        ["experiment=wtq_dot", "dataset.limit_questions=12", "dataset.batch_size=4", "model.dot.top_k=96"],
        tmp_path,
    )
    datamodule, model, _ = build(cfg, tmp_path)
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    with torch.no_grad():
        kept, pruned = model.eval().prune(batch)
    empty = ~kept.layout.attention_mask
    assert bool(empty.any()) and bool((batch.layout.attention_mask.sum(1) > 96).any())
    for name in ("segment_ids", "row_ids", "column_ids", "cell_ids", "column_ranks", "numeric_relations"):
        assert not bool(getattr(kept.layout, name)[empty].any()), name
    assert not bool(kept.input_ids[empty].any())
    real_columns = [set(kept.layout.column_ids[b][kept.layout.is_table[b]].tolist()) for b in range(len(batch))]
    for b, columns in enumerate(real_columns):  # whole columns: every token of a kept column is kept
        full = batch.layout.is_table[b] & torch.isin(batch.layout.column_ids[b], torch.tensor(sorted(columns)))
        assert int(full.sum()) == int(kept.layout.is_table[b].sum())


def test_j_dot_trains_the_pruner_through_the_attention_and_p_dot_by_its_own_loss(tmp_path):
    for loss, through_attention in (("joint", True), ("pruning", False)):
        cfg = compose_command(
            "train",
            [
                "experiment=wtq_dot",
                "dataset.limit_questions=12",
                "dataset.batch_size=4",
                "model.dot.top_k=96",
                f"model.dot.loss={loss}",
            ],
            tmp_path / loss,
        )
        datamodule, model, _ = build(cfg, tmp_path / loss)
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader()))
        kept, pruned = model.train().prune(batch)
        assert (kept.layout.key_bias is not None) == through_attention
        model(kept, with_loss=True).loss.mean().backward()
        grad = model.dot.token_head.weight.grad
        assert (grad is not None and float(grad.abs().sum()) > 0) == through_attention
        if not through_attention:  # P-DoT: the pruner learns from the answer cells instead
            assert bool((batch.candidate_mask & batch.cell_mask)[:, 1:].any()), "the batch must have answer cells"
            model.pruning_loss(batch, pruned).backward()
            assert float(model.dot.token_head.weight.grad.abs().sum()) > 0


def test_tabfact_has_no_answer_cells_for_a_pruning_loss_and_says_so(tmp_path):
    cfg = compose_command("train", ["experiment=tabfact_dot", "model.dot.loss=both"], tmp_path)
    with pytest.raises(Exception, match="model.dot.loss=both .* use model.dot.loss=joint"):  # Hydra wraps it
        build(cfg, tmp_path)


def test_the_run_is_named_in_the_papers_notation(tmp_path):
    assert paper_name("cc", 1024, "token", "small", 256, "google/tapas-large", "joint") == "CC-1024 DoT(s-256-l)"
    assert (
        paper_name("hem", 1024, "column", "medium", 256, "google/tapas-large-finetuned-wtq", "both")
        == "HEM-1024 C-PJ-DoT(m-256-l)"
    )
    assert paper_name("none", 512, "token", "minilm", 128, "minilm", "pruning") == "512 P-DoT(minilm-128-minilm)"
    cfg = compose_command(
        "train",
        ["experiment=wtq_dot", "model.dot.pretrained=null", "model.encoder.pretrained=google/tapas-large"],
        tmp_path,
    )
    assert cfg.paper_name == "CC-1024 C-DoT(m-256-l)"
    assert "CC-1024_C-DoT_m-256-l" in cfg.run_name
    assert "CC-1024 C-DoT(m-256-l)" in cfg.logger.wandb.tags


def test_a_task_model_that_cannot_take_the_scores_is_refused_in_one_line():
    pruner = TableEncoder.from_pretrained("minilm", "dense")
    dot = DoubleTransformer(pruner, top_k=8)
    task = TableEncoder.from_pretrained("minilm", "linformer", max_length=512)
    from mate_cli.lit_modules.entailment import EntailmentModule

    with pytest.raises(MateError, match="cannot add DoT's pruning scores") as error:
        EntailmentModule(task, optimizer=torch.optim.AdamW, dot=dot)
    assert "\n" not in str(error.value)
    with pytest.raises(MateError, match="model.dot.selection"):
        DoubleTransformer(pruner, selection="rows")


def test_an_answer_cell_whose_tokens_were_all_pruned_is_lost():
    # cell ids per token (0: query/header); the selection below keeps the query, cell 1's first token and cell 3
    cells = [[0, 0, 1, 1, 2, 2, 3], [0, 0, 1, 2, 2, 3, 3]]
    layout = TableLayout.from_lists([{"segment_ids": [int(c > 0) for c in ids], "cell_ids": ids} for ids in cells])
    rank = torch.tensor([[9.0, 9.0, 1.0, -5.0, -4.0, -6.0, 0.0], [9.0, 9.0, 1.0, 2.0, 3.0, -9.0, -9.0]])
    index = select(rank, 4)
    kept = gather_layout(layout, index, torch.ones_like(index, dtype=torch.bool), torch.arange(7).expand(2, 7), None)
    assert kept.cell_ids.tolist() == [[0, 0, 1, 3], [0, 0, 2, 2]]
    assert cells_with_tokens(kept, 3).tolist() == [[False, True, False, True], [False, False, True, False]]
    answers = torch.tensor([[False, True, False, True], [False, False, True, True]])
    assert answer_cells_kept(answers, kept).tolist() == [True, False]  # example 2 lost cell 3 entirely
    assert answer_cells_kept(torch.zeros_like(answers), kept).tolist() == [True, True]  # no answer cell
    padded = kept.with_fields(attention_mask=torch.tensor([[True, True, True, False]] * 2))
    assert answer_cells_kept(answers, padded).tolist() == [False, False]  # a padding slot holds no token


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")  # the eval step without a Trainer
def test_the_model_counts_the_answer_cells_its_selection_loses(tmp_path):
    """On the WikiTQ sample's validation split the length cut keeps every answer cell, DoT's selection
    (C-DoT, K = 256 of CC-1024) does not: ``val/answer_cells_kept`` says how many questions keep them all."""
    torch.manual_seed(0)
    cfg = compose_command("train", ["experiment=wtq_dot", "dataset.batch_size=64"], tmp_path)
    datamodule, model, _ = build(cfg, tmp_path)
    datamodule.setup("fit")
    assert datamodule.stats["validation"]["answer_cells_kept"] == 1.0  # the length cut lost none
    model.eval()
    lost = asked = 0
    for batch in datamodule.val_dataloader():
        with torch.no_grad():
            model._eval_step(batch, "val")
            pruned = model.dot(batch.input_ids, batch.layout, model.encoder.embeddings.position_ids(batch.layout))
        # recount from the full input: the cell ids of the tokens the selection kept
        read = torch.where(pruned.layout.attention_mask, batch.layout.cell_ids.gather(1, pruned.index), 0)
        for i, answer in enumerate(batch.candidate_mask & batch.cell_mask):
            wanted = set(answer.nonzero().flatten().tolist())
            if wanted:
                asked += 1
                lost += not wanted <= set(read[i].tolist())
    assert asked == datamodule.stats["validation"]["questions_with_answer_cells"] and lost > 0
    assert float(model.metrics["val_answer_cells_kept"].compute()) == pytest.approx((asked - lost) / asked)


def test_a_batch_bound_for_another_device_has_its_token_type_ids_checked_before_it_moves(tmp_path):
    """The check every loop runs before moving a batch to its device (Lightning's hook, DT-Fixup's pass, prediction,
    PointR), for the encoder's and the pruner's tables: a bad id is one line naming the field, before anything
    moves. The meta device stands in for a GPU: the check reads the CPU batch either way. A checked layout is marked,
    so the embeddings' forward on a CPU does not read it again inside the step."""
    model, batch = dot_model(tmp_path)
    moved = model.batch_to_device(batch, "meta")
    assert moved.input_ids.device.type == "meta"
    bad = replace(batch, layout=batch.layout.with_fields(column_ids=batch.layout.column_ids + 256))
    with pytest.raises(MateError, match=r"^layout\.column_ids holds id \d+ but token_type_embeddings_1 has only"):
        model.batch_to_device(bad, "meta")
    with pytest.raises(MateError, match=r"^layout\.column_ids holds id"):  # on a CPU too: before the step, not in it
        model.on_before_batch_transfer(bad, 0)
    from mate_cli.modeling.embeddings import TYPE_IDS_CHECKED

    assert model.on_before_batch_transfer(batch, 0) is batch and batch.layout.is_cached(TYPE_IDS_CHECKED)


def test_mate_predict_answers_with_the_pruned_model_as_eval_does(tmp_path):
    """`mate predict` on a DoT run reads the kept tokens with the pruner's scores, as `mate eval` does; the model on
    every token selects other cells here, so a predict that skipped the pruner fails."""
    from hydra.utils import instantiate

    from mate_cli.data.table_tasks import TaskCollator, encode_task_question, table_tokenizer
    from mate_cli.pretrained import load_tokenizer
    from mate_cli.pipelines.table_task import predict_table_question, read_task_table
    from mate_cli.run.rebuild import TrainedRun
    from mate_cli.tasks import get as get_task
    from mate_cli.data.records import Question
    from tests.helpers import a_table_and_question

    cfg = compose_command("train", ["experiment=wtq_dot", "model.dot.top_k=64"], tmp_path)
    torch.manual_seed(0)
    model = instantiate(cfg.model).eval()
    tokenizer = load_tokenizer(cfg.dataset.pretrained)
    path, question = a_table_and_question("wtq")
    table = read_task_table("wtq", path)
    example = encode_task_question(
        table_tokenizer(tokenizer, cfg.dataset), get_task("wtq"), Question("question", question, table.table_id), table
    )
    batch = TaskCollator(int(tokenizer.pad_token_id or 0))([example])
    with torch.no_grad():
        model.head.output_bias.fill_(10.0)  # every cell of the chosen column selected: a selection to compare
        kept, _ = model.prune(batch)
        pruned_cells = model.decode(kept, model(kept))[0]["coordinates"]
        every_token_cells = model.decode(batch, model(batch))[0]["coordinates"]
        run = TrainedRun(cfg=cfg, model=model, ckpt_path="", tokenizer=tokenizer)
        answer = predict_table_question(run, table, question, torch.device("cpu"), None)
    assert sorted(map(tuple, pruned_cells)) != sorted(map(tuple, every_token_cells)), "pruning must matter here"
    assert [(c["row"], c["column"]) for c in answer["cells"]] == [tuple(c) for c in pruned_cells]
