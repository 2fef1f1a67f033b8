#!/usr/bin/env bash
# `mate train` end to end, dense against MATE, per task: each run trains E2E_STEPS steps after
# 10 warm-up steps with profile_steps=E2E_STEPS (mate_cli/callbacks/step_profile.py), then
# E2E_STEPS more watched for host synchronisations and the GPU-busy share; the table
# $E2E_OUT/e2e.md (python -m mate_cli.bench.e2e) sets the runs side by side. From the
# repository root:
#   E2E_DATA=<folder with tabfact/ and wtq/ in their upstream layouts> bash tools/e2e.sh
# tools/gpu_run.sh runs it as its e2e step with hardware=gpu. Settings (environment):
#   E2E_OUT       where the run dirs and e2e.md go (default outputs/e2e)
#   E2E_DATA      the full releases; without it the bundled samples (data/)
#   E2E_TASKS     any of: tabfact (512 tokens, batch 32), wtq (1,024, batch 16),
#                 hybridqa (2,048, batch 8: the bundled sample's tables, TF-IDF-expanded)
#   E2E_HARDWARE  gpu (default) or cpu
#   E2E_STEPS     steps timed, and as many watched (default 20)
#   E2E_ATTENTIONS  default "dense mate"
#   E2E_ARGS      more overrides for every run, after the task's (e.g. dataset.max_length=128)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${E2E_OUT:-outputs/e2e}"
data="${E2E_DATA:-}"
py="${PYTHON:-python3}"
steps="${E2E_STEPS:-20}"
read -r -a extra <<<"${E2E_ARGS:-}"
mkdir -p "$out"
task_args() {  # the task's experiment, data and batch shape
  case "$1" in
    tabfact) echo "experiment=tabfact_mate profile=tabfact_cpu ${data:+dataset.root=$data/tabfact} dataset.max_length=512 dataset.batch_size=32" ;;
    wtq) echo "experiment=wtq_mate ${data:+profile=wtq_cpu dataset.root=$data/wtq} dataset.max_length=1024 dataset.batch_size=16" ;;
    hybridqa) echo "experiment=hybridqa_mate dataset.max_length=2048 dataset.batch_size=8" ;;
    *) echo "tools/e2e.sh: unknown task $1 (tabfact, wtq, hybridqa)" >&2; return 2 ;;
  esac
}
status=0
total=$(( 10 + 2 * steps + 1 ))  # + 1: the last watched step ends where the next begins
for task in ${E2E_TASKS:-tabfact wtq hybridqa}; do
  args=$(task_args "$task") || exit 2
  for attention in ${E2E_ATTENTIONS:-dense mate}; do
    # no validation or checkpoint inside the measured steps: one short validation and last.ckpt at the end
    # shellcheck disable=SC2086
    "$py" -m mate_cli.cli train $args attention="$attention" hardware="${E2E_HARDWARE:-gpu}" logger=csv \
      profile_steps="$steps" trainer.max_steps="$total" trainer.val_check_interval="$total" \
      trainer.max_epochs=-1 trainer.check_val_every_n_epoch=null trainer.limit_val_batches=2 validate_best=false \
      callbacks.model_checkpoint.every_n_train_steps="$total" \
      "${extra[@]}" "hydra.run.dir=$out/${task}_$attention" >"$out/${task}_$attention.log" 2>&1
    rc=$?
    echo "e2e: $task $attention: exit $rc ($out/${task}_$attention.log)"
    [ "$rc" = 0 ] || status=1
  done
done
"$py" -m mate_cli.bench.e2e "$out" | tee "$out/e2e.md"
exit "$status"
