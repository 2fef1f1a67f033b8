"""Bucketed MATE (the function of :mod:`.reference`) as fused Triton kernels (``impl=triton``), FlashAttention-2
style in each head's sorted order, q, k, v read through the head's permutation (no sorted copies).

Grids: axis 0 each long tile's splits, then the tiles (the longest programs start first); axis 1 example x head. The
forward visits, per query tile, only the key tiles its rows may attend (globals, then their buckets' windows) and
keeps each row's log-sum-exp; the backward is a dQ pass, which also stores each row's ``rowsum(dO * O)``, then a dK/dV
pass (per key tile, over the query tiles that attend it) that reads it, probabilities recomputed from the
log-sum-exp. A loop that would span the whole sequence, the launch's longest chain (a dense tile's keys, a
global key tile's rows), is cut into :func:`split_chunk` chunks run in parallel; ``combine_kernel`` and
``reduce_kernel`` merge the partials in split order, so results do not depend on scheduling. Dropout is a Philox draw
keyed by (seed, example x head, query token, key token): the passes agree, and no mask depends on tiles or layout.

Products accumulate in float32 (float32 inputs: :data:`FLOAT32_DOT`), the softmax is float32, and results are rounded
once to the inputs' dtype. The launch reads no tensor value on the host (:class:`TritonStructure`). Forward and
backward are one ``torch.library`` custom op each where a call is traced or has no data (:func:`_symbolic`); plain
eager calls launch the same kernels from an ``autograd.Function`` (less host time). CPU tensors run in Triton's
interpreter, a slow check of the GPU code.
"""

from __future__ import annotations

import functools

import torch

from mate_cli.errors import MateError

#: products of float32 inputs: three TF32 tensor-core products (about float32's accuracy)
FLOAT32_DOT = "tf32x3"

#: warps per program on Hopper (sm_90): 4 for dQ and dK/dV (chosen in the rework that made the backward faster; the
#: warps' own share is not isolated: BENCHMARKS.md, "NVIDIA H100"); none spills at these tiles in bf16/fp16
#: (:func:`resource_usage`)
WARPS = {"forward_kernel": 4, "combine_kernel": 4, "dq_kernel": 4, "dkdv_kernel": 4, "reduce_kernel": 4}
#: before Hopper (sm_80, sm_89): dK/dV spills with 4 warps (255 registers and a stack frame on sm_80), so 8
WARPS_BEFORE_HOPPER = {"dkdv_kernel": 8}

#: the most splits of a long tile's loop: a dense row's keys, a global key's rows (:func:`split_chunk`)
MAX_SPLITS = 32

#: the padding group in the kernels' int32 group ids (``PADDING_GROUP`` does not fit)
PAD = 2**31 - 1

#: tile sizes (query rows, key columns). A query tile reads the union of its rows' windows, so short tiles waste less:
#: on 2,048-32,768-token tables at G=116, R=42 (12 heads) the work visited is 1.21x the G + 3R ideal at 32 x 64, 1.37x
#: at 64 x 64, 1.69x at 128 x 64 (:func:`visited_tiles`; tests/modeling/test_mate_triton.py)
BLOCK = {"m": 32, "n": 64}


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports here (GPU builds of PyTorch ship it; ``pip install triton`` elsewhere)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


class TritonStructure:
    """What the kernels read about a layout, device tensors cached on it (no :class:`~.plan.BucketPlan`), int32:
    ``perm`` ``[B*H, N]`` sorted position -> token; ``groups`` ``[B*H, N]`` sorted group ids (padding: :data:`PAD`);
    ``dense``, ``real`` ``[B]``: the dense rows (``min(real, G)``, the global part) and the real tokens, each a sorted
    prefix."""

    def __init__(
        self, layout, num_heads: int, row_heads_ratio: float, global_size: int, radius: int, global_rows: str = "all"
    ) -> None:
        from mate_cli.modeling.attention.mate.plan import sorted_groups

        B, N = layout.batch_size, layout.seq_len
        views = layout.head_views(num_heads, row_heads_ratio)
        by_view = {view: sorted_groups(layout, view, N) for view in set(views)}
        groups = torch.stack([by_view[view] for view in views], 1).reshape(B * num_heads, N)
        self.groups = groups.clamp(max=PAD).to(torch.int32).contiguous()  # padding: PAD
        perm, _ = layout.head_sort_order(num_heads, row_heads_ratio)
        self.perm = perm.reshape(B * num_heads, N).to(torch.int32).contiguous()
        # G unclamped: a compile-time setting of the kernels, which a batch shorter than G must not change
        self.global_size, self.radius, self.heads = int(global_size), int(radius), num_heads
        self.real = layout.attention_mask.sum(1).to(torch.int32).contiguous()
        counted = self.real if global_rows == "all" else layout.is_query.sum(1).to(torch.int32)
        self.dense = counted.clamp(max=self.global_size).contiguous()  # the global part attends to everything

    @staticmethod
    def of(
        layout, num_heads: int, row_heads_ratio: float, global_size: int, radius: int, global_rows: str = "all"
    ) -> "TritonStructure":
        key = ("mate.triton", num_heads, float(row_heads_ratio), int(global_size), int(radius), global_rows)
        return layout.cached(
            key, lambda: TritonStructure(layout, num_heads, row_heads_ratio, global_size, radius, global_rows)
        )


def triton_runs_on(q: torch.Tensor) -> bool:
    """Whether the compiled kernels run for ``q``: a CUDA tensor of compute capability 8.0 or newer (bf16 tensor-core
    products), Triton installed and not in its interpreter. ``attention.impl=auto`` reads it; ``impl=triton`` runs
    wherever asked and says in one line what is missing."""
    if q.device.type != "cuda" or not triton_available() or interpreting():
        return False
    return torch.cuda.get_device_capability(q.device) >= (8, 0)


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter in this process (fixed when Triton is first imported)."""
    import triton.language.standard as standard

    return type(standard.zeros).__name__ == "InterpretedFunction"


def kernels(device: torch.device):
    """:mod:`.triton_kernels` for ``device``: compiled on CUDA, else run by Triton's interpreter, which needs
    ``TRITON_INTERPRET=1`` from the process's start (``torch._dynamo`` imports Triton early). The wrong mode is a
    one-line error."""
    from mate_cli.modeling.attention.mate import triton_kernels

    want = device.type != "cuda"
    if interpreting() != want:
        problem = ("on a CPU tensor the kernels run in Triton's interpreter (a check of the GPU code, slow): "
                   "start the process with TRITON_INTERPRET=1") if want else (
                   "on a CUDA tensor the kernels are compiled: "
                   "start the process without TRITON_INTERPRET=1")  # fmt: skip
        raise MateError(f"attention.impl=triton: {problem}")
    return triton_kernels


def warps(kernel: str, arch: int | None) -> int:
    """Warps of ``kernel`` for CUDA compute capability ``arch`` (90: H100; None: the interpreter, where any do)."""
    return WARPS_BEFORE_HOPPER.get(kernel, WARPS[kernel]) if arch is not None and arch < 90 else WARPS[kernel]


def _arch(x: torch.Tensor) -> int | None:
    return None if x.device.type != "cuda" else _capability(x.device.index)


@functools.cache
def _capability(index: int | None) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def _canonical(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, N, D]`` as a view of a ``[B, N, H, D]`` buffer, the one layout the kernels address (what the
    encoder's projections give: no copy there; a copy for any other layout)."""
    B, H, N, D = x.shape
    want = (N * H * D, D, H * D, 1)
    if all(size == 1 or got == stride for size, got, stride in zip(x.shape, x.stride(), want)):
        return x
    return _bhnd_empty(x).copy_(x)


def _launch_args(q: torch.Tensor, global_size: int, radius: int, dropout_p: float) -> dict:
    """The compile-time settings of a launch (:class:`.triton_kernels.Settings`): the model's sizes and MATE's,
    fixed by its config."""
    B, H, N, D = q.shape
    return {
        "H": H, "D": D, "G": global_size, "R": radius, "SCALE": D**-0.5, "DROPOUT_P": float(dropout_p),
        "BLOCK_D": max(16, 1 << (D - 1).bit_length()), "BLOCK_M": BLOCK["m"], "BLOCK_N": BLOCK["n"], "PAD": PAD,
        "PREC": "tf32" if q.dtype in (torch.float16, torch.bfloat16) else FLOAT32_DOT, "MAX_SPLITS": MAX_SPLITS,
    }  # fmt: skip


def _bhnd_empty(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised ``[B, H, N, D]`` view of a ``[B, N, H, D]`` buffer (the encoder merges heads for free)."""
    B, H, N, D = like.shape
    return like.new_empty((B, N, H, D), dtype=dtype or like.dtype).transpose(1, 2)


def _interpretable(x: torch.Tensor) -> torch.Tensor:
    """``x``, widened to float32 if it is bfloat16 off CUDA: Triton's interpreter computes bfloat16 wrongly (numpy has
    no bfloat16)."""
    return x.float() if x.dtype == torch.bfloat16 and x.device.type != "cuda" else x


def cdiv(a, b):
    """``ceil(a / b)`` for positive ``b``, of ints or integer tensors (as ``triton.cdiv``, which needs Triton)."""
    return -(-a // b)


def split_chunk(seq_len: int) -> int:
    """Positions per split of a long tile's loop (a dense tile's keys, a global key tile's rows): at most
    :data:`MAX_SPLITS` chunks of at least 256. A multiple of both tile sizes (powers of two): the kernels' loops step
    through a chunk by whole tiles and stop at its end only through the sequence's."""
    unit = max(128, BLOCK["m"], BLOCK["n"])
    return max(256, cdiv(cdiv(seq_len, MAX_SPLITS), unit) * unit)


def _splits(N: int, global_size: int) -> tuple[int, int, int, int]:
    """``(T, J, S, CHUNK)``: the query tiles that may hold a dense row (``dense <= G``), the key tiles that may hold a
    global, the splits of each and the positions per split."""
    chunk, G = split_chunk(N), min(global_size, N)
    return cdiv(G, BLOCK["m"]), cdiv(G, BLOCK["n"]), cdiv(N, chunk), chunk


def _parts(like: torch.Tensor, tiles: int, splits: int, block: int, block_d: int, count: int = 1) -> list[torch.Tensor]:
    """``count`` buffers of the split tiles' partial ``[block, block_d]`` results: float32 (float64 for float64
    inputs, which only the interpreter takes: finite-difference checks)."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return [like.new_empty((like.shape[0] * like.shape[1] * tiles * splits, block, block_d), dtype=dtype)
            for _ in range(count)]  # fmt: skip


def _only(settings: dict, kernel) -> dict:
    """The compile-time settings ``kernel`` takes (a setting it does not read would compile it once more per value)."""
    return {key: value for key, value in settings.items() if key in kernel.arg_names}


def _launch_forward(q, k, v, perm, groups, dense, real, seed, global_size: int, radius: int, dropout_p: float,
                    visits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    dtype = q.dtype
    q, k, v = (_canonical(_interpretable(x)) for x in (q, k, v))
    B, H, N, D = q.shape
    out = _bhnd_empty(q)
    lse = torch.empty((B * H, N), dtype=torch.float32, device=q.device)
    settings, arch = _launch_args(q, global_size, radius, dropout_p), _arch(q)
    T, _, S, chunk = _splits(N, global_size)
    (acc_part,) = _parts(q, T, S, BLOCK["m"], settings["BLOCK_D"])
    m_part, l_part = (acc_part.new_empty(acc_part.shape[:2]) for _ in range(2))
    module = kernels(q.device)
    module.forward_kernel[(T * S + cdiv(N, BLOCK["m"]), B * H)](
        q, k, v, out, lse, m_part, l_part, acc_part, perm, groups, dense, real, seed,
        lse if visits is None else visits, N, T, S, chunk, COUNT=visits is not None,
        num_warps=warps("forward_kernel", arch), **_only(settings, module.forward_kernel),
    )  # fmt: skip
    module.combine_kernel[(T, B * H)](
        out, lse, m_part, l_part, acc_part, perm, groups, dense, real, seed, N, T, S,
        num_warps=warps("combine_kernel", arch), **_only(settings, module.combine_kernel),
    )  # fmt: skip
    return out.to(dtype), lse


@torch.library.custom_op("mate::bucketed_triton_forward", mutates_args=())
def _forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, perm: torch.Tensor, groups: torch.Tensor,
    dense: torch.Tensor, real: torch.Tensor, seed: torch.Tensor, global_size: int, radius: int, dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Output ``[B, H, N, D]`` and each row's log-sum-exp ``[B*H, N]`` (float32, token order)."""
    return _launch_forward(q, k, v, perm, groups, dense, real, seed, global_size, radius, dropout_p)


@_forward_op.register_fake
def _(q, k, v, perm, groups, dense, real, seed, global_size, radius, dropout_p):
    B, H, N, D = q.shape
    return _bhnd_empty(q), q.new_empty((B * H, N), dtype=torch.float32)


def _launch_backward(q, k, v, out, lse, grad_out, perm, groups, dense, real, seed, global_size: int, radius: int,
                     dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    dtypes = (q.dtype, k.dtype, v.dtype)
    q, k, v, out, grad_out = (_canonical(_interpretable(x)) for x in (q, k, v, out, grad_out))
    B, H, N, D = q.shape
    delta = torch.empty((B * H, N), dtype=torch.float32, device=q.device)  # rowsum(dO * O), by the dQ pass
    dq, dk, dv = _bhnd_empty(q), _bhnd_empty(k), _bhnd_empty(v)
    module = kernels(q.device)
    settings, arch = _launch_args(q, global_size, radius, dropout_p), _arch(q)
    T, J, S, chunk = _splits(N, global_size)
    dk_part, dv_part = _parts(q, J, S, BLOCK["n"], settings["BLOCK_D"], 2)
    (dq_part,) = _parts(q, T, S, BLOCK["m"], settings["BLOCK_D"])
    pointers = (perm, groups, dense, real, seed, N)
    module.dq_kernel[(T * S + cdiv(N, BLOCK["m"]), B * H)](
        q, k, v, out, grad_out, lse, delta, dq, dq_part, *pointers, T, S, chunk,
        num_warps=warps("dq_kernel", arch), **_only(settings, module.dq_kernel),
    )  # fmt: skip
    module.dkdv_kernel[(J * S + cdiv(N, BLOCK["n"]), B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, dk_part, dv_part, *pointers, J, S, chunk,
        num_warps=warps("dkdv_kernel", arch), **_only(settings, module.dkdv_kernel),
    )  # fmt: skip
    module.reduce_kernel[(T + J, B * H)](
        dq, dk, dv, dq_part, dk_part, dv_part, *pointers, T, J, S,
        num_warps=warps("reduce_kernel", arch), **_only(settings, module.reduce_kernel),
    )  # fmt: skip
    return tuple(g.to(t) for g, t in zip((dq, dk, dv), dtypes))


@torch.library.custom_op("mate::bucketed_triton_backward", mutates_args=())
def _backward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
    perm: torch.Tensor, groups: torch.Tensor, dense: torch.Tensor, real: torch.Tensor, seed: torch.Tensor,
    global_size: int, radius: int, dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dq, dk, dv of :func:`_forward_op` (``[B, H, N, D]``, the inputs' dtypes)."""
    return _launch_backward(
        q, k, v, out, lse, grad_out, perm, groups, dense, real, seed, global_size, radius, dropout_p
    )


@_backward_op.register_fake
def _(q, k, v, out, lse, grad_out, perm, groups, dense, real, seed, global_size, radius, dropout_p):
    return _bhnd_empty(q), _bhnd_empty(k), _bhnd_empty(v)


def _setup_context(ctx, inputs, output):
    q, k, v, perm, groups, dense, real, seed, global_size, radius, dropout_p = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, perm, groups, dense, real, seed)
    ctx.settings = (global_size, radius, dropout_p)


def _gradients(ctx, grad_out, backward) -> tuple:
    q, k, v, out, lse, perm, groups, dense, real, seed = ctx.saved_tensors
    dq, dk, dv = backward(q, k, v, out, lse, grad_out, perm, groups, dense, real, seed, *ctx.settings)
    return dq, dk, dv, None, None, None, None, None, None, None, None


_forward_op.register_autograd(lambda ctx, grad_out, _: _gradients(ctx, grad_out, _backward_op),
                              setup_context=_setup_context)  # fmt: skip


def _symbolic(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` is traced or has no data to launch on: ``torch.compile``/``torch.export`` or compiled
    autograd, a tensor subclass (fake tensors), meta tensors, or a dispatch mode (FakeTensorMode, FlopCounterMode).
    Such calls take the custom ops, whose fake kernels give the shapes."""
    return (torch.compiler.is_compiling() or type(x) is not torch.Tensor or x.device.type == "meta"
            or torch._C._len_torch_dispatch_stack() > 0)  # fmt: skip


class _EagerAttention(torch.autograd.Function):
    """The custom ops' launches for plain eager calls (not :func:`_symbolic`), without their dispatch and autograd
    wrapper, whose host time bounds a call at a few thousand tokens (BENCHMARKS.md). What eager calls give up:
    ``torch.func`` transforms."""

    @staticmethod
    def forward(ctx, q, k, v, perm, groups, dense, real, seed, global_size, radius, dropout_p):
        inputs = (q, k, v, perm, groups, dense, real, seed, global_size, radius, dropout_p)
        out, lse = _launch_forward(*inputs)
        _setup_context(ctx, inputs, (out, lse))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second derivative: asking for one raises, as with the op
    def backward(ctx, grad_out):
        return _gradients(ctx, grad_out, _backward_op if _symbolic(grad_out) else _launch_backward)


def triton_bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    structure: TritonStructure,
    dropout_p: float = 0.0,
    *,
    seed: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q, k, v`` ``[batch, heads, seq, head_dim]`` (q not pre-scaled) -> the same shape, a view of a ``[batch, seq,
    heads, head_dim]`` buffer. ``seed``: an int64 scalar tensor on q's device (default: drawn there, no host sync)."""
    if q.device.type == "cuda" and q.dtype == torch.float64:
        raise MateError("attention.impl=triton takes float16, bfloat16 or float32 on a GPU, not float64; "
                        "use attention.impl=eager for float64")  # fmt: skip
    if seed is None:
        seed = torch.randint(0, 2**31 - 1, (), device=q.device, dtype=torch.int64)
    args = (q, k, v, structure.perm, structure.groups, structure.dense, structure.real, seed, structure.global_size,
            structure.radius, float(dropout_p))  # fmt: skip
    return _forward_op(*args)[0] if _symbolic(q) else _EagerAttention.apply(*args)


def kernel_visits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, structure: TritonStructure) -> int:
    """(query tile, key tile) pairs the forward kernel visited on this call, counted by the kernel."""
    visits = torch.zeros((), dtype=torch.int32, device=q.device)
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    _launch_forward(q, k, v, structure.perm, structure.groups, structure.dense, structure.real, seed,
                    structure.global_size, structure.radius, 0.0, visits)  # fmt: skip
    return int(visits)


def visited_tiles(structure: TritonStructure, seq_len: int) -> int:
    """(query tile, key tile) pairs the forward kernel visits, counted in torch from its bounds (the work against the
    ``G + 3R`` ideal)."""
    M, Nb = BLOCK["m"], BLOCK["n"]
    N, G, R = seq_len, structure.global_size, structure.radius
    m0 = torch.arange(0, N, M, device=structure.dense.device)[None, :]  # [1, tiles]
    dense, real = structure.dense[:, None].long(), structure.real[:, None].long()
    last = torch.clamp(m0 + M, max=N) - 1
    dense_tile = m0 < dense
    hi1 = torch.where(dense_tile, real, real.clamp(max=G))
    lo2 = ((m0 // R - 1) * R).clamp(min=G)
    hi2 = torch.where(dense_tile, torch.zeros_like(m0), torch.minimum(real, (last // R + 2) * R))
    tiles = cdiv(hi1, Nb) + cdiv(hi2 - lo2, Nb).clamp(min=0)
    return int(tiles.sum()) * structure.heads


#: the kernels' arguments that are neither i32 nor pointers of the inputs' dtype
_ARG_TYPES = {"LSE": "*fp32", "DELTA": "*fp32", "PERM": "*i32", "GROUPS": "*i32", "DENSE": "*i32", "REAL": "*i32",
              "SEED": "*i64", "VISITS": "*i32", **dict.fromkeys(("M_PART", "L_PART", "ACC_PART", "DQ_PART", "DK_PART",
              "DV_PART"), "*fp32")}  # fmt: skip
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def resource_usage(arch: int, dtype: torch.dtype = torch.bfloat16, head_dim: int = 64, dropout: bool = True) -> dict:
    """Compile the kernels for CUDA compute capability ``arch`` (90: H100, 80: A100) without a GPU and read
    each cubin's resources with the wheel's ``cuobjdump``: ``{kernel: {"REG", "STACK", "LOCAL"}}`` (LOCAL > 0:
    spills). Needs compiled-mode Triton (no ``TRITON_INTERPRET=1``)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mate_cli.modeling.attention.mate import triton_kernels as module

    like = torch.empty(1, 12, 1, head_dim, dtype=dtype)  # BERT-base heads
    constants = {**_launch_args(like, 116, 42, 0.1 if dropout else 0.0), "COUNT": False}
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    types = {**dict.fromkeys(("Q", "K", "V", "OUT", "DO", "DQ", "DK", "DV"), "*" + _TRITON_TYPES[dtype]), **_ARG_TYPES}
    types.update(dict.fromkeys(constants, "constexpr"))
    usage = {}
    for name in WARPS:
        fn = getattr(module, name)
        signature = {arg: types.get(arg, "i32") for arg in fn.arg_names}
        consts = {(fn.arg_names.index(k),): v for k, v in constants.items() if k in fn.arg_names}
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts),
                                target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": warps(name, arch)})  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / f"{name}.cubin"
            cubin.write_bytes(kernel.asm["cubin"])
            text = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout  # fmt: skip
        usage[name] = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text)}
    return usage
