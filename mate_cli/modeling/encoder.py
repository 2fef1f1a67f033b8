"""`TableEncoder`: BERT/TAPAS embeddings, then N post-LN layers whose attention is a pluggable
:class:`~mate_cli.modeling.attention.backend.AttentionBackend` (docs/architecture.md, "Add an attention backend").

Module names mirror ``BertModel``/``TapasModel`` (loading is :mod:`mate_cli.modeling.checkpoints`' rename table); a
backend's own parameters live under ``encoder.layer.{i}.attention.self.backend``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Literal

import torch
import torch.utils.checkpoint
from torch import nn

from mate_cli.errors import MateError
from mate_cli.modeling import checkpoints
from mate_cli.pretrained import read_config, resolve_pretrained, weight_files
from mate_cli.modeling.attention import REGISTRY, AttentionBackend  # the package import registers every backend
from mate_cli.modeling.encoder_config import EncoderConfig, apply_overrides
from mate_cli.modeling.embeddings import TableEmbeddings
from mate_cli.layout import TableLayout

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,  # exact (erf) GELU, as BERT's "gelu"
    "gelu_new": functools.partial(nn.GELU, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
}


class SelfAttention(nn.Module):
    """Q/K/V projections around a backend (BERT's ``attention.self``)."""

    def __init__(self, config: EncoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.query, self.key, self.value = (nn.Linear(config.hidden_size, config.hidden_size) for _ in range(3))
        self.backend = backend

    def forward(self, hidden: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        # [batch, seq, hidden] -> [batch, heads, seq, head_dim]
        heads = (self.num_heads, self.head_dim)
        q, k, v = (proj(hidden).unflatten(-1, heads).transpose(1, 2) for proj in (self.query, self.key, self.value))
        context = self.backend(q, k, v, layout)
        return context.transpose(1, 2).flatten(2)


class AddNorm(nn.Module):
    """``LayerNorm(residual + dropout(dense(x)))``: BERT's ``*.output`` blocks."""

    def __init__(self, in_size: int, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(x)))


#: ``mix(context, hidden) -> context``: a model's change to a layer's attention context before
#: its output block (Transformer-XH's hop attention, :mod:`mate_cli.modeling.xh`)
ContextMix = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Attention(nn.Module):
    """Self-attention plus its output block (BERT's ``attention``)."""

    def __init__(self, config: EncoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.self = SelfAttention(config, backend)
        self.output = AddNorm(config.hidden_size, config)

    def forward(self, hidden: torch.Tensor, layout: TableLayout | None, mix: ContextMix | None = None) -> torch.Tensor:
        """``mix`` (if any) edits the context before the output block."""
        context = self.self(hidden, layout)
        return self.output(context if mix is None else mix(context, hidden), hidden)


class Layer(nn.Module):
    """One post-LN transformer layer (BERT's ``encoder.layer.{i}``)."""

    def __init__(self, config: EncoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.attention = Attention(config, backend)
        if config.hidden_act not in ACTIVATIONS:
            raise MateError(
                f"model.hidden_act={config.hidden_act!r} is not supported; use one of {sorted(ACTIVATIONS)}"
            )
        dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate = nn.Sequential(OrderedDict(dense=dense, act=ACTIVATIONS[config.hidden_act]()))
        self.output = AddNorm(config.intermediate_size, config)

    def forward(self, hidden: torch.Tensor, layout: TableLayout | None, mix: ContextMix | None = None) -> torch.Tensor:
        hidden = self.attention(hidden, layout, mix)
        return self.output(self.intermediate(hidden), hidden)


class Pooler(nn.Module):
    """``tanh(dense(hidden[:, 0]))``: ``[batch, seq, hidden]`` -> ``[batch, hidden]``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


#: an ``attention`` config: a Hydra partial or a backend class, called with the interface's shared keywords
BackendFactory = Callable[..., AttentionBackend]


def backend_factory(attention: BackendFactory | str) -> BackendFactory:
    """A Hydra partial, a backend class, or a registered name -> a factory."""
    if isinstance(attention, str):
        if attention not in REGISTRY:
            raise MateError(f"attention={attention!r} is not a known backend; choose one of {sorted(REGISTRY)}")
        return REGISTRY[attention]
    return attention


@functools.cache
def compiled_stack(backend: str, mode: str | None) -> Callable[..., torch.Tensor]:
    """:meth:`TableEncoder.run_stack` compiled once per (backend, mode) for every encoder: the parameters are the
    graph's inputs, so encoders of one shape share it."""
    return torch.compile(TableEncoder.run_stack, backend=backend, mode=mode, dynamic=True)


#: ``torch.compile``'s modes (Inductor's)
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_settings(compile: bool | str, mode: str | None) -> tuple[str, str | None]:
    """``model.encoder.compile`` and ``compile_mode`` -> ``(torch.compile backend, mode)``, or one line naming the
    choices: a registered backend (true: Inductor), and a mode of :data:`COMPILE_MODES` with Inductor only."""
    import torch._dynamo

    backend = "inductor" if compile is True else compile
    if not isinstance(backend, str) or backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise MateError(
            f"model.encoder.compile={compile!r} is invalid; use false, true (Inductor) or the name of a torch.compile "
            "backend (torch._dynamo.list_backends(), e.g. aot_eager)"
        )
    if mode not in COMPILE_MODES:
        raise MateError(
            f"model.encoder.compile_mode={mode!r} is invalid; use null or one of "
            + ", ".join(m for m in COMPILE_MODES if m)
        )
    if mode is not None and backend != "inductor":
        raise MateError(
            f"model.encoder.compile_mode={mode} is Inductor's, but model.encoder.compile={backend}; "
            "set model.encoder.compile=true or model.encoder.compile_mode=null"
        )
    return backend, mode


def build_backend(
    factory: BackendFactory, *, num_heads: int, head_dim: int, max_length: int, dropout: float, layer_index: int
) -> AttentionBackend:
    """One layer's backend from an attention factory (the interface's shared keywords)."""
    backend = factory(
        num_heads=num_heads, head_dim=head_dim, max_length=max_length, dropout=dropout, layer_index=layer_index
    )
    if not isinstance(backend, AttentionBackend):
        raise MateError(
            f"the attention config built a {type(backend).__name__}, not an AttentionBackend; "
            "check _target_ in conf/attention/<name>.yaml"
        )
    return backend


class TableEncoder(nn.Module):
    """``attention``: the per-layer backend factory (``conf/attention/<name>.yaml``'s partial) or a registered name.
    ``gradient_checkpointing`` recomputes each layer in the backward (dropout replays the same masks): the same
    gradients for one more forward. ``compile``: ``torch.compile`` the stack of layers as one function (true:
    Inductor; a backend's name, e.g. ``aot_eager``, traces without generating code) with dynamic sequence lengths, so
    a new batch length reuses the compiled graph; each backend's per-layout preparation
    (:meth:`AttentionBackend.prepare`) runs eagerly before it. The parameters and their names stay the module's own.
    ``compile_mode``: ``torch.compile``'s mode (``reduce-overhead``: CUDA graphs, one recorded per batch shape, for
    one encoder forward a step)."""

    def __init__(
        self,
        config: EncoderConfig,
        attention: BackendFactory | str = "dense",
        max_length: int | None = None,
        gradient_checkpointing: bool = False,
        compile: bool | str = False,
        compile_mode: str | None = None,
    ) -> None:
        super().__init__()
        self.gradient_checkpointing = bool(gradient_checkpointing)
        if config.hidden_size % config.num_heads:
            raise MateError(
                f"model.hidden_size={config.hidden_size} is not divisible by model.num_heads={config.num_heads}; "
                "pick sizes that divide"
            )
        self.config = config
        self.max_length = int(max_length or config.max_position_embeddings)
        if self.max_length > config.max_position_embeddings and not config.reset_position_index_per_cell:
            raise MateError(
                f"dataset.max_length={self.max_length} exceeds the checkpoint's max_position_embeddings="
                f"{config.max_position_embeddings}; set dataset.max_length<={config.max_position_embeddings} "
                "or model.encoder.reset_position_index_per_cell=true"
            )
        factory = backend_factory(attention)
        head_dim = config.hidden_size // config.num_heads
        shared = dict(
            num_heads=config.num_heads, head_dim=head_dim, max_length=self.max_length, dropout=config.attention_dropout
        )
        self.embeddings = TableEmbeddings(config)
        layers = [Layer(config, build_backend(factory, **shared, layer_index=i)) for i in range(config.num_layers)]
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(layers)})  # BERT's name: encoder.layer.{i}
        self.pooler = Pooler(config)
        for name, module in self.named_modules():
            if ".backend" not in name:  # a backend initialises its own parameters
                self._init_weights(module)
        self.compiled = compile_settings(compile, compile_mode) if compile else None

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: normal(0, initializer_range) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def backends(self) -> list[AttentionBackend]:
        return [layer.attention.self.backend for layer in self.encoder.layer]

    def check_trainable(self) -> None:
        """Refuse a training-mode, grad-enabled forward through a non-trainable backend."""
        if self.training and torch.is_grad_enabled():
            frozen = [b for b in self.backends if not b.trainable]
            if frozen:
                raise MateError(
                    f"attention={frozen[0].name}: the '{frozen[0].name}' backend is a benchmark floor and cannot "
                    "be trained; choose attention=dense|mate|sat|linformer|table_etc"
                )

    def check_key_bias(self) -> None:
        """Refuse a backend that cannot add ``layout.key_bias`` to its logits (DoT's task model)."""
        unable = [b for b in self.backends if not b.supports_key_bias]
        if unable:
            raise MateError(
                f"attention={unable[0].name} ({unable[0].extra_repr() or 'default'}) cannot add DoT's pruning scores "
                "to its attention logits; use attention=dense, attention=sat or attention=mate attention.variant=exact "
                "for the task model"
            )

    def forward(self, input_ids: torch.Tensor, layout: TableLayout | None = None) -> torch.Tensor:
        """``input_ids`` ``[batch, seq]`` and their layout (``None``: no structure, no padding) -> the last hidden state
        ``[batch, seq, hidden]``."""
        hidden, layout, num_prefix = self.embed(input_ids, layout)
        if self.compiled is None:
            hidden = self.run_stack(hidden, layout)
        else:
            self.prepare_backends(hidden, layout)
            hidden = compiled_stack(*self.compiled)(self, hidden, layout)
        return hidden[:, num_prefix:] if num_prefix else hidden

    def run_stack(self, hidden: torch.Tensor, layout: TableLayout | None) -> torch.Tensor:
        for layer in self.encoder.layer:
            hidden = self.run_layer(layer, hidden, layout)
        return hidden

    def prepare_backends(self, hidden: torch.Tensor, layout: TableLayout | None) -> None:
        """Each backend's :meth:`~AttentionBackend.prepare` for this layout, on a stand-in for the layers' queries
        (their shape, device, dtype under autocast, and whether they need gradients), outside the compiled stack."""
        if layout is None:
            return
        device = hidden.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        query = self.encoder.layer[0].attention.self.query.weight
        grad = torch.is_grad_enabled() and (query.requires_grad or hidden.requires_grad)
        heads = self.config.num_heads
        shape = (hidden.shape[0], heads, hidden.shape[1], self.config.hidden_size // heads)
        probe = torch.empty((), device=device, dtype=dtype).requires_grad_(grad).expand(shape)
        for backend in self.backends:
            backend.prepare(probe, probe, probe, layout)

    def run_layer(
        self, layer: Layer, hidden: torch.Tensor, layout: TableLayout | None, mix: ContextMix | None = None
    ) -> torch.Tensor:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, hidden, layout, mix, use_reentrant=False)
        return layer(hidden, layout, mix)

    def embed(
        self, input_ids: torch.Tensor, layout: TableLayout | None
    ) -> tuple[torch.Tensor, TableLayout | None, int]:
        """The first layer's input ``(hidden, layout, num_prefix)``: the embeddings between the first backend's two
        hooks (:class:`AttentionBackend`)."""
        self.check_trainable()
        if layout is not None and layout.key_bias is not None:
            self.check_key_bias()
        hidden = self.embeddings(input_ids, self.backends[0].embedding_layout(layout))
        return self.backends[0].extend_inputs(hidden, layout)

    @classmethod
    def from_pretrained(
        cls,
        pretrained: str | os.PathLike,
        attention: BackendFactory | str,
        max_length: int | None = None,
        reset_position_index_per_cell: bool | None = None,
        gradient_checkpointing: bool = False,
        compile: bool | str = False,
        compile_mode: str | None = None,
        new_type_embeddings: Literal["normal", "zero"] = "normal",
        hidden_dropout: float | None = None,
        attention_dropout: float | None = None,
        **config_overrides: Any,
    ) -> "TableEncoder":
        """From a BERT or TAPAS checkpoint (:func:`~mate_cli.pretrained.resolve_pretrained`).

        ``reset_position_index_per_cell``: None turns it on wherever ``max_length`` exceeds the position table, else
        keeps a TAPAS checkpoint's own setting (off for BERT). ``new_type_embeddings``: how the token-type tables the
        checkpoint lacks start: ``normal`` (as TAPAS initialises them) or ``zero`` (the encoder starts as the
        checkpoint's function). The dropouts and ``config_overrides``: :class:`EncoderConfig` fields (None: the
        checkpoint's value).
        """
        resolved = resolve_pretrained(pretrained)
        hf = read_config(resolved)
        model_type = hf.get("model_type", "bert")
        if model_type not in ("bert", "tapas"):
            raise MateError(
                f"model.encoder.pretrained={pretrained!s} is a {model_type!r} checkpoint; only BERT and TAPAS load "
                "(use minilm, a bert-* or a google/tapas-* checkpoint)"
            )
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise MateError(
                f"model.encoder.pretrained={pretrained!s} uses "
                f"position_embedding_type={hf['position_embedding_type']!r}; "
                "only absolute position embeddings are supported"
            )
        dropouts = dict(hidden_dropout=hidden_dropout, attention_dropout=attention_dropout)
        for key, value in dropouts.items():  # a probability every layer (and kernel) takes
            if value is not None and not 0.0 <= value < 1.0:
                raise MateError(
                    f"model.encoder.{key}={value} is invalid: it must be in [0, 1); "
                    f"set model.encoder.{key}=<value> accordingly (null keeps the checkpoint's)"
                )
        overrides = {k: v for k, v in {**config_overrides, **dropouts}.items() if v is not None}
        config = apply_overrides(EncoderConfig.from_hf_dict(hf), overrides)
        length = int(max_length or config.max_position_embeddings)
        if reset_position_index_per_cell is not None:
            config.reset_position_index_per_cell = bool(reset_position_index_per_cell)
        elif model_type != "tapas" or length > config.max_position_embeddings:
            config.reset_position_index_per_cell = length > config.max_position_embeddings
        if new_type_embeddings not in ("normal", "zero"):
            raise MateError(f"model.encoder.new_type_embeddings={new_type_embeddings!r} is invalid; use normal or zero")
        model = cls(config, attention, length, gradient_checkpointing, compile, compile_mode)
        state = checkpoints.rename_state_dict(checkpoints.read_state_dict(weight_files(resolved)))
        missing, _ = checkpoints.load_state_dict(model, state, source=str(pretrained))
        if new_type_embeddings == "zero":
            with torch.no_grad():
                for name in missing:
                    if name.startswith("embeddings.token_type_embeddings"):
                        model.get_parameter(name).zero_()
        return model

    def save_pretrained(
        self, directory: str | os.PathLike, tokenizer: Any = None, extra_state: dict | None = None, prefix: str = ""
    ) -> Path:
        """Write a ``transformers.TapasModel`` directory atomically (a backend's own parameters included: transformers
        ignores them, :meth:`from_pretrained` restores them). ``prefix`` (``"tapas."``) and ``extra_state`` (a head's
        tensors) make a task-model directory (:mod:`mate_cli.modeling.mlm`)."""
        from safetensors.torch import save_file

        target = Path(directory).expanduser().resolve()
        if target.exists() and not target.is_dir():
            raise MateError(f"cannot save the model to {target}: a file is in the way; choose another directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            config = self.config.to_tapas_dict()
            (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            state = {prefix + k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
            state.update(extra_state or {})
            save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
            if tokenizer is not None:
                save_tokenizer(tokenizer, staging)
            replace_directory(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """The tokenizer's own files plus a WordPiece ``vocab.txt`` (what TAPAS tokenizers read)."""
    tokenizer.save_pretrained(str(directory))
    vocab_path = directory / "vocab.txt"
    if not vocab_path.exists():
        by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        vocab_path.write_text("".join(f"{token}\n" for token, _ in by_id), encoding="utf-8")


def replace_directory(staging: Path, target: Path) -> None:
    if not target.exists():
        os.replace(staging, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, old / target.name)
    try:
        os.replace(staging, target)
    except OSError:
        os.replace(old / target.name, target)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
