#!/usr/bin/env bash
# Everything this project measures on a GPU, in one command, for whenever a CUDA GPU is
# available (BENCHMARKS.md reads what it writes). From the repository root:
#   make gpu-wheels         # on a machine with pip access: the wheels a bare GPU machine lacks
#                           # (hydra-core, omegaconf, datasets, ...) and the bundled MiniLM into .whl/
#   bash tools/gpu_run.sh   # on the GPU machine: installs .whl/ into a temp dir, then
#     1. the CUDA tests (MATE's Triton kernels compiled, FlexAttention, MATE's backends)
#     2. the kernel grid, bf16 and float32, inference and fwd+bwd, 2,048-32,768 tokens:
#        dense SDPA (flash), mate.triton, mate.eager, mate.flex, flex on the exact mask
#     3. the encoder grid in bf16: inference and a training step against dense SDPA,
#        transformers' TapasModel and BertModel
#     4. a training step under torch.cuda.set_sync_debug_mode("error") (no host sync)
#     5. a short `mate train hardware=gpu attention.impl=triton` run
# Everything lands in $GPU_OUT (default outputs/gpu): gpu.txt, tests.log, one bench run dir
# per grid (bench.csv, bench.md), host_sync.txt, train/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${GPU_OUT:-outputs/gpu}"
py="${PYTHON:-python3}"
wheels="${GPU_WHEELS_DIR:-.whl}"
mkdir -p "$out"
if compgen -G "$wheels/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mate-gpu-site "$wheels"/*.whl
  export PYTHONPATH="/tmp/mate-gpu-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 MATE_OUTPUT_DIR="$out/runs"
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'tools/gpu_run.sh: no CUDA GPU here; run it on a machine with one')"
mate() { "$py" -m mate_cli.cli "$@"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$py" -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null || true; } | tee "$out/gpu.txt"

"$py" -m pytest -q -p no:cacheprovider tests/modeling/test_mate_triton.py tests/modeling/test_mate_flex.py \
  tests/modeling/test_attention_mate.py 2>&1 | tee "$out/tests.log" || true

for dtype in bfloat16 float32; do
  mate bench bench.device=cuda bench.dtype="$dtype" bench.levels=[kernel] bench.lengths=[2048,4096,8192,16384,32768] \
    bench.linear_lengths=[] "bench.kernel.backends=[dense,mate.triton,mate.eager,mate.flex,flex]" \
    "hydra.run.dir=$out/kernel_$dtype"
done
mate bench bench.device=cuda bench.dtype=bfloat16 bench.levels=[encoder] bench.lengths=[2048,4096,8192] \
  bench.linear_lengths=[16384,32768] "bench.encoder.backends=[dense,mate.triton,mate.bucketed,tapas_hf,bert_hf]" \
  "bench.encoder.linear_backends=[mate.triton]" bench.max_length.encoder_train=8192 "hydra.run.dir=$out/encoder_bfloat16"

"$py" -m mate_cli.bench.host_sync 2>&1 | tee "$out/host_sync.txt" || true
model=minilm  # the bundled MiniLM where its package is installed, else make gpu-wheels' bf16 copy
[ -d "$wheels/minilm" ] && model="$PWD/$wheels/minilm"
mate train experiment=hybridqa_mate hardware=gpu attention.impl=triton logger=csv trainer.max_steps=20 \
  "model.encoder.pretrained=$model" "hydra.run.dir=$out/train"
