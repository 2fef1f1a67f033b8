"""Every backend's bad constructor options raise a one-line `MateError` naming the config key."""

from __future__ import annotations

import pytest

from mate_cli.errors import MateError
from mate_cli.modeling.attention.linformer import LinformerAttention
from mate_cli.modeling.attention.mate import MateAttention
from mate_cli.modeling.attention.table_etc import TableETCAttention

CASES = [  # (backend, options, the key the message names)
    (MateAttention, {"global_size": 0}, "attention.global_size"),
    (MateAttention, {"radius": 0}, "attention.radius"),
    (MateAttention, {"radius": 2.5}, "attention.radius"),
    (MateAttention, {"row_heads_ratio": -0.1}, "attention.row_heads_ratio"),
    (MateAttention, {"row_heads_ratio": 1.5}, "attention.row_heads_ratio"),
    (MateAttention, {"impl": "sparse"}, "attention.impl"),
    (MateAttention, {"variant": "approximate"}, "attention.variant"),
    (MateAttention, {"variant": "exact", "impl": "kernel"}, "attention.impl"),
    (MateAttention, {"variant": "bucketed", "impl": "masked"}, "attention.impl"),
    (TableETCAttention, {"num_global": 1}, "attention.num_global"),
    (TableETCAttention, {"num_global": 7}, "attention.num_global"),
    (TableETCAttention, {"local_radius": 0}, "attention.local_radius"),
    (TableETCAttention, {"max_relative_distance": -1}, "attention.max_relative_distance"),
    (LinformerAttention, {"max_length": 32, "k": 64}, "attention.k"),
    (LinformerAttention, {"max_length": 32, "k": 8, "init": "orthogonal"}, "attention.init"),
]


@pytest.mark.parametrize("backend,options,key", CASES, ids=[f"{c.__name__}-{k}" for c, _, k in CASES])
def test_bad_option_raises_one_line_mate_error_naming_the_key(backend, options, key):
    with pytest.raises(MateError) as err:
        backend(num_heads=2, head_dim=4, **options)
    assert key in str(err.value) and "\n" not in str(err.value)
