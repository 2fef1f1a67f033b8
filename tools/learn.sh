#!/usr/bin/env bash
# The table tasks learned on a GPU, MATE against dense: each task's GPU recipe
# (conf/profile/<task>_gpu.yaml) for each attention and seed, within a time budget, then the
# table $LEARN_OUT/learn.md (python -m mate_cli.bench.learn) and the runs' small files packed
# into $LEARN_OUT/learn_runs.tar.gz (metrics.json, the CSV learning curve, the log, the config).
# SQA's and WikiTQ's runs log at every validation their dev accuracy with the other decoding too,
# val/accuracy_at_least_one_cell (model.head.at_least_one_cell=true: the most probable cell where none passes 0.5).
# A run that has no metrics.json yet resumes from its last.ckpt (ckpt_path=) when the script is
# run again: the budget ends a run with SIGTERM, which saves last.ckpt at the end of the batch.
# Seeds go outermost, so a short budget gives every task and attention its first seed. From the
# repository root:
#   LEARN_DATA=<folder with sqa/, wtq/ and tabfact/ in their upstream layouts> bash tools/learn.sh
# tools/gpu_run.sh runs it as its learn step. Settings (environment):
#   LEARN_OUT         the run dirs, learn.md and the pack (default outputs/learn)
#   LEARN_DATA        the full releases; without it the bundled samples (data/)
#   LEARN_TASKS       default "sqa wtq tabfact"; wtq1024: WikiTQ's recipe at 1,024 tokens (batches of 16),
#                     where dense attention pays more than MATE; synth: TabFact's recipe on `mate synthesize`'s
#                     statements about the tasks' training tables (MATE's Table 4 "+ CS": LEARN_INIT="sqa=synth
#                     wtq=sqa" starts SQA from it): LEARN_DATA/synth if there (make gpu-synth carries it), else written
#                     first into $LEARN_OUT/synth_data from LEARN_DATA's releases (about 1 min, one process, within the
#                     budget) or the samples' training tables; synth2, synth3 ...: the same recipe on another carried
#                     corpus, LEARN_DATA/synth2 (make gpu-synth SYNTH_NAME=synth2), such as a second stage started from
#                     the first (LEARN_INIT="synth2=synth")
#   LEARN_ATTENTIONS  default "mate dense"
#   LEARN_SEEDS       default "1 2"
#   LEARN_BUDGET      seconds for all the runs (default 480); a run starts only with 60 left, and one still running
#                     at the end gets TERM (it saves last.ckpt), then 30 s later KILL; the table and the pack
#                     take seconds more. tools/gpu_run.sh sets it from its own time limit
#   LEARN_HARDWARE    gpu (default) or cpu
#   LEARN_ARGS        more overrides for every run, after the recipe's (split on spaces)
#   LEARN_LANES       runs at a time on the one device (default 1). Each lane takes the next run to do, in the order
#                     seeds, tasks (as listed), attentions, so that a short budget ends with whole comparisons: every
#                     task's MATE and dense runs of the first seed before any of the second. A run of the recipes
#                     leaves a GPU idle most of a step (BENCHMARKS.md), which other runs then fill; each run's
#                     examples/s and minutes are then a shared device's (the table says so). The lanes' runs share the
#                     cores as OMP_NUM_THREADS (their loader workers stay at dataset.num_workers=auto: at most 4
#                     each); a task's preprocessing is done by one run while the others wait for the cache. The
#                     baselines run beside the first runs. A signal to this script (Ctrl-C, a time limit's TERM to
#                     its process group) passes TERM on to each run (it saves last.ckpt), starts no other, writes
#                     the table and the pack, and exits 143
#   LEARN_INIT        tasks that start from another task's run, as TAPAS fine-tunes WikiTQ from its SQA
#                     model: "wtq=sqa" starts each wtq run from the weights of the sqa run of the same
#                     attention and seed (init_from=; the heads' tensors that fit load too), once that run is
#                     complete: a lane that would take it while that run trains takes another, or waits; a source
#                     that is not complete at its turn (cut, failed, not in LEARN_TASKS) leaves it not started
#   LEARN_SWEEP       overrides to try beside these runs, each this script's own call in a folder of its own, named
#                     LEARN_OUT, "_" and the entry with each character other than letters, digits, "." and "-" made
#                     "_" (model.optimizer.lr=1e-4 -> outputs/learn_model.optimizer.lr_1e-4), with LEARN_ARGS and then
#                     the override, in one lane each (so LEARN_LANES + one per override share the device), within the
#                     same budget; e.g. LEARN_SWEEP="model.optimizer.lr=1e-4 model.optimizer.lr=2e-5". Their runs are
#                     LEARN_SWEEP_TASKS (default LEARN_TASKS) for LEARN_SWEEP_ATTENTIONS (default mate) and
#                     LEARN_SWEEP_SEEDS (default 1), with this call's data, hardware and LEARN_INIT (a task that starts
#                     from another needs that one among LEARN_SWEEP_TASKS too). An override led by tasks and ":" runs
#                     for those tasks instead (and a chained task's source must be among them), so that one call tries
#                     one thing on one task and another on another:
#                     LEARN_SWEEP="sqa:trainer.max_epochs=10 tabfact:trainer.max_epochs=20" (a list: "sqa,wtq:...";
#                     the folder's name keeps the tasks: learn_tabfact_trainer.max_epochs_20). Each folder gets its own
#                     table and pack, copied into LEARN_OUT as learn_<that name>.md and learn_runs_<that name>.tar.gz,
#                     and its output goes to <LEARN_OUT>/sweep_<that name>.log
#   PYTHON            the Python that has mate_cli (default python3)
# A folder's runs are of one setting: a call with other data, hardware, LEARN_ARGS or LEARN_INIT than the
# runs in LEARN_OUT, or with another carried corpus for one of its synth tasks, is refused (settings.txt there says which);
# choose another LEARN_OUT.
# Exit status 0 when every run started, each second scoring and each sweep's call ended or was cut by the budget (the
# next call resumes it), 143 after a signal.
set -uo pipefail
stopped=0  # 143 once a signal came; one before the lanes start leaves them nothing to take
trap 'stopped=143' TERM INT HUP
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # a sweep's folders are this script's own calls
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
read -r -a sweep <<<"${LEARN_SWEEP:-}"
sweep_name() { echo "${1//[^A-Za-z0-9.-]/_}"; }  # a sweep override's folder is LEARN_OUT, "_" and this
task_list='(sqa|wtq|wtq1024|tabfact|synth[0-9]*)(,(sqa|wtq|wtq1024|tabfact|synth[0-9]*))*'
sweep_tasks() {  # a sweep entry's tasks: those before its ":" (no Hydra key holds one), else LEARN_SWEEP_TASKS's
  local key="${1%%=*}"
  if [[ "$key" == *:* ]]; then echo "${key%%:*}" | tr , ' '; return; fi
  echo "${LEARN_SWEEP_TASKS:-${LEARN_TASKS:-sqa wtq tabfact}}"
}
sweep_override() { local key="${1%%=*}"; if [[ "$key" == *:* ]]; then echo "${1#*:}"; else echo "$1"; fi; }
declare -A sweep_folders=()
for value in "${sweep[@]}"; do
  if [[ "${value%%=*}" == *:* ]] && ! [[ "$value" =~ ^$task_list:[^:=]+(=|$) ]]; then
    echo "tools/learn.sh: LEARN_SWEEP: '$value' is no <tasks>:<override> (tasks from sqa, wtq, wtq1024, tabfact and synth," \
      "synth2 ..., comma-separated), such as tabfact:trainer.max_epochs=20" >&2
    exit 2
  fi
  name=$(sweep_name "$value")
  if [ -n "${sweep_folders[$name]:-}" ]; then
    echo "tools/learn.sh: LEARN_SWEEP: '$value' and '${sweep_folders[$name]}' would share the folder ${out}_$name" >&2
    exit 2
  fi
  sweep_folders[$name]="$value"
done
settings="data: ${data:-the bundled samples}; hardware: ${LEARN_HARDWARE:-gpu}; args: ${LEARN_ARGS:-none}"
[ -n "${LEARN_INIT:-}" ] && settings+="; init: $LEARN_INIT"
for task in ${LEARN_TASKS:-} $(for value in "${sweep[@]}"; do sweep_tasks "$value"; done); do
  if [[ "$task" =~ ^synth[0-9]+$ ]] && { [ -z "$data" ] || [ ! -e "$data/$task" ]; }; then
    echo "tools/learn.sh: $task trains on a carried corpus, ${data:-<LEARN_DATA>}/$task, and there is none;" \
      "make gpu-synth SYNTH_NAME=$task writes it" >&2
    exit 2
  fi
done
for task in $(for task in ${LEARN_TASKS:-}; do echo "$task"; done | grep -Ex 'synth[0-9]*' | sort -u); do
  [ -n "$data" ] && [ -e "$data/$task" ] || continue
  # a carried corpus (make gpu-synth): the settings that drew it and its statements' digest, so that runs on another
  # corpus are not resumed here
  corpus=$("$py" -c 'import hashlib, json, sys
settings = json.load(open(sys.argv[1] + "/synthesize.json")).get("settings")
digest = hashlib.sha256(open(sys.argv[1] + "/tokenized_data/train_examples.json", "rb").read()).hexdigest()[:12]
print(json.dumps(settings, sort_keys=True), "statements sha256", digest)' "$data/$task" 2>/dev/null) || {
    echo "tools/learn.sh: $data/$task is no whole mate synthesize corpus; make gpu-synth writes it again" >&2
    exit 2
  }
  settings+="; $task: $corpus"
done
if [ -f "$out/settings.txt" ] && [ "$(cat "$out/settings.txt")" != "$settings" ]; then
  echo "tools/learn.sh: $out holds runs of other settings ($(cat "$out/settings.txt"));" \
    "set LEARN_OUT to a new folder" >&2
  exit 2
fi
mkdir -p "$out"
echo "$settings" >"$out/settings.txt"
# this call's tables and packs (a sweep's too) are written at its end: none, should it be killed
rm -f "$out"/learn.md "$out"/learn_runs.tar.gz "$out"/learn_*.md "$out"/learn_runs_*.tar.gz
base_task() { echo "${1%%[0-9]*}"; }  # wtq1024 -> wtq, synth2 -> synth
dev_side() {  # whose dev side a task's runs score (its baselines'): wtq1024's is wtq's; each synth corpus its own
  if [ "$(base_task "$1")" = synth ]; then echo "$1"; else base_task "$1"; fi
}
recipe() {  # the task whose experiment and profile a task's runs use: synth trains TabFact's recipe
  if [ "$(base_task "$1")" = synth ]; then echo tabfact; else base_task "$1"; fi
}
synth_root() {  # a synth task's statements ($1, default synth): carried with the releases, else this folder's own
  local task="${1:-synth}"
  if [ -n "$data" ] && [ -e "$data/$task" ]; then echo "$data/$task"; else echo "$out/${task}_data"; fi
}
synthesize() {  # the synth task's statements, unless there: about the releases' training tables, or the samples'
  local root sources=(dataset.tables=train dataset.sources.hybridqa=null)
  root=$(synth_root)
  [ -f "$root/synthesize.json" ] && return 0
  [ -n "$data" ] && sources=(dataset=pretrain_tasks "dataset.sources.wtq=$data/wtq" "dataset.sources.sqa=$data/sqa"
    "dataset.sources.tabfact=$data/tabfact")
  waited timeout -k 10 "$budget" "$py" -m mate_cli.cli synthesize "${sources[@]}" "hydra.run.dir=$root" \
    >"$out/synthesize.log" 2>&1
}
task_data() {  # into the array targs: the task's dataset config and data, the release or the bundled sample
  local task config
  task=$(base_task "$1")
  if [ "$task" = synth ]; then targs=(dataset=tabfact "dataset.root=$(synth_root "$1")"); return; fi
  config="$task"
  [ "$task" = tabfact ] && config=tabfact_sample  # TabFact's recipe splits the validation file by table
  targs=("dataset=${task}_sample")
  [ -n "$data" ] && targs=("dataset=$config" "dataset.root=$data/$task")
  if [ "$1" = wtq1024 ]; then targs+=(dataset.max_length=1024 dataset.batch_size=16); fi
}
init_source() {  # the task whose run this task starts from (LEARN_INIT), or nothing
  local pair
  for pair in ${LEARN_INIT:-}; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}" && return; done
}
start=$(date +%s)
status=0
grace=30  # seconds a run has, after the budget's TERM, to save last.ckpt, before KILL
claims="$out/.claims"  # this call's: a job's claim (a lane took it), <job>.ended once its run is over, STOP at a signal
rm -rf "$claims" && mkdir -p "$claims"
jobs=()  # "task attention seed" in the order lanes take them: seeds outermost, then the tasks as listed
for seed in ${LEARN_SEEDS:-1 2}; do
  for task in ${LEARN_TASKS:-sqa wtq tabfact}; do
    for attention in ${LEARN_ATTENTIONS:-mate dense}; do
      run="$out/${task}_${attention}_s$seed"
      if [ ! -f "$run/metrics.json" ]; then
        jobs+=("$task $attention $seed")
      fi
    done
  done
done
# the runs at a time, at most: this folder's lanes, and the lanes of the sweep's folders or of the folder that runs
# this one as a sweep (LEARN_BESIDE)
sharing=$(( (lanes < ${#jobs[@]} ? lanes : ${#jobs[@]}) + ${#sweep[@]} + ${LEARN_BESIDE:-0} ))
child=  # the command a lane or the baselines wait for
reap() {  # waits for background process $1 and returns its status, through any signal whose trap cut the wait short
  local rc last
  wait "$1"
  rc=$?
  while kill -0 "$1" 2>/dev/null; do wait "$1"; rc=$?; done
  if [ "$rc" -gt 128 ]; then  # that wait's own status, or the process's: ask once more (127: it was the process's)
    wait "$1" 2>/dev/null
    last=$?
    [ "$last" = 127 ] || rc=$last
  fi
  return "$rc"
}
waited() {  # "$@" in the background, waited for: a signal meanwhile runs this shell's trap (pass_on), then waits on
  "$@" &
  child=$!
  [ -e "$claims/STOP" ] && pass_on  # the signal came before there was a command to pass it on to
  reap "$child"
  local rc=$?
  child=
  return "$rc"
}
pass_on() {  # a lane's or the baselines' trap: TERM, once, to the command it waits for (a run saves last.ckpt)
  touch "$claims/STOP"
  [ -n "$child" ] && [ -z "${passed:-}" ] && passed=1 && kill -TERM "$child" 2>/dev/null
  return 0
}
baselines() {  # seconds each, on the host only: beside the first runs
  local task left failed=0 targs=()
  trap pass_on TERM INT HUP
  for task in $(for t in ${LEARN_TASKS:-sqa wtq tabfact}; do dev_side "$t"; done | sort -u); do
    [ -f "$out/baseline_$task/metrics.json" ] || [ -e "$claims/STOP" ] && continue
    left=$(( budget - ($(date +%s) - start) ))
    [ "$left" -lt 10 ] && continue
    task_data "$task"
    waited timeout -k 10 "$(( left < 300 ? left : 300 ))" "$py" -m mate_cli.cli baseline "${targs[@]}" \
      "hydra.run.dir=$out/baseline_$task" >"$out/baseline_$task.log" 2>&1 || failed=1
  done
  return "$failed"
}
train() {  # one run: train (or resume) $1=task $2=attention $3=seed within what is left of the budget
  local task=$1 attention=$2 seed=$3 name run left from_task began rc init=() resume=() targs=()
  name="${task}_${attention}_s$seed"
  run="$out/$name"
  if [ -e "$claims/STOP" ]; then echo "learn: $name: not started (stopped by a signal)"; return 0; fi
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
  # the budget's TERM ends the run at the end of a batch, last.ckpt saved; KILL $grace s later if it has not
  waited timeout -s TERM -k "$grace" "$left" "$py" -m mate_cli.cli train experiment="$(recipe "$task")_mate" \
    attention="$attention" profile="$(recipe "$task")_gpu" hardware="${LEARN_HARDWARE:-gpu}" "${targs[@]}" \
    seed="$seed" logger=csv "${extra[@]}" "${init[@]}" "${resume[@]}" "hydra.run.dir=$run" >>"$out/$name.log" 2>&1
  rc=$?
  # the wall time of each call, summed in the table, and how many lanes shared the device at most meanwhile
  echo "$(( $(date +%s) - began )) $sharing" >>"$out/$name.seconds"
  if [ -e "$claims/STOP" ] && [ "$rc" != 0 ]; then
    echo "learn: $name: stopped by a signal (exit $rc); the next call resumes it ($out/$name.log)"
    return 0
  fi
  if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && (( $(date +%s) - began >= left )); }; then  # 137: it needed the KILL
    echo "learn: $name: cut by the budget${resume:+ (resumed)}; the next call resumes it ($out/$name.log)"
    return 0
  fi
  echo "learn: $name: exit $rc${resume:+ (resumed)} ($out/$name.log)"
  return "$rc"
}
in_jobs() { local job; for job in "${jobs[@]}"; do [ "$job" = "$*" ] && return 0; done; return 1; }
claim() {  # prints the next job for a lane (in a subshell, under a lock): the first one not claimed whose LEARN_INIT
  # source is complete or not in this call; "wait" while the rest wait for a source a lane is training; fails at the end
  local job task attention seed from waiting=0 first=
  exec 9>"$claims/lock" && flock 9 || { echo "learn: no lock on $claims/lock: no more runs start" >&2; return 1; }
  [ -e "$claims/STOP" ] && return 1
  for job in "${jobs[@]}"; do
    read -r task attention seed <<<"$job"
    [ -e "$claims/${task}_${attention}_s$seed" ] && continue
    from=$(init_source "$task")
    if [ -n "$from" ] && in_jobs "$from $attention $seed" && [ ! -e "$claims/${from}_${attention}_s$seed.ended" ]; then
      [ -e "$claims/${from}_${attention}_s$seed" ] && waiting=1  # its source is running; else a lane takes it first
      first="${first:-$job}"
      continue
    fi
    touch "$claims/${task}_${attention}_s$seed" && echo "$job" && return 0
  done
  if [ "$waiting" = 1 ]; then echo wait; return 0; fi
  [ -n "$first" ] || return 1
  read -r task attention seed <<<"$first"  # sources that start from each other (LEARN_INIT in a circle): train says so
  touch "$claims/${task}_${attention}_s$seed" && echo "$first"
}
lane() {  # takes jobs until none is left; fails if one of its runs did
  local job failed=0
  trap pass_on TERM INT HUP
  while job=$(claim); do
    if [ "$job" = wait ]; then sleep 2; continue; fi
    read -r -a job <<<"$job"
    train "${job[@]}" || failed=1
    touch "$claims/${job[0]}_${job[1]}_s${job[2]}.ended"  # a run that starts from it (LEARN_INIT) need not wait more
  done
  return "$failed"
}
pids=()
stop() {  # a signal to this script (Ctrl-C, a time limit): each lane passes TERM on to its run (which saves
  # last.ckpt) and starts no other; the table and the pack are still written
  touch "$claims/STOP"
  kill -TERM "${pids[@]}" 2>/dev/null
  stopped=143
}
trap stop TERM INT HUP
[ "$stopped" = 0 ] || touch "$claims/STOP"  # a signal before this trap: no run starts
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc, which follows OMP_NUM_THREADS
sweeps=()  # "pid value log" of each sweep folder's script
for value in "${sweep[@]}"; do  # each its own learn.sh, one lane, the rest of this one's budget
  [ "$stopped" = 0 ] || break  # a signal meanwhile: no other starts
  name=$(sweep_name "$value")
  log="$out/sweep_$name.log"
  LEARN_OUT="${out}_$name" LEARN_ARGS="${LEARN_ARGS:+$LEARN_ARGS }$(sweep_override "$value")" LEARN_SWEEP= \
    LEARN_LANES=1 LEARN_TASKS="$(sweep_tasks "$value")" LEARN_ATTENTIONS="${LEARN_SWEEP_ATTENTIONS:-mate}" \
    LEARN_SEEDS="${LEARN_SWEEP_SEEDS:-1}" LEARN_BESIDE=$(( sharing - 1 )) \
    LEARN_BUDGET=$(( budget - ($(date +%s) - start) )) \
    OMP_NUM_THREADS=$(( cores / sharing > 0 ? cores / sharing : 1 )) bash "$self" >"$log" 2>&1 &
  pids+=("$!")
  sweeps+=("$! $name $value")
done
if [[ " ${LEARN_TASKS:-} " == *" synth "* ]] && [ "$stopped" = 0 ]; then  # before any lane: the synth runs read it
  (trap pass_on TERM INT HUP; synthesize) &  # waited for in the background: stop() passes a signal on to it
  pids+=("$!")
  reap "$!"
  rc=$?
  unset 'pids[-1]'
  if [ "$rc" != 0 ] && [ ! -e "$claims/STOP" ]; then
    echo "learn: mate synthesize failed ($out/synthesize.log); the synth runs will fail too" >&2
    status=1
  fi
fi
baselines &
pids+=("$!")
lanes_here=$(( sharing - ${#sweep[@]} - ${LEARN_BESIDE:-0} ))
for (( l = 0; l < lanes_here; l++ )); do
  OMP_NUM_THREADS=$(( cores / sharing > 0 ? cores / sharing : 1 )) lane &
  pids+=("$!")
done
declare -A ended=()  # pid -> its exit status
for pid in "${pids[@]}"; do
  reap "$pid"
  ended[$pid]=$?
  [ "${ended[$pid]}" = 0 ] || status=1
done
for entry in "${sweeps[@]}"; do  # each sweep's exit status (its runs' lines are in its log); its table and pack here
  read -r pid name value <<<"$entry"
  echo "learn: sweep $value: exit ${ended[$pid]} ($out/sweep_$name.log)"
  cp "${out}_$name/learn.md" "$out/learn_$name.md" 2>/dev/null
  cp "${out}_$name/learn_runs.tar.gz" "$out/learn_runs_$name.tar.gz" 2>/dev/null
done
trap - TERM INT HUP
"$py" -m mate_cli.bench.learn "$out" | tee "$out/learn.md" || status=1
( cd "$out" && tar -czf learn_runs.tar.gz --ignore-failed-read settings.txt ./*.log ./*.seconds ./*/metrics.json \
    ./*/csv/metrics.csv ./*/resolved_config.yaml ./*/FAILED 2>/dev/null )
rm -rf "$claims"
[ "$stopped" = 0 ] || exit "$stopped"
exit "$status"
