"""What one benchmark cell runs: a backend name -> a :class:`Case` doing one measured call.

Backend names (conf/bench.yaml lists them): a registered backend, built from ``attention=<name>`` as training builds
it; ``mate.<variant>`` / ``mate.<impl>`` (:func:`name_overrides`); ``flex`` (kernel: FlexAttention on MATE's exact
mask, ``attention=mate``'s options); ``tapas_hf`` / ``bert_hf`` (encoder: :func:`hf_model`); ``<name>+ckpt``
(encoder: with gradient checkpointing); ``dot.<size>-<K>`` (encoder: :func:`dot_model`).

``kernel`` is one attention call on ``q, k, v`` ``[batch, heads, seq, head_dim]``, ``encoder`` the whole encoder.
``inference`` runs under ``torch.no_grad``; ``train`` is forward and backward of a scalar loss, and at encoder level an
AdamW step (a whole training step). Every model runs in eval mode (dropout off), so the ``none`` floor runs in both
modes and all backends run the same non-attention ops. At kernel level the layout's per-batch structure (sort orders,
masks, block lists) is built by the warm-up call and reused, as by an encoder's later layers; at encoder level each
call gets a fresh layout copy and pays that cost."""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import mate_cli.modeling.attention as attention
from mate_cli.bench import measure
from mate_cli.bench.layouts import table_layout
from mate_cli.errors import MateError
from mate_cli.modeling.attention.mate import block_sparse as sparse
from mate_cli.modeling.attention.backend import AttentionBackend
from mate_cli.modeling.attention.mate import VARIANTS, MateAttention, auto_choice
from mate_cli.layout import TAPAS_TYPE_VOCAB_SIZES
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder, backend_factory
from mate_cli.modeling.encoder import build_backend as build_layer_backend
from mate_cli.layout import TableLayout
from mate_cli.paths import CONF_DIR

LEVELS = ("kernel", "encoder")
MODES = ("inference", "train")
HF_BACKENDS = ("tapas_hf", "bert_hf")
#: ``<backend>+<option>`` suffixes (encoder level) -> TableEncoder keyword set to True.
ENCODER_OPTIONS = {"ckpt": "gradient_checkpointing"}

#: ``bench.dims`` presets: base = BERT/TAPAS-base; minilm = the bundled checkpoint; tiny: quick runs and tests;
#: mini, small, medium, large = the BERT sizes of Turc et al. (2019) that TAPAS and DoT use.
DIMS = {
    "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "minilm": dict(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
    "mini": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "small": dict(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
    "medium": dict(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=2048),
    "large": dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Unavailable(Exception):
    """The backend cannot run here (module absent, level unsupported); the cell is skipped."""


@dataclass
class Case:
    """One prepared cell: ``call()`` performs exactly one measured call. ``flops``: set where FlopCounterMode
    cannot see the work (FlexAttention), the FLOPs of one call as the kernel evaluates them."""

    call: Callable[[], object]  # its result is discarded
    flops: float | None = None
    #: warm-up calls before the memory call: 2 where the first builds what later calls reuse (per-layout structure
    #: at kernel level, the optimiser's state in an encoder training step), so memory is a steady-state call's
    min_warmup: int = 1
    #: False where FlopCounterMode must not run the call (FlexAttention: exact MATE's ``block_sparse`` on CUDA): it
    #: fails there, and leaves torch's compiler refusing FlexAttention for the process. The FLOPs stay empty.
    countable: bool = True
    #: ``err_vs_fp32`` of a kernel cell in bfloat16/float16 (:mod:`~mate_cli.bench.measure`)
    error: Callable[[], float] | None = None


def dims_of(name: str) -> dict:
    if name not in DIMS:
        raise MateError(f"bench.dims={name!r} is unknown; choose one of {', '.join(DIMS)}")
    return DIMS[name]


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise MateError(f"bench.dtype={name!r} is unknown; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def split_options(name: str) -> tuple[str, dict]:
    """``"mate.bucketed+ckpt"`` -> ``("mate.bucketed", {"gradient_checkpointing": True})``."""
    base, *options = str(name).split("+")
    unknown = [o for o in options if o not in ENCODER_OPTIONS]
    if unknown:
        raise MateError(f"bench backend {name!r}: unknown option +{unknown[0]}; known: "
                        f"{', '.join('+' + o for o in ENCODER_OPTIONS)}")  # fmt: skip
    return base, {ENCODER_OPTIONS[o]: True for o in options}


def split_name(name: str) -> tuple[str, str | None]:
    """``"mate.bucketed"`` -> ``("mate", "bucketed")``; ``"dense"`` -> ``("dense", None)``."""
    family, _, impl = str(name).partition(".")
    return family, impl or None


def name_overrides(name: str) -> list[str]:
    """``+attention=<family>``, plus MATE's variant and impl (``mate.<variant>``: impl ``auto``) or another family's
    ``attention.impl``."""
    family, choice = split_name(name)
    overrides = [f"+attention={family}"]
    if choice is None:
        return overrides
    if family != "mate":
        return overrides + [f"attention.impl={choice}"]
    if choice in VARIANTS:
        variant, impl = choice, "auto"
    else:  # an impl belongs to one variant (auto to every one: it names no function)
        owners = [v for v, impls in VARIANTS.items() if choice in impls and choice != "auto"]
        if not owners:
            names = [*VARIANTS, *(i for impls in VARIANTS.values() for i in impls if i != "auto")]
            raise MateError(
                f"bench backend {name!r} names no MATE variant or implementation; use one of "
                f"{', '.join('mate.' + n for n in names)}"
            )
        variant, impl = owners[0], choice
    return overrides + [f"attention.variant={variant}", f"attention.impl={impl}"]


# ------------------------------------------------------------------ factories
@contextlib.contextmanager
def conf_hydra() -> Iterator[None]:
    """Hydra on ``conf/`` for the block; ``mate bench``'s own GlobalHydra is set aside and put back after it."""
    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench"):
            yield
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


@functools.lru_cache(maxsize=None)
def _composed(name: str) -> DictConfig:
    family, impl = split_name(name)
    overrides = name_overrides(name)
    try:
        with conf_hydra():
            return compose(config_name=None, overrides=overrides).attention
    except MissingConfigException:
        raise Unavailable(f"attention backend '{family}' has no conf/attention/{family}.yaml") from None
    except ConfigCompositionException as err:
        if impl:
            raise MateError(f"bench backend {name!r}: conf/attention/{family}.yaml has no 'impl' option") from err
        raise


def attention_config(name: str) -> DictConfig:
    """``conf/attention/<family>.yaml`` composed as training composes it, with :func:`name_overrides`; a copy."""
    return _composed(name).copy()


def check_name(name: str) -> None:
    """`MateError` unless ``name`` is a backend this bench knows: a misspelt name is one line before the grid runs
    (a known backend whose module is absent from this install is a skipped cell)."""
    base, _ = split_options(name)
    family, _ = split_name(base)
    if family == "dot":
        dot_shape(base)
    if base in ("flex", *HF_BACKENDS) or family == "dot":
        return
    if family not in attention.BACKEND_MODULES:
        raise MateError(
            f"bench backend {name!r} is unknown; use flex, {', '.join(HF_BACKENDS)}, dot.<size>-<K>, or "
            f"<family>[.<impl>] with a family among {', '.join(attention.BACKEND_MODULES)}"
        )
    if family in attention.REGISTRY:
        attention_config(base)  # a variant or impl its config lacks is one line


def attention_factory(name: str) -> Callable[..., AttentionBackend]:
    """The per-layer backend factory ``instantiate(cfg.attention)`` gives training; :class:`Unavailable` if unknown."""
    family, _ = split_name(name)
    if family not in attention.REGISTRY:
        raise Unavailable(f"attention backend '{family}' is not available (mate_cli.modeling.attention.{family})")
    return backend_factory(instantiate(attention_config(name)))


def build_backend(name: str, num_heads: int, head_dim: int, max_length: int) -> AttentionBackend:
    """Layer 0's backend, built from the factory as the encoder builds it (eval mode)."""
    factory = attention_factory(name)
    return build_layer_backend(
        factory, num_heads=num_heads, head_dim=head_dim, max_length=max_length, dropout=0.0, layer_index=0
    ).eval()


# ------------------------------------------------------------------ kernel level
def kernel_case(
    name: str, mode: str, layout: TableLayout, dims: dict, batch: int, dtype: torch.dtype, device: torch.device
) -> Case:
    """One attention call on random ``q, k, v`` (``[batch, heads, seq, head_dim]`` views of ``[batch, seq, heads,
    head_dim]`` tensors, as the encoder's projections give them), on the layout layer 0 sees: after the backend's
    ``extend_inputs`` (TableETC's row/column memory); ``embedding_layout`` is for embeddings, and there are none
    here."""
    if name in HF_BACKENDS:
        raise Unavailable(f"{name} is an encoder-level anchor")
    if split_options(name)[1]:
        raise Unavailable(f"{name}: +options apply to the encoder level")
    heads, head_dim = dims["num_heads"], dims["hidden_size"] // dims["num_heads"]
    layout = layout.to(device)
    generator = torch.Generator().manual_seed(0)
    module = flops = None
    if name == "flex":
        fn, flops = flex_kernel(layout, heads, head_dim, mode, device)
    else:
        module = build_backend(name, heads, head_dim, max_length=layout.seq_len).to(device=device, dtype=dtype)
        layout = layer_layout(module, layout, batch, heads * head_dim, dtype, device)
        fn = functools.partial(module, layout=layout)
    shape = (batch, layout.seq_len, heads, head_dim)  # the encoder's layout: [batch, heads, seq, head_dim] views
    base = [torch.randn(shape, generator=generator).transpose(1, 2) for _ in range(3)]
    q, k, v = (t.to(device, dtype) for t in base)
    cotangent = None
    if mode == "inference":
        call = torch.no_grad()(functools.partial(fn, q, k, v))
    else:
        leaves = [t.requires_grad_() for t in (q, k, v)]
        params = list(module.parameters()) if module is not None else []
        cotangent = torch.randn(shape, generator=generator).transpose(1, 2)
        grad_out = cotangent.to(device, dtype)
        flops = None if flops is None else 3.5 * flops

        def call() -> None:
            for t in leaves + params:
                t.grad = None
            with torch.enable_grad():
                fn(*leaves).backward(grad_out)

    error = float32_comparison(fn, module, layout, base, cotangent, dtype, device)
    return Case(call, flops, min_warmup=2, countable=not runs_flex(module, q, grad=mode == "train"), error=error)


def base_kernel_case(backend: str, mode: str, length: int, dtype, device, dims: str = "base") -> Case:
    """:func:`kernel_case` on the benchmark table of ``length`` tokens, batch 1: the GPU tools' case."""
    _, layout = table_layout(length)
    return kernel_case(backend, mode, layout, dims_of(dims), 1, dtype, device)


def gpu_tool_args(name: str, doc: str, **options: dict) -> argparse.Namespace:
    """The ``--<option>`` arguments of ``python -m mate_cli.bench.<name>``; one line where no CUDA GPU is."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for option, settings in options.items():
        parser.add_argument(f"--{option}", **settings)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"mate_cli.bench.{name}: no CUDA GPU here; run it on a machine with one")
    return args


def float32_comparison(fn, module, layout, base, cotangent, dtype, device) -> Callable[[], float] | None:
    """``Case.error``: None in float32, else ``err_vs_fp32`` (:mod:`mate_cli.bench.measure`) against a float32 copy
    of ``module`` (no module: ``fn``, which follows its inputs' dtype); gradients only with a ``cotangent``."""
    if dtype == torch.float32:
        return None
    reference = fn if module is None else functools.partial(copy.deepcopy(module).float(), layout=layout)
    real = layout.attention_mask[:, None, :, None]

    def error() -> float:
        results = []
        for f, dt in ((fn, dtype), (reference, torch.float32)):
            leaves = [t.to(device, dt).requires_grad_(cotangent is not None) for t in base]
            with torch.set_grad_enabled(cotangent is not None):
                out = f(*leaves)
                if cotangent is not None:
                    out.backward(cotangent.to(device, dt))
            results.append([out] + ([t.grad for t in leaves] if cotangent is not None else []))
        return max(measure.relative_error(a, b, real) for a, b in zip(*results))

    return error


def runs_flex(model: torch.nn.Module | None, q: torch.Tensor, grad: bool) -> bool:
    """Whether a MATE backend in ``model`` runs FlexAttention for inputs like ``q`` (no dropout): exact MATE's
    ``block_sparse`` on CUDA."""
    if model is None or not sparse.uses_flex(q, 0.0):
        return False
    impls = [m.impl for m in model.modules() if isinstance(m, MateAttention) and m.variant == "exact"]
    auto = auto_choice("exact", q.device, q.dtype, grad, q.shape[2]) if "auto" in impls else None
    return any((auto if impl == "auto" else impl) == "block_sparse" for impl in impls)


def layer_layout(
    backend: AttentionBackend, layout: TableLayout, batch: int, hidden_size: int, dtype: torch.dtype, device
) -> TableLayout:
    """The layout after ``backend.extend_inputs``, the encoder's hook before layer 0 (its hidden states discarded)."""
    hidden = torch.zeros(batch, layout.seq_len, hidden_size, dtype=dtype, device=device)
    with torch.no_grad():
        _, layout, _ = backend.extend_inputs(hidden, layout)
    return layout


def flex_kernel(
    layout: TableLayout, heads: int, head_dim: int, mode: str, device: torch.device
) -> tuple[Callable, float]:
    """FlexAttention on MATE's exact mask: ``(fn(q, k, v), flops_per_call)``. FlopCounterMode cannot trace it, so
    the FLOPs are what the kernel evaluates: ``4 * head_dim * block_size^2`` per computed (partial or full) block."""
    if mode == "train" and device.type == "cpu":
        raise Unavailable(f"flex: FlexAttention has no CPU backward in torch {torch.__version__}")
    cfg = OmegaConf.to_container(attention_config("mate"), resolve=True)  # attention=mate's options the kernel takes
    accepted = inspect.signature(sparse.flex_mate_attention).parameters
    options = {k: v for k, v in cfg.items() if k in accepted and not k.startswith("_")}
    block = int(options.get("block_size", 128))
    fn = functools.partial(sparse.flex_mate_attention, layout=layout, **options)
    _, block_mask = sparse._flex_structure(layout, heads, float(options.get("row_heads_ratio", 0.5)), block)
    full = block_mask.full_kv_num_blocks
    blocks = block_mask.kv_num_blocks.sum() + (0 if full is None else full.sum())
    return fn, float(4 * head_dim * block * block * int(blocks))


# ------------------------------------------------------------------ encoder level
def encoder_case(
    name: str,
    mode: str,
    input_ids: torch.Tensor,
    layout: TableLayout,
    dims: dict,
    dtype: torch.dtype,
    device: torch.device,
) -> Case:
    full_name, (name, options) = name, split_options(name)
    if name == "flex":
        raise Unavailable("flex is a kernel-level anchor")
    if options and (name in HF_BACKENDS or split_name(name)[0] == "dot"):
        raise Unavailable(f"{full_name}: +options apply to this project's TableEncoder only")
    seq_len = layout.seq_len
    type_sizes = type_vocab_sizes(layout)
    input_ids, layout = input_ids.to(device), layout.to(device)
    if split_name(name)[0] == "dot":
        model, forward = dot_model(name, dims, type_sizes, seq_len, input_ids, layout)
    elif name in HF_BACKENDS:
        model, kwargs = hf_model(name, dims, seq_len, type_sizes, input_ids, layout)

        def forward() -> torch.Tensor:
            return model(**kwargs).last_hidden_state

    else:
        model = bench_encoder(dims, type_sizes, seq_len, attention_factory(name), **options)

        def forward() -> torch.Tensor:
            return model(input_ids, layout.with_fields())  # fresh caches (module docstring)

    model = model.to(device=device, dtype=dtype).eval()
    probe = torch.empty(1, 1, seq_len, 1, device=device, dtype=dtype)  # like the q every attention layer sees
    if mode == "inference":
        return Case(torch.no_grad()(forward), countable=not runs_flex(model, probe, grad=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def train_call() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad():
            forward().float().square().mean().backward()
        optimizer.step()

    return Case(train_call, min_warmup=2, countable=not runs_flex(model, probe, grad=True))


def bench_encoder(dims: dict, type_sizes: list[int], seq_len: int, attention, **options) -> TableEncoder:
    """This project's encoder at ``dims`` without dropout, per-cell positions as TAPAS's (random weights)."""
    no_dropout = dict(hidden_dropout=0.0, attention_dropout=0.0)
    config = EncoderConfig(**dims, **no_dropout, type_vocab_sizes=type_sizes, reset_position_index_per_cell=True)
    return TableEncoder(config, attention, max_length=seq_len, **options)


def dot_shape(name: str) -> tuple[str, int]:
    """``dot.<pruner size>-<K>`` -> ``(size, K)`` (``dot``: ``small``, 256)."""
    size, _, top_k = (split_name(name)[1] or "small-256").partition("-")
    if size not in DIMS or not (top_k or "256").isdecimal() or int(top_k or 256) < 1:
        raise MateError(
            f"bench backend {name!r}: write dot.<pruner size>-<K> with a size among {', '.join(DIMS)} and a "
            "positive whole number K (e.g. dot.small-256)"
        )
    return size, int(top_k or 256)


def dot_model(name: str, dims: dict, type_sizes: list[int], seq_len: int, input_ids, layout):
    """``dot.<pruner size>-<K>`` (e.g. ``dot.small-256``): DoT (Krichene et al. 2021), a dense pruner of that size over
    all ``seq_len`` tokens, then the dense task encoder at ``dims`` over the top K, attention biased by the scores.
    Its baseline is ``dense`` at the same length (the paper's TAPAS)."""
    from mate_cli.modeling.dot import DoubleTransformer

    size, top_k = dot_shape(name)
    pruner = bench_encoder(DIMS[size], type_sizes, seq_len, "dense")
    model = torch.nn.ModuleDict(
        {"dot": DoubleTransformer(pruner, top_k=top_k), "task": bench_encoder(dims, type_sizes, seq_len, "dense")}
    )

    def forward() -> torch.Tensor:
        fresh = layout.with_fields()
        pruned = model["dot"](input_ids, fresh, model["task"].embeddings.position_ids(fresh))  # dense: layout as is
        return model["task"](pruned.input_ids, pruned.layout)

    return model, forward


def type_vocab_sizes(layout: TableLayout) -> list[int]:
    """TAPAS's sizes, widened where the bench table has more rows/columns than 255."""
    sizes = list(TAPAS_TYPE_VOCAB_SIZES)
    sizes[1] = max(sizes[1], int(layout.column_ids.max()) + 1)
    sizes[2] = max(sizes[2], int(layout.row_ids.max()) + 1)
    return sizes


def hf_model(name: str, dims: dict, seq_len: int, type_sizes: list[int], input_ids, layout):
    """``transformers`` TapasModel (eager) or BertModel (sdpa) at ``dims``, random init."""
    import transformers

    common = dict(
        hidden_size=dims["hidden_size"],
        num_hidden_layers=dims["num_layers"],
        num_attention_heads=dims["num_heads"],
        intermediate_size=dims["intermediate_size"],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    mask = layout.attention_mask.long()
    if name == "tapas_hf":
        config = transformers.TapasConfig(
            **common, type_vocab_sizes=type_sizes, reset_position_index_per_cell=True, max_position_embeddings=512
        )
        config._attn_implementation = "eager"
        model = transformers.TapasModel(config, add_pooling_layer=False)
        kwargs = dict(input_ids=input_ids, attention_mask=mask, token_type_ids=layout.token_type_ids)
    else:
        config = transformers.BertConfig(
            **common, max_position_embeddings=max(512, seq_len), attn_implementation="sdpa"
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
        kwargs = dict(input_ids=input_ids, attention_mask=mask, token_type_ids=layout.segment_ids)
    return model, kwargs
