#!/bin/bash
# A learner over several nodes with the deepspeed launcher instead of torchrun, inside a Slurm
# allocation and without ssh or pdsh: srun starts one `deepspeed --no_ssh` per node (its node rank
# from SLURM_NODEID, so global rank 0, which speaks ZeroMQ, is on the allocation's first node),
# and each starts one process per GPU. Needs DeepSpeed >= 0.14.5 (--no_ssh).
#   salloc --nodes 2 --ntasks-per-node 1 --gpus-per-node 8 --cpus-per-task 32 --mem 0 --exclusive \
#       bash configs/cluster/multinode-deepspeed.sh configs/cluster/async-8b.yaml [key=value ...]
# or as the body of an sbatch script. Like learner.sbatch, rank 0's node writes its host name to
# $STREAMRL_LOGS/learner-host.<job id> for the actors (LEARNER_JOB=<job id> actors.sbatch).
# learner.batch_groups must divide by the total number of ranks (nodes x GPUs per node).
set -euo pipefail
CONFIG=${1:?usage: multinode-deepspeed.sh CONFIG [key=value ...]  (inside salloc or sbatch)}
shift
if [[ -z ${SLURM_JOB_ID:-} || -z ${SLURM_JOB_NODELIST:-} ]]; then
  echo "multinode-deepspeed.sh: run it inside a Slurm allocation (salloc or sbatch); without Slurm," \
       "the deepspeed launcher's own multi-node mode needs a hostfile and passwordless ssh (pdsh)" >&2
  exit 2
fi
LOGS=${STREAMRL_LOGS:-logs}
mkdir -p "$LOGS"
STREAMRL_GPUS=${SLURM_GPUS_ON_NODE:-8}
STREAMRL_HOST_FILE="$LOGS/learner-host.$SLURM_JOB_ID"
STREAMRL_HOSTFILE="$LOGS/hostfile.$SLURM_JOB_ID"  # the launcher's world: every node, GPUs per node
STREAMRL_MASTER_PORT=${STREAMRL_MASTER_PORT:-29500}
scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/ slots=$STREAMRL_GPUS/" > "$STREAMRL_HOSTFILE"
STREAMRL_HEAD=$(head -n 1 "$STREAMRL_HOSTFILE" | cut -d' ' -f1)
[[ -n $STREAMRL_HEAD ]] || { echo "multinode-deepspeed.sh: no node in SLURM_JOB_NODELIST" >&2; exit 1; }
NODES=$(wc -l < "$STREAMRL_HOSTFILE")
export STREAMRL_GPUS STREAMRL_HOST_FILE STREAMRL_HOSTFILE STREAMRL_MASTER_PORT STREAMRL_HEAD
trap 'rm -f "$STREAMRL_HOST_FILE"' EXIT
echo "streamrl learner (deepspeed launcher): $NODES node(s) x $STREAMRL_GPUS GPUs; rank 0 on $STREAMRL_HEAD"

# --no_local_rank: ranks read LOCAL_RANK from the environment (the CLI takes no leading --local_rank).
srun --nodes="$NODES" --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}" --mem=0 \
     --kill-on-bad-exit=1 bash -c '
  if [ "$SLURM_NODEID" = 0 ]; then
    hostname > "$STREAMRL_HOST_FILE.tmp" && mv "$STREAMRL_HOST_FILE.tmp" "$STREAMRL_HOST_FILE"
  fi
  exec deepspeed --hostfile "$STREAMRL_HOSTFILE" --no_ssh --node_rank "$SLURM_NODEID" \
      --master_addr "$STREAMRL_HEAD" --master_port "$STREAMRL_MASTER_PORT" --no_local_rank --module streamrl learner "$@"
' streamrl-learner "$CONFIG" "$@"
