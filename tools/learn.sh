#!/usr/bin/env bash
# The table tasks learned on a GPU, MATE against dense: each task's GPU recipe
# (conf/profile/<task>_gpu.yaml) for each attention and seed, within a time budget, then the
# table $LEARN_OUT/learn.md (python -m mate_cli.bench.learn) and the runs' small files packed
# into $LEARN_OUT/learn_runs.tar.gz (metrics.json, the CSV learning curve, the log, the config).
# A run that has no metrics.json yet resumes from its last.ckpt (ckpt_path=) when the script is
# run again: the budget ends a run with SIGTERM, which saves last.ckpt at the end of the batch.
# Seeds go outermost, so a short budget gives every task and attention its first seed. From the
# repository root:
#   LEARN_DATA=<folder with sqa/, wtq/ and tabfact/ in their upstream layouts> bash tools/learn.sh
# tools/gpu_run.sh runs it as its learn step. Settings (environment):
#   LEARN_OUT         the run dirs, learn.md and the pack (default outputs/learn)
#   LEARN_DATA        the full releases; without it the bundled samples (data/)
#   LEARN_TASKS       default "sqa wtq tabfact"; wtq1024: WikiTQ's recipe at 1,024 tokens (batches of 16),
#                     where dense attention pays more than MATE
#   LEARN_ATTENTIONS  default "mate dense"
#   LEARN_SEEDS       default "1 2"
#   LEARN_BUDGET      seconds for all the runs (default 480: with the install, one call of under ten
#                     minutes); a run starts only with 60 left
#   LEARN_HARDWARE    gpu (default) or cpu
#   LEARN_ARGS        more overrides for every run, after the recipe's (split on spaces)
#   LEARN_LANES       runs at a time on the one device (default 1). With more, each lane trains an attention and
#                     seed's tasks in order, then its next pair (of the pairs with a run left to do, lane l takes
#                     the l-th, the (l + LEARN_LANES)-th, ...), all lanes at once: "mate dense" and seeds "1 2"
#                     give four pairs, so LEARN_LANES=4 runs the whole table at once. A run of the recipes leaves a GPU idle most of a step (BENCHMARKS.md), which
#                     other runs then fill; each run's examples/s and minutes are then a shared device's (the table
#                     says so). A lane's runs get the cores over the lanes as OMP_NUM_THREADS (their loader workers
#                     stay at dataset.num_workers=auto: at most 4 each); a task's preprocessing is done by one lane
#                     while the others wait for the cache. A signal to this script stops every lane's run (TERM: it
#                     saves last.ckpt) and starts no other
#   LEARN_INIT        tasks that start from another task's run, as TAPAS fine-tunes WikiTQ from its SQA
#                     model: "wtq=sqa" starts each wtq run from the weights of the sqa run of the same
#                     attention and seed (init_from=; the heads' tensors that fit load too), once that
#                     run is complete; until then it is not started (list the source task first)
#   PYTHON            the Python that has mate_cli (default python3)
# A folder's runs are of one setting: a call with other data, hardware, LEARN_ARGS or LEARN_INIT than the
# runs in LEARN_OUT is refused (settings.txt there says which); choose another LEARN_OUT.
# Exit status 0 when every run started ended or was cut by the budget (it resumes next call).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${LEARN_OUT:-outputs/learn}"
data="${LEARN_DATA:-}"
py="${PYTHON:-python3}"
budget="${LEARN_BUDGET:-480}"
read -r -a extra <<<"${LEARN_ARGS:-}"
for pair in ${LEARN_INIT:-}; do
  if ! [[ "$pair" =~ ^[a-z]+[0-9]*=[a-z]+[0-9]*$ ]] || [ "${pair%%=*}" = "${pair#*=}" ]; then
    echo "tools/learn.sh: LEARN_INIT: '$pair' is no <task>=<the task it starts from>, such as wtq=sqa" >&2
    exit 2
  fi
done
lanes="${LEARN_LANES:-1}"
if ! [[ "$lanes" =~ ^[1-9][0-9]*$ ]]; then
  echo "tools/learn.sh: LEARN_LANES: '$lanes' is no number of runs at a time, such as 1 or 4" >&2
  exit 2
fi
mkdir -p "$out"
settings="data: ${data:-the bundled samples}; hardware: ${LEARN_HARDWARE:-gpu}; args: ${LEARN_ARGS:-none}"
[ -n "${LEARN_INIT:-}" ] && settings+="; init: $LEARN_INIT"
if [ -f "$out/settings.txt" ] && [ "$(cat "$out/settings.txt")" != "$settings" ]; then
  echo "tools/learn.sh: $out holds runs of other settings ($(cat "$out/settings.txt")); set LEARN_OUT to a new folder" >&2
  exit 2
fi
echo "$settings" >"$out/settings.txt"
base_task() { echo "${1%%[0-9]*}"; }  # wtq1024 -> wtq
task_data() {  # into the array targs: the task's dataset config and data, the release or the bundled sample
  local task config
  task=$(base_task "$1")
  config="$task"
  [ "$task" = tabfact ] && config=tabfact_sample  # TabFact's recipe splits the validation file by table
  if [ -n "$data" ]; then targs=("dataset=$config" "dataset.root=$data/$task"); else targs=("dataset=${task}_sample"); fi
  if [ "$1" = wtq1024 ]; then targs+=(dataset.max_length=1024 dataset.batch_size=16); fi
}
init_source() {  # the task whose run this task starts from (LEARN_INIT), or nothing
  local pair
  for pair in ${LEARN_INIT:-}; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}" && return; done
}
start=$(date +%s)
status=0
for task in $(for t in ${LEARN_TASKS:-sqa wtq tabfact}; do base_task "$t"; done | sort -u); do  # baselines: seconds
  [ -f "$out/baseline_$task/metrics.json" ] && continue
  task_data "$task"
  "$py" -m mate_cli.cli baseline "${targs[@]}" "hydra.run.dir=$out/baseline_$task" >"$out/baseline_$task.log" 2>&1 ||
    status=1
done
train() {  # one run: train (or resume) $1=task $2=attention $3=seed within what is left of the budget
  local task=$1 attention=$2 seed=$3 name run left from_task began rc init=() resume=() targs=()
  name="${task}_${attention}_s$seed"
  run="$out/$name"
  [ -f "$run/metrics.json" ] && return 0  # complete
  left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt 60 ]; then echo "learn: $name: not started (budget spent)"; return 0; fi
  from_task=$(init_source "$task")
  if [ -n "$from_task" ]; then
    if [ ! -f "$out/${from_task}_${attention}_s$seed/metrics.json" ]; then
      echo "learn: $name: not started (waits for ${from_task}_${attention}_s$seed to complete)"
      return 0
    fi
    init=("init_from=$out/${from_task}_${attention}_s$seed")
  fi
  [ -f "$run/checkpoints/last.ckpt" ] && resume=("ckpt_path=$run")
  began=$(date +%s)
  task_data "$task"
  # the budget's TERM ends the run at the end of a batch, last.ckpt saved; KILL 45 s later if it has not
  timeout -s TERM -k 45 "$left" "$py" -m mate_cli.cli train experiment="$(base_task "$task")_mate" \
    attention="$attention" profile="$(base_task "$task")_gpu" hardware="${LEARN_HARDWARE:-gpu}" "${targs[@]}" \
    seed="$seed" logger=csv "${extra[@]}" "${init[@]}" "${resume[@]}" "hydra.run.dir=$run" >>"$out/$name.log" 2>&1
  rc=$?
  # the wall time of each call, summed in the table, and how many lanes shared the device at most meanwhile
  echo "$(( $(date +%s) - began )) $sharing" >>"$out/$name.seconds"
  if [ "$rc" = 124 ]; then
    echo "learn: $name: cut by the budget${resume:+ (resumed)}; the next call resumes it ($out/$name.log)"
    return 0
  fi
  echo "learn: $name: exit $rc${resume:+ (resumed)} ($out/$name.log)"
  return "$rc"
}
pairs=()  # each attention and seed with a run to do, seeds outermost; a pair's tasks run in order (LEARN_INIT)
for seed in ${LEARN_SEEDS:-1 2}; do
  for attention in ${LEARN_ATTENTIONS:-mate dense}; do
    for task in ${LEARN_TASKS:-sqa wtq tabfact}; do
      if [ ! -f "$out/${task}_${attention}_s$seed/metrics.json" ]; then pairs+=("$attention $seed"); break; fi
    done
  done
done
sharing=$(( lanes < ${#pairs[@]} ? lanes : ${#pairs[@]} ))  # the runs at a time, at most
lane() {  # lane $1 of $sharing: pairs $1, $1 + sharing, ...; fails if one of its runs did
  local i pair failed=0 task
  for (( i = $1; i < ${#pairs[@]}; i += sharing )); do
    read -r -a pair <<<"${pairs[$i]}"
    for task in ${LEARN_TASKS:-sqa wtq tabfact}; do train "$task" "${pair[0]}" "${pair[1]}" || failed=1; done
  done
  return "$failed"
}
if [ "$sharing" -le 1 ]; then
  for seed in ${LEARN_SEEDS:-1 2}; do  # one run at a time: every task and attention gets its first seed first
    for task in ${LEARN_TASKS:-sqa wtq tabfact}; do
      for attention in ${LEARN_ATTENTIONS:-mate dense}; do train "$task" "$attention" "$seed" || status=1; done
    done
  done
else
  lane_pids=()
  stop_lanes() {  # a signal to this script: each lane's run gets TERM (it saves last.ckpt), and no lane starts another
    local pid
    for pid in "${lane_pids[@]}"; do pkill -TERM -P "$pid"; kill -TERM "$pid"; done 2>/dev/null
    exit 143
  }
  trap stop_lanes TERM INT HUP
  for (( l = 0; l < sharing; l++ )); do
    OMP_NUM_THREADS=$(( $(nproc) / sharing > 0 ? $(nproc) / sharing : 1 )) lane "$l" &
    lane_pids+=("$!")
  done
  for pid in "${lane_pids[@]}"; do wait "$pid" || status=1; done
  trap - TERM INT HUP
fi
"$py" -m mate_cli.bench.learn "$out" | tee "$out/learn.md" || status=1
( cd "$out" && tar -czf learn_runs.tar.gz --ignore-failed-read settings.txt ./*.log ./*.seconds ./*/metrics.json \
    ./*/csv/metrics.csv ./*/resolved_config.yaml 2>/dev/null )
exit "$status"
