#!/usr/bin/env bash
# Pod-to-pod iperf3 TCP throughput through the data plane, in network namespaces (root).
#
# Topology (as in crates/net/tests/netns): per cluster a pod namespace behind a node bridge,
# the node behind a gateway namespace; a veth "WAN" between the two gateways. Both clusters
# use pod CIDR 10.244.0.0/16, so every run goes through the same double prefix NAT:
# A names B's pods 10.0.0.0/16, B names A's pods 10.128.0.0/16.
#
# Data planes compared on the same topology in the same run:
#   veth        no tunnel: gateways route over the WAN veth, same nftables NAT
#   tandem      tandem-gateway (this repo, release build)
#   boringtun   boringtun-cli from crates.io (cargo install boringtun-cli)
#   wg-go       wireguard-go from Debian
# boringtun-cli and wireguard-go are configured with `wg` (Debian package wireguard-tools).
#
# Usage: sudo benches/netns-throughput.sh [seconds-per-run]   (default 10)
# Env: TANDEM_GATEWAY, BORINGTUN_CLI override binary paths; IMPLS="veth tandem" limits the set.
set -euo pipefail

DUR=${1:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TANDEM=${TANDEM_GATEWAY:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tandem-gateway}
BORINGTUN=${BORINGTUN_CLI:-$(command -v boringtun-cli || true)}
WGGO=$(command -v wireguard-go || true)
IMPLS=${IMPLS:-"veth tandem boringtun wg-go"}
P=tb$$
WORK=$(mktemp -d)
NS=()
PIDS=()

cleanup() {
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  sleep 0.3
  for ns in "${NS[@]:-}"; do [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

nsx() { ip netns exec "$@"; }
addns() { ip netns add "$1"; NS+=("$1"); ip -n "$1" link set lo up; }

build_topology() {
  for c in a b; do
    local gw=${P}${c}g node=${P}${c}n pod=${P}${c}p
    addns "$gw"; addns "$node"; addns "$pod"
    ip -n "$gw" link add n1 type veth peer name eth0 netns "$node"
    ip -n "$gw" addr add 172.16.0.1/24 dev n1; ip -n "$gw" link set n1 up
    ip -n "$node" addr add 172.16.0.11/24 dev eth0; ip -n "$node" link set eth0 up
    ip -n "$node" link add cbr0 type bridge
    ip -n "$node" addr add 10.244.1.1/24 dev cbr0; ip -n "$node" link set cbr0 up
    ip -n "$node" route add default via 172.16.0.1
    ip -n "$node" link add veth1 type veth peer name eth0 netns "$pod"
    ip -n "$node" link set veth1 master cbr0 up
    ip -n "$pod" addr add 10.244.1.10/24 dev eth0; ip -n "$pod" link set eth0 up
    ip -n "$pod" route add default via 10.244.1.1
    ip -n "$gw" route add 10.244.1.0/24 via 172.16.0.11
    for ns in "$gw" "$node"; do nsx "$ns" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'; done
  done
  ip -n ${P}ag link add wan0 type veth peer name wan0 netns ${P}bg
  ip -n ${P}ag addr add 192.0.2.1/24 dev wan0; ip -n ${P}ag link set wan0 up
  ip -n ${P}bg addr add 192.0.2.2/24 dev wan0; ip -n ${P}bg link set wan0 up
}

# The NAT a gateway applies on interface $2 (what tandem-gateway renders), for side $1.
nat_rules() {
  local side=$1 ifc=$2 mine peers
  if [ "$side" = a ]; then mine=10.128.0.0/16; peers=10.0.0.0/16; else mine=10.0.0.0/16; peers=10.128.0.0/16; fi
  cat <<EOF
table inet bench {
  chain nat_in { type nat hook prerouting priority -100; policy accept;
    iifname "$ifc" ip daddr $mine dnat ip prefix to 10.244.0.0/16
  }
  chain nat_out { type nat hook postrouting priority 100; policy accept;
    oifname "$ifc" ip saddr 10.244.0.0/16 snat ip prefix to $mine
  }
  chain mss_clamp { type filter hook forward priority -150; policy accept;
    oifname "$ifc" tcp flags syn / syn,rst tcp option maxseg size set rt mtu
  }
}
EOF
}
peer_prefix() { [ "$1" = a ] && echo 10.0.0.0/16 || echo 10.128.0.0/16; }
other() { [ "$1" = a ] && echo b || echo a; }
wan_ip() { [ "$1" = a ] && echo 192.0.2.1 || echo 192.0.2.2; }

start_veth() {
  for c in a b; do
    nat_rules $c wan0 | nsx ${P}${c}g nft -f -
    ip -n ${P}${c}g route add "$(peer_prefix $c)" via "$(wan_ip "$(other $c)")"
  done
}
stop_veth() {
  for c in a b; do
    nsx ${P}${c}g nft delete table inet bench
    ip -n ${P}${c}g route del "$(peer_prefix $c)"
  done
}

start_tandem() {
  local ka kb
  ka=$("$TANDEM" genkey); kb=$("$TANDEM" genkey)
  for c in a b; do
    local me peer us them
    if [ $c = a ]; then me=$ka; peer=$kb; us="10.128 10.129"; them="10.0 10.1"
    else me=$kb; peer=$ka; us="10.0 10.1"; them="10.128 10.129"; fi
    set -- $us $them
    cat > "$WORK/$c.json" <<EOF
{"interface":"tandem0","listen":"0.0.0.0:51820","privateKey":"$me",
 "peerPublicKey":"$("$TANDEM" pubkey "$peer")","peerEndpoint":"$(wan_ip "$(other $c)"):51820",
 "nat":{"local":{"podCidr":"10.244.0.0/16","externalCidr":"10.70.0.0/16"},
        "localAsSeenByPeer":{"podCidr":"$1.0.0/16","externalCidr":"$2.0.0/16"},
        "peerAsSeenLocally":{"podCidr":"$3.0.0/16","externalCidr":"$4.0.0/16"}},
 "statusListen":"127.0.0.1:9100"}
EOF
    RUST_LOG=${RUST_LOG:-warn} ip netns exec ${P}${c}g "$TANDEM" "$WORK/$c.json" 2>"${GW_LOG_DIR:-$WORK}/$c.log" &
    PIDS+=($!); eval "GW_$c=$!"
  done
}
stop_tandem() { kill "$GW_a" "$GW_b"; wait "$GW_a" "$GW_b" 2>/dev/null || true; }

# boringtun-cli and wireguard-go: same UAPI, configured with `wg`.
start_uapi() {
  local impl=$1
  for c in a b; do (umask 077; wg genkey > "$WORK/$c.key"); done
  for c in a b; do
    local ifc=wg${c}0 o
    o=$(other $c)
    rm -f /var/run/wireguard/$ifc.sock
    if [ "$impl" = boringtun ]; then
      WG_LOG_LEVEL=error ip netns exec ${P}${c}g "$BORINGTUN" --foreground --disable-drop-privileges "$ifc" >"$WORK/$c.log" 2>&1 &
    else
      LOG_LEVEL=error WG_PROCESS_FOREGROUND=1 ip netns exec ${P}${c}g "$WGGO" -f "$ifc" >"$WORK/$c.log" 2>&1 &
    fi
    PIDS+=($!); eval "GW_$c=$!"
    for _ in $(seq 50); do [ -S /var/run/wireguard/$ifc.sock ] && break; sleep 0.1; done
    nsx ${P}${c}g wg set "$ifc" private-key "$WORK/$c.key" listen-port 51820 \
      peer "$(wg pubkey < "$WORK/$o.key")" endpoint "$(wan_ip "$o"):51820" \
      allowed-ips "$(peer_prefix $c)" persistent-keepalive 25
    ip -n ${P}${c}g link set "$ifc" mtu 1420 up
    ip -n ${P}${c}g route add "$(peer_prefix $c)" dev "$ifc"
    nat_rules $c "$ifc" | nsx ${P}${c}g nft -f -
  done
}
stop_uapi() {
  kill "$GW_a" "$GW_b"; wait "$GW_a" "$GW_b" 2>/dev/null || true
  for c in a b; do nsx ${P}${c}g nft delete table inet bench 2>/dev/null || true; done
}

cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
proc_ticks() { local t=0; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

# run IMPL STREAMS -> prints a table row
measure() {
  local impl=$1 streams=$2 busy0 total0 busy1 total1 g0 g1 gbps pids=""
  [ "$impl" != veth ] && pids="$GW_a $GW_b"
  ip netns exec ${P}bp iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  read -r busy0 total0 < <(cpu_ticks); g0=$(proc_ticks $pids)
  nsx ${P}ap iperf3 -c 10.0.1.10 -p 5201 -t "$DUR" -P "$streams" -J > "$WORK/iperf.json" || true
  read -r busy1 total1 < <(cpu_ticks); g1=$(proc_ticks $pids)
  wait $srv 2>/dev/null || true
  gbps=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.2f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))' "$WORK/iperf.json" 2>/dev/null || echo "fail")
  local hz ncpu
  hz=$(getconf CLK_TCK); ncpu=$(nproc)
  local sys_cores gw_cores
  sys_cores=$(python3 -c "print('%.2f' % ((${busy1}-${busy0})/max(1,(${total1}-${total0}))*${ncpu}))")
  if [ -n "$pids" ]; then gw_cores=$(python3 -c "print('%.2f' % ((${g1}-${g0})/${hz}/${DUR}))"); else gw_cores="-"; fi
  printf '| %-10s | %d | %8s | %6s | %6s |\n' "$impl" "$streams" "$gbps" "$gw_cores" "$sys_cores"
}

command -v iperf3 >/dev/null || { echo "iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
build_topology
echo "| data plane | streams | Gbit/s | gateway CPU (cores, both) | system CPU (cores of $(nproc)) |"
echo "|---|---|---|---|---|"
for impl in $IMPLS; do
  case $impl in
    veth) start_veth ;;
    tandem) [ -x "$TANDEM" ] || { echo "| tandem | - | missing $TANDEM | | |"; continue; }; start_tandem ;;
    boringtun) [ -n "$BORINGTUN" ] || { echo "| boringtun | - | boringtun-cli missing | | |"; continue; }; start_uapi boringtun ;;
    wg-go) [ -n "$WGGO" ] || { echo "| wg-go | - | wireguard-go missing | | |"; continue; }; start_uapi wg-go ;;
  esac
  # Wait until the path works (handshake done).
  for _ in $(seq 50); do nsx ${P}ap ping -c1 -W0.2 10.0.1.10 >/dev/null 2>&1 && break; done
  measure "$impl" 1
  measure "$impl" 4
  case $impl in
    veth) stop_veth ;;
    tandem) stop_tandem ;;
    *) stop_uapi ;;
  esac
done
