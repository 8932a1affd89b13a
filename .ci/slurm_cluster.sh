#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine (Debian's slurm-wlm and munge), for
# tests/integration/test_slurm_real.py: munged, slurmctld and slurmd started by hand, as root,
# without systemd or cgroups (a container has neither).
#   .ci/slurm_cluster.sh start   install what is missing, write the config, start what is not running,
#                                and wait until the node takes jobs (run it again: it changes nothing)
#   .ci/slurm_cluster.sh stop    stop the three daemons
#   .ci/slurm_cluster.sh status  what sinfo says
# The node is this machine with its own CPUs and memory (`slurmd -C`), plus SLURM_CI_GPUS (2)
# `gpu` resources whose device files are links to /dev/null (Slurm wants a device file per GPU;
# nothing opens them), so configs/cluster/*.sbatch and their --gpus-per-node are scheduled, and
# CUDA_VISIBLE_DEVICES set, as on a GPU cluster while CPU torch does the work. Memory is not a
# scheduled resource (CR_CPU), and up to 4 jobs may share a CPU (OverSubscribe=FORCE:4), so a
# 1-CPU machine still runs a learner job and an actor job side by side. The scripts ask for whole
# nodes (#SBATCH --exclusive), which a one-node cluster cannot give two jobs at once: submit with
# SBATCH_EXCLUSIVE=oversubscribe in the environment (it overrides #SBATCH lines; docs/guides/cluster.md).
# Refuses to touch an /etc/slurm/slurm.conf it did not write (a machine with a real Slurm).
set -euo pipefail
CONF=/etc/slurm/slurm.conf
MARK="# written by streamrl .ci/slurm_cluster.sh"
GPUS=${SLURM_CI_GPUS:-2}
LOGDIR=/var/log/slurm
DEVICES=/var/lib/slurm-ci  # the GPUs' stand-in device files

say() { echo "slurm_cluster: $*" >&2; }
running() { [[ -s $1 ]] && kill -0 "$(<"$1")" 2>/dev/null; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return
  say "installing slurm-wlm (apt)"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
}

write_config() {
  if [[ -e $CONF ]] && ! grep -qxF "$MARK" "$CONF"; then
    say "$CONF exists and was not written by this script; leaving this machine's Slurm alone"
    exit 1
  fi
  local node host
  node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
  host=${node#NodeName=}
  host=${host%% *}
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR" "$DEVICES"
  local gres="$MARK" i
  for ((i = 0; i < GPUS; i++)); do
    ln -sfn /dev/null "$DEVICES/gpu$i"
    gres+=$'\n'"NodeName=$host Name=gpu File=$DEVICES/gpu$i"
  done
  cat > "$CONF.new" <<EOF
$MARK
ClusterName=streamrl-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
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
$node Gres=gpu:$GPUS State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  echo "$gres" > /etc/slurm/gres.conf.new
  CHANGED=0
  cmp -s "$CONF.new" "$CONF" || CHANGED=1
  cmp -s /etc/slurm/gres.conf.new /etc/slurm/gres.conf || CHANGED=1
  mv "$CONF.new" "$CONF"
  mv /etc/slurm/gres.conf.new /etc/slurm/gres.conf
}

start() {
  install
  write_config
  if ! running /run/munge/munged.pid; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
    [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create
    runuser -u munge -- munged
  fi
  if (( CHANGED )) && { running /run/slurmctld.pid || running /run/slurmd.pid; }; then
    say "config changed: restarting the daemons"
    stop
  fi
  running /run/slurmctld.pid || slurmctld
  running /run/slurmd.pid || slurmd
  local host
  host=$(sed -n 's/^SlurmctldHost=//p' "$CONF")
  for _ in $(seq 60); do  # the node registers, then takes jobs (ReturnToService=2 brings back a DOWN one)
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
    case $state in
      idle|mixed|allocated|completing) say "node $host is $state"; return 0 ;;
      down*|drain*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  say "node $host never took jobs (state '${state:-no answer}'); see $LOGDIR/"
  tail -n 20 "$LOGDIR/slurmctld.log" "$LOGDIR/slurmd.log" >&2 || true
  exit 1
}

stop_one() {  # pid file: TERM, then wait for the daemon to go
  running "$1" || return 0
  local pid
  pid=$(<"$1")
  kill "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  say "pid $pid ($1) did not stop"
  return 1
}

stop() {
  stop_one /run/slurmd.pid
  stop_one /run/slurmctld.pid
}

case ${1:-} in
  start|stop) (( EUID == 0 )) || { say "$1: run as root (the daemons run as root here)"; exit 1; } ;;&
  start) start ;;
  stop) stop; stop_one /run/munge/munged.pid ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
