#!/usr/bin/env bash
# Slurm across the simulated cluster (.ci/netns_cluster.sh, root only): Debian's slurm-wlm with slurmctld on node 0
# (the learner's) and one slurmd on every node, each in its node's network namespace and in a UTS namespace of its
# own whose host name is the node's (${P}n0, ${P}n1, ...), so a job's `hostname` is its node's, as on a cluster.
# One slurmd per node on one host works without Slurm's --enable-multiple-slurmd build: every slurmd has its own
# network namespace (its own address, the same port 6818), its own host name (so it finds its NodeName itself) and
# its own spool, log and pid file (%n in slurm.conf). Names resolve on every node through /etc/netns/<node>/hosts,
# which `ip netns exec` mounts over /etc/hosts. Authentication is auth/none and cred/none (the plugins Debian
# ships): one host, one root, nothing to authenticate, and no munged to share. The config is its own (SLURM_CONF):
# the machine's /etc/slurm (.ci/slurm_cluster.sh's one-node cluster) is left alone.
#
#   .ci/netns_slurm.sh start     the nodes (netns_cluster.sh start N), the config, the daemons; waits until all
#                                nodes take jobs. Prints the SLURM_CONF to use on the nodes.
#   .ci/netns_slurm.sh stop      the daemons, the config and the nodes
#
# P=${STREAMRL_NETNS_PREFIX:-srl}, N=${STREAMRL_SLURM_NODES:-3}; each node has the host's CPUs (`slurmd -C`) and
# SLURM_CI_GPUS (1) `gpu` resources whose device files are links to /dev/null (configs/cluster/*.sbatch ask for
# --gpus-per-node). Submit from a node: .ci/netns_cluster.sh exec 0 env SLURM_CONF=... configs/cluster/submit.sh ...
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
P=${STREAMRL_NETNS_PREFIX:-srl}
SUBNET=${STREAMRL_NETNS_SUBNET:-10.77.0}
N=${STREAMRL_SLURM_NODES:-3}
GPUS=${SLURM_CI_GPUS:-1}
DIR=/run/streamrl-slurm-$P  # config, state, spools, logs, stand-in devices
export SLURM_CONF=$DIR/slurm.conf
export STREAMRL_NETNS_PREFIX=$P STREAMRL_NETNS_SUBNET=$SUBNET

say() { echo "netns_slurm: $*" >&2; }

on() {  # on NODE CMD...: CMD on the node: its network, host name and /etc/hosts (the namespaces `start` made)
  local node=$1
  shift
  nsenter --target "$(<"$DIR/node-$node.pid")" --net --uts --mount "$@"
}

write_config() {
  local cpus i hosts="127.0.0.1 localhost"$'\n'
  cpus=$(slurmd -C | head -n 1 | grep -o 'CPUs=[0-9]*')
  mkdir -p "$DIR/state" "$DIR/dev"
  for ((i = 0; i < N; i++)); do mkdir -p "$DIR/spool-${P}n$i"; done
  for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/dev/gpu$i"; done
  cat > "$SLURM_CONF" <<EOF
# written by streamrl .ci/netns_slurm.sh
ClusterName=streamrl-netns
SlurmctldHost=${P}n0(${SUBNET}.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
ReturnToService=2
KillWait=10
GresTypes=gpu
EOF
  : > "$DIR/gres.conf"
  for ((i = 0; i < N; i++)); do
    echo "NodeName=${P}n$i NodeAddr=${SUBNET}.$((i + 1)) $cpus Gres=gpu:$GPUS State=UNKNOWN" >> "$SLURM_CONF"
    for ((g = 0; g < GPUS; g++)); do echo "NodeName=${P}n$i Name=gpu File=$DIR/dev/gpu$g" >> "$DIR/gres.conf"; done
    hosts+="${SUBNET}.$((i + 1)) ${P}n$i"$'\n'
  done
  echo "PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$SLURM_CONF"
  for ((i = 0; i < N; i++)); do
    mkdir -p "/etc/netns/${P}n$i"
    printf '%s' "$hosts" > "/etc/netns/${P}n$i/hosts"
  done
}

start() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || {
    say "installing slurm-wlm (apt)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm >/dev/null
  }
  stop
  "$HERE/netns_cluster.sh" start "$N" >&2
  mkdir -p "$DIR"
  write_config
  local i
  # A process that holds each node's namespaces: its network (netns_cluster.sh's), its host name (UTS) and a mount
  # namespace where the node's hosts file is /etc/hosts (not `ip netns exec`, whose fresh /sys lacks the cgroup file
  # systems slurmd 22.05 insists on even with proctrack/linuxproc: "No filesystem mounted on /sys/fs/cgroup").
  for ((i = 0; i < N; i++)); do
    nsenter --net="/run/netns/${P}n$i" unshare --uts --mount --propagation private sh -c \
      "hostname ${P}n$i && mount --bind /etc/netns/${P}n$i/hosts /etc/hosts && echo \$\$ > $DIR/node-$i.pid && exec sleep infinity" \
      </dev/null >/dev/null 2>&1 &
  done
  for ((i = 0; i < N; i++)); do
    for _ in $(seq 50); do [[ -s $DIR/node-$i.pid ]] && break; sleep 0.1; done
    [[ -s $DIR/node-$i.pid ]] || { say "node $i: its namespaces were not made (nsenter/unshare)"; exit 1; }
  done
  # The daemons fork away: their own output to a file, never to the caller's pipes (which would then stay open).
  daemon() { on "$@" </dev/null >>"$DIR/daemons.out" 2>&1 || { say "$2 on node $1 failed:"; tail -n 20 "$DIR"/*.log \
    "$DIR/daemons.out" >&2 || true; exit 1; }; }
  daemon 0 slurmctld
  for ((i = 0; i < N; i++)); do daemon "$i" slurmd; done
  local state
  for _ in $(seq 90); do
    state=$(on 0 sinfo -h -o '%n %T' 2>/dev/null || true)
    if [[ $(grep -cE ' (idle|mixed|allocated)$' <<< "$state") == "$N" ]]; then
      say "$N nodes take jobs; SLURM_CONF=$SLURM_CONF"
      echo "$SLURM_CONF"
      return 0
    fi
    for node in $(awk '$2 ~ /^(down|drain)/ {print $1}' <<< "$state"); do
      on 0 scontrol update nodename="$node" state=resume 2>/dev/null || true
    done
    sleep 1
  done
  say "the nodes never all took jobs: ${state:-no answer from slurmctld}; see $DIR/*.log"
  tail -n 20 "$DIR"/*.log >&2 || true
  exit 1
}

stop() {
  # The daemons and every job live in the nodes' namespaces: removing the nodes (netns_cluster.sh stop) kills them.
  "$HERE/netns_cluster.sh" stop
  rm -rf "$DIR"
  local d
  for d in /etc/netns/"${P}"n[0-9]*; do [[ -d $d ]] && rm -rf "$d"; done
  return 0
}

(( EUID == 0 )) || { say "run as root (network namespaces, the daemons)"; exit 1; }
case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
