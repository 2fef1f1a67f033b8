"""A trained SQA, WikiTQ or TabFact run written as a ``transformers`` task directory (``mate export``):
``TapasForQuestionAnswering`` or ``TapasForSequenceClassification`` weights (``tapas.`` + the encoder, the head under
transformers' names), a ``config.json`` holding the head settings the run trained with, a ``TapasTokenizer`` over the
run's vocabulary (what ``pipeline("table-question-answering")`` reads), and a model card (``README.md``): the run's
settings, its dev metrics, and what transformers computes of it. Read back by :mod:`mate_cli.run.task_directory`.

Written atomically (a staging folder renamed into place); an existing folder is replaced only when a model card of
this module says it wrote it (:data:`MARKER`), else one `MateError` line."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.lit_modules.entailment import VERDICTS
from mate_cli.modeling.encoder import replace_directory
from mate_cli.modeling.tapas_heads import AGGREGATIONS
from mate_cli.run.rebuild import TrainedRun
from mate_cli.run.task_directory import TASK_NAMES

log = logging.getLogger(__name__)

#: the model card's line that marks a folder this module wrote (and may replace)
MARKER = "<!-- written by `mate export`; it replaces this folder only while this line is here -->"


def check_exportable(run: TrainedRun) -> None:
    """One `MateError` line where the run's model is more than transformers' TAPAS task model holds: another
    pooling than [CLS] through the pooler, extra layers, DoT's pruner."""
    model, where = run.model, f"ckpt_path={run.ckpt_path}"
    if model.pooling != "cls":
        raise MateError(
            f"{where}: its head reads model.pooling={model.pooling}, and transformers' TAPAS heads read [CLS] through "
            "the pooler; export a run trained with model.pooling=cls"
        )
    if model.extra is not None:
        raise MateError(
            f"{where}: it has {len(model.extra.layers)} extra layers on the encoder (model.extra_layers), which a "
            "TAPAS directory cannot hold; export a run trained with model.extra_layers=0"
        )
    if model.dot is not None:
        raise MateError(
            f"{where}: it is DoT's task model, whose attention reads its pruner's scores; a TAPAS directory holds "
            "one transformer: export a run trained with model.dot=null"
        )


def task_config(run: TrainedRun) -> tuple[str, dict]:
    """``(architecture, config.json)``: the encoder's TAPAS config with the head's settings and labels."""
    model, task = run.model, str(run.cfg.dataset.task)
    config = model.encoder.config.to_tapas_dict()
    if task == "tabfact":
        architecture = "TapasForSequenceClassification"
        labels = {i: verdict.capitalize() for i, verdict in enumerate(VERDICTS)}  # the classifier's order
        config.update(id2label={str(i): name for i, name in labels.items()}, label2id={n: i for i, n in labels.items()})
    else:
        architecture = "TapasForQuestionAnswering"
        config.update(dataclasses.asdict(model.head_config))
        if model.head_config.num_aggregation_labels:
            config.update(aggregation_labels={str(i): name for i, name in enumerate(AGGREGATIONS)},
                          no_aggregation_label_index=0)  # fmt: skip
    config["architectures"] = [architecture]
    config["mate_task"] = task  # which task the head serves, where its settings alone do not say (SQA or WikiTQ)
    return architecture, config


def write_tapas_tokenizer(run: TrainedRun, directory: Path) -> None:
    """A ``TapasTokenizer`` over the run's WordPiece vocabulary and casing, reading ``dataset.max_length`` tokens and at
    most as many rows and columns as the model has row and column ids. Its empty-cell token is the vocabulary's
    ``[EMPTY]`` where it has one, else ``[UNK]`` (as mate's tokenizer writes it): a token the vocabulary lacks would
    get an id past the model's embeddings."""
    from transformers import TapasTokenizer

    vocab = directory / "vocab.txt"
    by_id = sorted(run.tokenizer.get_vocab().items(), key=lambda item: item[1])
    vocab.write_text("".join(f"{token}\n" for token, _ in by_id), encoding="utf-8")
    lower = bool(run.tokenizer.init_kwargs.get("do_lower_case", True))
    empty = "[EMPTY]" if "[EMPTY]" in run.tokenizer.get_vocab() else run.tokenizer.unk_token
    sizes = (
        run.model.encoder.config.type_vocab_sizes
    )  # segment, column, row, ...: ids past a table's size would not embed
    tokenizer = TapasTokenizer(str(vocab), do_lower_case=lower, empty_token=empty, max_column_id=int(sizes[1]),
                               max_row_id=int(sizes[2]), model_max_length=int(run.cfg.dataset.max_length))  # fmt: skip
    tokenizer.save_pretrained(str(directory))


def check_target(target: Path) -> None:
    """Refuse a file in the way, or a folder with files no export wrote (its ``README.md`` lacks :data:`MARKER`)."""
    if target.exists() and not target.is_dir():
        raise MateError(f"directory={target} is a file; choose a directory that does not exist (or one mate wrote)")
    try:
        if not target.is_dir() or not any(target.iterdir()):
            return
    except OSError as error:
        raise MateError(
            f"cannot read directory={target} ({error.strerror or error}); choose another directory"
        ) from None
    card = target / "README.md"
    try:
        ours = card.is_file() and MARKER in card.read_text(encoding="utf-8", errors="replace")
    except OSError:
        ours = False
    if not ours:
        raise MateError(
            f"directory={target} holds files `mate export` did not write; it replaces only its own exports: "
            "choose a new directory=<folder>, or move that one away"
        )


def run_metrics(run: TrainedRun) -> dict[str, float]:
    """The run's dev metrics (``val/*`` of its ``metrics.json``) where they score the exported checkpoint (the run's
    best, or its last when it names none), else {}."""
    checkpoint = Path(run.ckpt_path).resolve()
    try:
        metrics = json.loads((checkpoint.parent.parent / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(metrics, dict)
        or Path(str(metrics.get("best_checkpoint") or "last.ckpt")).name != checkpoint.name
    ):
        return {}
    return {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("val/") and isinstance(v, (int, float))}


def model_card(run: TrainedRun, architecture: str) -> str:
    """``README.md``: front matter for the hub, :data:`MARKER`, the run's settings and metrics, how to load it."""
    cfg, task = run.cfg, str(run.cfg.dataset.task)
    attention = run.model.encoder.backends[0].name
    settings = {
        "experiment": cfg.get("experiment_name"),
        "attention": attention,
        "dataset": f"{task} ({OmegaConf.select(cfg, 'dataset.root', default='')})",
        "dataset.max_length": OmegaConf.select(cfg, "dataset.max_length", default=None),
        "starting checkpoint": OmegaConf.select(cfg, "model.encoder.pretrained", default=None),
        "seed": cfg.get("seed"),
        "trainer.max_steps": OmegaConf.select(cfg, "trainer.max_steps", default=None),
        "model.optimizer.lr": OmegaConf.select(cfg, "model.optimizer.lr", default=None),
        "checkpoint": run.ckpt_path,
    }
    tag = [] if task == "tabfact" else ["pipeline_tag: table-question-answering"]  # no pipeline reads a verdict
    title = f"# {architecture} for {TASK_NAMES[task]}, trained with mate_cli"
    lines = ["---", "library_name: transformers", *tag, "tags:", "- tapas", "- mate_cli", "---", MARKER, "", title,
             "", "| setting | value |", "|---|---|"]  # fmt: skip
    lines += [f"| {key} | `{value}` |" for key, value in settings.items() if value not in (None, "")]
    metrics = run_metrics(run)
    if metrics:
        lines += ["", "## Dev metrics of the run", "", "| metric | value |", "|---|---:|"]
        lines += [f"| {key} | {value:.4f} |" for key, value in metrics.items()]
    lines += ["", "## What transformers computes of it", ""]
    if attention != "dense":
        lines += [
            f"This model was trained with `attention={attention}`. transformers runs dense attention, so it computes "
            f"another function than the one trained: {attention}'s function needs {attention}'s attention, which "
            f"mate_cli runs: `mate eval ckpt_path=<this folder> \"overrides=['attention={attention}']\"`.",
            "",
        ]
    lines += [
        "Under dense attention transformers gives the same logits as mate_cli on inputs without padding. In a "
        "padded batch TAPAS counts padding in the question's cell, mate_cli in no cell, so column 0's logit and "
        "the loss of an example without an answer cell can differ there.",
        "",
    ]
    head = getattr(run.model, "head_config", None)
    if head is not None and (head.cell_classification_threshold != 0.5 or head.at_least_one_cell):
        lines += [
            f"The run decodes with `cell_classification_threshold={head.cell_classification_threshold}` and "
            f"`at_least_one_cell={str(head.at_least_one_cell).lower()}`; transformers' pipeline selects the cells "
            "above 0.5 and may select none, so its answers differ from the run's where those settings matter.",
            "",
        ]
    lines += [
        "```python",
        f"from transformers import TapasTokenizer, {architecture}",
        'tokenizer = TapasTokenizer.from_pretrained("<this folder>")',
        f'model = {architecture}.from_pretrained("<this folder>")',
        "```",
        "",
    ]
    return "\n".join(lines)


def export_run(run: TrainedRun, target: Path) -> tuple[Path, str]:
    """Write ``run`` as a transformers task directory at ``target`` (module docstring); ``(target, architecture)``."""
    check_exportable(run)
    target = target.expanduser().resolve()
    check_target(target)
    architecture, config = task_config(run)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        holder = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    except OSError as error:
        raise MateError(f"cannot write into {target.parent} ({error.strerror or error}); choose directory=<folder> "
                        "in a folder you can write") from None  # fmt: skip
    try:
        staging = holder / target.name
        heads = {name: tensor.detach().cpu().contiguous() for name, tensor in run.model.head.state_dict().items()}
        run.model.encoder.save_pretrained(staging, prefix="tapas.", extra_state=heads)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        write_tapas_tokenizer(run, staging)
        (staging / "README.md").write_text(model_card(run, architecture), encoding="utf-8")
        check_target(target)  # again: another export may have written it meanwhile
        replace_directory(staging, target)
    except OSError as error:
        raise MateError(
            f"cannot write the model to {target} ({error.strerror or error}); nothing was replaced: free the space, "
            "or choose directory=<folder> elsewhere"
        ) from None
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return target, architecture
