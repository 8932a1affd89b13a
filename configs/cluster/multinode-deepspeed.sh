#!/bin/bash
# A learner over several nodes with the deepspeed launcher (a hostfile lists "host slots=8").
# Rank 0 (first host) speaks ZeroMQ; set transport.host to an address actors can reach.
#   bash configs/cluster/multinode-deepspeed.sh hostfile configs/cluster/async-8b.yaml
set -euo pipefail
HOSTFILE=${1:?usage: multinode-deepspeed.sh HOSTFILE CONFIG [key=value ...]}
CONFIG=${2:?usage: multinode-deepspeed.sh HOSTFILE CONFIG [key=value ...]}
shift 2
# learner.batch_groups must divide by the total number of ranks (nodes × 8).
# --no_local_rank: ranks read LOCAL_RANK from the environment (the CLI takes no leading --local_rank).
exec deepspeed --hostfile "$HOSTFILE" --master_port 29500 --no_local_rank --module streamrl learner "$CONFIG" "$@"
