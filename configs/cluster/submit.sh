#!/bin/bash
# One command for a run on a Slurm cluster: checks the config, creates the log folder, submits the
# learner (learner.sbatch) and then the actors (actors.sbatch) with --dependency=after:<learner>,
# so actor nodes are not held while the learner waits in the queue; the actors then wait for the
# host that learner job publishes once it runs.
#   configs/cluster/submit.sh [options] CONFIG [key=value ...]
#     --learner-nodes N   learner nodes (default 1); ranks = N x GPUs per node
#     --actor-nodes N     actor nodes (default 1)
#     --gpus-per-node G   GPUs on every node (default 8)
#     --cpus-per-node C   CPUs to request per node (default 32), split among a node's actors
#     --logs DIR          Slurm output and the learner's host file (default logs/)
#     --actors-for JOB    submit only an actor job, for learner job JOB (queued or running): after an
#                         actor job was cancelled, preempted or failed, the new actors rejoin its run
#                         (give the same options, config and overrides as the first submission)
# Each actor drives actors.tensor_parallel_size GPUs (from CONFIG and the overrides; 1 for hf), so a node runs
# G / tp actors and actors.num = actor nodes x G / tp. Partition, account and the like come from
# Slurm's own environment variables (SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT, ...).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
LEARNER_NODES=1 ACTOR_NODES=1 GPUS=8 CPUS=32 LOGS=logs REJOIN=
usage() { sed -n '2,/^set /{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 && $1 == --* ]]; do
  [[ $# -ge 2 ]] || usage
  case $1 in
    --learner-nodes) LEARNER_NODES=$2 ;;
    --actor-nodes) ACTOR_NODES=$2 ;;
    --gpus-per-node) GPUS=$2 ;;
    --cpus-per-node) CPUS=$2 ;;
    --logs) LOGS=$2 ;;
    --actors-for) REJOIN=$2 ;;
    *) echo "submit.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2
done
[[ $# -ge 1 ]] || usage
CONFIG=$1
shift
for v in LEARNER_NODES ACTOR_NODES GPUS CPUS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "submit.sh: $v=${!v}: must be a positive whole number" >&2; exit 2; }
done
if [[ -n $REJOIN ]]; then  # the learner's job must still be there to rejoin: not ended, not unknown
  [[ $REJOIN =~ ^[0-9]+$ ]] || { echo "submit.sh: --actors-for $REJOIN: must be a job id" >&2; exit 2; }
  state=$(scontrol show job "$REJOIN" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1) || true
  state=${state#JobState=}
  case $state in
    PENDING|CONFIGURING|RUNNING|REQUEUED|RESIZING|SUSPENDED) ;;
    *) echo "submit.sh: --actors-for $REJOIN: that learner job is ${state:-unknown to scontrol}; nothing to rejoin" >&2
       exit 2 ;;
  esac
fi

# The config as the jobs will read it: a bad key fails here, not after hours in the queue.
TP=$("$PYTHON" - "$LEARNER_NODES" "$ACTOR_NODES" "$GPUS" "$CONFIG" "$@" <<'PY'
import sys
from pathlib import Path

from streamrl import config

nodes, actor_nodes, gpus, path, overrides = *map(int, sys.argv[1:4]), sys.argv[4], sys.argv[5:]
try:
    cfg = config.load(path, overrides)
except config.ConfigError as e:
    sys.exit(f"submit.sh: {e}")
tp, ranks = cfg.actors.engine_gpus(), nodes * gpus  # 1 for a backend that cannot shard (hf)
if gpus % tp:
    sys.exit(f"submit.sh: actors.tensor_parallel_size={tp} must divide the {gpus} GPUs of a node")
if cfg.learner.batch_groups % ranks:
    sys.exit(f"submit.sh: learner.batch_groups={cfg.learner.batch_groups} must divide by the {ranks} learner ranks "
             f"({nodes} node(s) x {gpus} GPUs)")
num = actor_nodes * (gpus // tp)
if (keys := cfg.transport.curve_keys) and not all((Path(keys) / f"actor-{i}.key_secret").is_file() for i in range(num)):
    sys.exit(f"submit.sh: transport.curve_keys={keys}: the {num} actors need actor-0 .. actor-{num - 1} keys there; "
             f"make them with: streamrl keys {keys} --actors {num}")
print(tp)
PY
)
PER_NODE=$((GPUS / TP))
NUM=$((ACTOR_NODES * PER_NODE))
if (( CPUS < PER_NODE )); then
  echo "submit.sh: --cpus-per-node $CPUS is fewer than the $PER_NODE actors per node" >&2
  exit 2
fi
mkdir -p "$LOGS"  # Slurm opens --output before the job starts; older Slurm fails on a missing folder
LOGS=$(cd "$LOGS" && pwd)
if [[ $LOGS == *,* ]]; then echo "submit.sh: --logs $LOGS: no commas (sbatch --export)" >&2; exit 2; fi

if [[ -n $REJOIN ]]; then
  LEARNER_JOB=$REJOIN
else
  LEARNER_JOB=$(sbatch --parsable --nodes "$LEARNER_NODES" --gpus-per-node "$GPUS" --cpus-per-task "$CPUS" \
      --output "$LOGS/%x-%j.out" --export "ALL,STREAMRL_LOGS=$LOGS" \
      "$HERE/learner.sbatch" "$CONFIG" "$@" "actors.num=$NUM")
  LEARNER_JOB=${LEARNER_JOB%%;*}  # "id;cluster" on a multi-cluster setup
fi
if ! ACTORS_JOB=$(sbatch --parsable --dependency "after:$LEARNER_JOB" --nodes "$ACTOR_NODES" \
    --ntasks-per-node "$PER_NODE" --gpus-per-node "$GPUS" --cpus-per-task $((CPUS / PER_NODE)) \
    --output "$LOGS/%x-%j.out" --export "ALL,STREAMRL_LOGS=$LOGS,LEARNER_JOB=$LEARNER_JOB" \
    "$HERE/actors.sbatch" "$CONFIG" "$@"); then
  if [[ -n $REJOIN ]]; then echo "submit.sh: submitting the actors failed" >&2; exit 1; fi
  echo "submit.sh: submitting the actors failed; cancelling learner job $LEARNER_JOB" >&2
  scancel "$LEARNER_JOB" || true
  exit 1
fi
ACTORS_JOB=${ACTORS_JOB%%;*}
if [[ -n $REJOIN ]]; then
  echo "streamrl: actors job $ACTORS_JOB ($NUM actors: $ACTOR_NODES node(s) x $PER_NODE, $TP GPUs each)" \
       "rejoins learner job $LEARNER_JOB"
  echo "streamrl: output in $LOGS/; follow with: tail -f $LOGS/streamrl-actors-$ACTORS_JOB.out; stop with: scancel $ACTORS_JOB"
  exit 0
fi
echo "streamrl: learner job $LEARNER_JOB ($LEARNER_NODES node(s) x $GPUS GPUs, $((LEARNER_NODES * GPUS)) ranks)," \
     "actors job $ACTORS_JOB ($NUM actors: $ACTOR_NODES node(s) x $PER_NODE, $TP GPUs each)"
echo "streamrl: output in $LOGS/; follow with: tail -f $LOGS/streamrl-learner-$LEARNER_JOB.out; stop with: scancel $LEARNER_JOB $ACTORS_JOB"
