#!/usr/bin/env bash
# A simulated cluster on one machine (root only): N network namespaces ("nodes") on a bridge, each with its own
# address in a private range that exists only inside them, every link shaped with tc tbf (1 Gbit/s by default,
# both ways). Used by tests/integration/test_cluster.py and `streamrl bench delta` (docs/guides/cluster.md).
#
#   .ci/netns_cluster.sh start [N]          nodes ${P}n0..n{N-1} at ${SUBNET}.1.., bridge ${P}br (default N=3)
#   .ci/netns_cluster.sh exec NODE CMD...   run CMD on node NODE (0, 1, ...)
#   .ci/netns_cluster.sh link NODE up|down  plug or unplug a node's cable (its end on the bridge)
#   .ci/netns_cluster.sh rate NODE RATE     reshape a node's link, both ways (e.g. 10mbit)
#   .ci/netns_cluster.sh loss NODE PCT      drop PCT% of a node's packets, each way (nftables' numgen; 0: none)
#   .ci/netns_cluster.sh kill NODE          SIGKILL every process on a node
#   .ci/netns_cluster.sh stop               remove all of it (also what `start` does first)
#
# P=${STREAMRL_NETNS_PREFIX:-srl}, SUBNET=${STREAMRL_NETNS_SUBNET:-10.77.0}, RATE=${STREAMRL_NETNS_RATE:-1gbit}.
set -euo pipefail
P=${STREAMRL_NETNS_PREFIX:-srl}
SUBNET=${STREAMRL_NETNS_SUBNET:-10.77.0}
RATE=${STREAMRL_NETNS_RATE:-1gbit}

shape() {  # shape NODE RATE: tbf on both ends of the node's cable (what leaves the node, what reaches it)
  local burst=64kb
  [[ $2 == *gbit ]] && burst=512kb  # tbf needs at least rate / HZ of burst
  ip netns exec "${P}n$1" tc qdisc replace dev eth0 root tbf rate "$2" burst "$burst" latency 100ms
  tc qdisc replace dev "${P}v$1" root tbf rate "$2" burst "$burst" latency 100ms
}

stop() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^${P}n[0-9]*$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${P}(v[0-9]+|br)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
}

case "${1:-}" in
  start)
    n=${2:-3}
    stop
    ip link add "${P}br" type bridge
    ip link set "${P}br" up
    for i in $(seq 0 $((n - 1))); do
      ip netns add "${P}n$i"
      ip link add "${P}v$i" type veth peer name eth0 netns "${P}n$i"
      ip link set "${P}v$i" master "${P}br" up
      ip netns exec "${P}n$i" ip link set lo up
      ip netns exec "${P}n$i" ip addr add "${SUBNET}.$((i + 1))/24" dev eth0
      ip netns exec "${P}n$i" ip link set eth0 up
      shape "$i" "$RATE"
    done
    echo "netns cluster: $n nodes ${P}n0..${P}n$((n - 1)) at ${SUBNET}.1..${SUBNET}.$n on ${P}br, links $RATE"
    ;;
  exec) node=$2; shift 2; exec ip netns exec "${P}n$node" "$@" ;;
  link) ip link set "${P}v$2" "$3" ;;
  rate) shape "$2" "$3" ;;
  loss)
    command -v nft >/dev/null || { apt-get install -y -q nftables >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q nftables >/dev/null; } || { echo "nftables missing" >&2; exit 3; }; }
    ip netns exec "${P}n$2" nft delete table inet streamrl_loss 2>/dev/null || true
    if [[ $3 != 0 ]]; then
      ip netns exec "${P}n$2" nft add table inet streamrl_loss
      ip netns exec "${P}n$2" nft add chain inet streamrl_loss input '{ type filter hook input priority 0; }'
      ip netns exec "${P}n$2" nft add rule inet streamrl_loss input numgen random mod 100 "<" "$3" drop
      ip netns exec "${P}n$2" nft add chain inet streamrl_loss output '{ type filter hook output priority 0; }'
      ip netns exec "${P}n$2" nft add rule inet streamrl_loss output numgen random mod 100 "<" "$3" drop
    fi
    ;;
  kill) for pid in $(ip netns pids "${P}n$2"); do kill -9 "$pid" 2>/dev/null || true; done ;;
  stop) stop ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
