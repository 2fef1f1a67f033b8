"""Every registered attention backend and every MATE (variant, impl) pair as test cases, at test sizes, with the
realistic layouts they are checked on (tests/modeling/test_one_function.py, test_reduced_precision.py)."""

from __future__ import annotations

import functools

import torch

from mate_cli.modeling.attention import REGISTRY
from mate_cli.modeling.attention.mate import VARIANTS
from mate_cli.modeling.encoder import build_backend
from mate_cli.layout import ID_FIELDS, TableLayout
from mate_cli.modeling.synthetic import filled_layout

HEADS, HEAD_DIM = 4, 8
G, R = 8, 6
#: test-sized options (the yaml defaults are sized for 2048-token inputs)
OPTIONS = {
    "linformer": {"k": 32},
    "table_etc": {"num_global": 16, "local_radius": R, "max_relative_distance": 3},
    "mate": {"global_size": G, "radius": R},
}


#: every registered backend; MATE once per (variant, impl)
CONFIGS = [(name, {}) for name in sorted(REGISTRY) if name != "mate"] + [
    ("mate", {"variant": variant, "impl": impl}) for variant, impls in VARIANTS.items() for impl in impls
]


def case_id(name: str, options: dict) -> str:
    return "-".join([name, *options.values()])


IDS = [case_id(*config) for config in CONFIGS]


# ------------------------------------------------------------------ inputs
@functools.cache
def layouts() -> tuple[TableLayout, TableLayout]:
    """``(short alone, [long, short] padded)``: |Q| = 12 > G; rows (4 cells of ~6
    tokens) and columns (~18 rows) longer than R. The long example is over 2x longer."""
    short = filled_layout(448, query_tokens=12, columns=4, cell_tokens=6, seed=1)
    long = filled_layout(960, query_tokens=40, columns=6, cell_tokens=10, seed=2)
    return short, stack(long, short)


def stack(*layouts: TableLayout) -> TableLayout:
    """One padded batch of single-example layouts (as the collators build it)."""
    return TableLayout.from_lists(
        [{name: getattr(one, name)[0, one.attention_mask[0]].tolist() for name in ID_FIELDS} for one in layouts]
    )


def make_backend(name: str, options: dict, max_length: int):
    factory = functools.partial(REGISTRY[name], **OPTIONS.get(name, {}), **options)
    return build_backend(factory, num_heads=HEADS, head_dim=HEAD_DIM, max_length=max_length, dropout=0.0, layer_index=0)


def layer_layout(backend, layout: TableLayout) -> TableLayout:
    """The layout layer 0 sees (after the encoder's ``extend_inputs`` hook)."""
    with torch.no_grad():
        return backend.extend_inputs(torch.zeros(layout.batch_size, layout.seq_len, HEADS * HEAD_DIM), layout)[1]
