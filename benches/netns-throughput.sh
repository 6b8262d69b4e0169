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
#   fabric      the controller-managed fabric between two network-mode lab clusters (`tandem
#               lab up --network`, `tandem install --network-fabric`, `tandem peer`): iperf3
#               runs in a consumer pod's namespace against an offloaded pod, at the address
#               the consumer reports for it. Also measured: time from `tandem peer` returning
#               to the first successful request (the pods created before peering), and how
#               long a cut WAN takes to show in the gateway's status and on the virtual node.
# boringtun-cli and wireguard-go are configured with `wg` (Debian package wireguard-tools).
#
# Usage: sudo benches/netns-throughput.sh [seconds-per-run]   (default 10)
# Env: TANDEM_GATEWAY, TANDEM_CLI, BORINGTUN_CLI override binary paths; IMPLS="veth tandem"
# limits the set.
set -euo pipefail

DUR=${1:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TANDEM=${TANDEM_GATEWAY:-${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/tandem-gateway}
BORINGTUN=${BORINGTUN_CLI:-$(command -v boringtun-cli || true)}
TANDEM_CLI=${TANDEM_CLI:-${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/tandem}
WGGO=$(command -v wireguard-go || true)
IMPLS=${IMPLS:-"veth tandem boringtun wg-go fabric"}
P=tb$$
WORK=$(mktemp -d)
NS=()
PIDS=()

cleanup() {
  # The lab removes its namespaces on SIGINT, as on Ctrl-C.
  [ -n "${LAB:-}" ] && { kill -INT "$LAB" 2>/dev/null || true; wait "$LAB" 2>/dev/null || true; }
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

# The fabric: two network-mode lab clusters, rome (lab-1) consuming from milan (lab-2).
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
k() { local ctx=$1; shift; kubectl --kubeconfig "$WORK/lab/kubeconfig" --context "$ctx" "$@"; }
td() { HOME=$WORK/home "$TANDEM_CLI" "$@" --kubeconfig "$WORK/lab/kubeconfig"; }
netns_ending() { ip netns list | awk '{print $1}' | grep -E "^lab-[0-9a-f]+-$1\$" | head -1 || true; }
netunavail() {
  k lab-1 get node tandem-milan \
    -o "jsonpath={.status.conditions[?(@.type==\"NetworkUnavailable\")].$1}" 2>/dev/null
}
start_fabric() {
  mkdir -p "$WORK/home"
  HOME=$WORK/home RUST_LOG=warn "$TANDEM_CLI" lab up --network --clusters 2 --nodes 1 \
    --dir "$WORK/lab" >"$WORK/lab.log" 2>&1 &
  LAB=$!
  for _ in $(seq 600); do [ -f "$WORK/lab/kubeconfig" ] && break; sleep 0.1; done
  td install --context lab-1 --cluster-id rome --network-fabric >/dev/null 2>&1
  td install --context lab-2 --cluster-id milan --network-fabric >/dev/null 2>&1
  # Before peering: the namespace offloaded, a client pod in rome, and the server pod waiting
  # for milan's virtual node.
  k lab-1 create namespace demo >/dev/null
  td offload namespace demo --context lab-1 >/dev/null 2>&1
  k lab-1 run client --image=tandem.dev/probe \
    --overrides '{"spec":{"nodeName":"lab-1-node-1"}}' >/dev/null
  k lab-1 -n demo run server --image=tandem.dev/echo \
    --overrides '{"spec":{"nodeSelector":{"kubernetes.io/hostname":"tandem-milan"}}}' >/dev/null
  for _ in $(seq 300); do [ -n "$(netns_ending 1-default-client)" ] && break; sleep 0.1; done
  local invite t0 ip="" client
  invite=$(td invite --context lab-2 --endpoint https://198.18.2.2:6443 2>/dev/null)
  td peer "$invite" --context lab-1 >/dev/null 2>&1
  t0=$(now)
  client=$(netns_ending 1-default-client)
  # The first request, sent from the client pod's namespace as its own process would; on
  # the way, when the server pod had an address and when the tunnel was up.
  FIRST_REQUEST=timeout POD_IP_AT=timeout TUNNEL_AT=timeout
  for _ in $(seq 1200); do
    ip=$(k lab-1 -n demo get pod server -o 'jsonpath={.status.podIP}' 2>/dev/null || true)
    [ "$POD_IP_AT" = timeout ] && [ -n "$ip" ] && POD_IP_AT=$(since "$t0" "$(now)")
    [ "$TUNNEL_AT" = timeout ] && [ "$(netunavail status)" = False ] &&
      TUNNEL_AT=$(since "$t0" "$(now)")
    if [ -n "$ip" ] && nsx "$client" curl -s -m 0.5 -o /dev/null "http://$ip:8080/"; then
      FIRST_REQUEST=$(since "$t0" "$(now)"); break
    fi
    sleep 0.05
  done
  # The request can beat the virtual node's condition (it is read every second).
  for _ in $(seq 300); do
    [ "$TUNNEL_AT" != timeout ] && break
    [ "$(netunavail status)" = False ] && TUNNEL_AT=$(since "$t0" "$(now)")
    sleep 0.05
  done
  TARGET=$ip
  CLIENT_NS=$client
  SERVER_NS=$(netns_ending 2-demo-rome-server)
  # Each gateway and the sandbox relay above it (which uses no CPU to speak of).
  GW_a=$(pgrep -f '^tandem gateway --peer milan' | xargs)
  GW_b=$(pgrep -f '^tandem gateway --peer rome' | xargs)
}

# How long a cut WAN (all UDP between the clusters dropped) takes to show in rome's gateway
# status and as NetworkUnavailable=True on the virtual node, and how long recovery takes.
measure_failure() {
  local wan gwns status t0 gw_at="" node_at="" back="" state
  wan=$(netns_ending wan)
  gwns=$(ip netns identify "${GW_a%% *}")
  # The gateway's status API: its node's address and the gateway's port.
  status=$(k lab-1 -n tandem-system get pods -l app.kubernetes.io/name=tandem-gateway \
    -o 'jsonpath={.items[0].status.hostIP}'):$(k lab-1 -n tandem-system get service \
    tandem-gateway-milan -o 'jsonpath={.spec.ports[0].port}')
  printf 'table inet tandem_bench_cut {\n chain forward {\n  type filter hook forward priority -300; policy accept;\n  meta l4proto udp drop\n }\n}\n' |
    nsx "$wan" nft -f -
  t0=$(now)
  for _ in $(seq 600); do
    state=$(nsx "$gwns" curl -s -m 0.5 "http://$status/status" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null || echo unreachable)
    [ -z "$gw_at" ] && [ "$state" != connected ] && gw_at=$(since "$t0" "$(now)")
    [ -z "$node_at" ] && [ "$(netunavail status)" = True ] && node_at=$(since "$t0" "$(now)")
    [ -n "$gw_at" ] && [ -n "$node_at" ] && break
    sleep 0.05
  done
  nsx "$wan" nft delete table inet tandem_bench_cut
  t0=$(now)
  for _ in $(seq 600); do
    [ "$(netunavail status)" = False ] && { back=$(since "$t0" "$(now)"); break; }
    sleep 0.05
  done
  echo
  echo "fabric: after \`tandem peer\` returned: server pod address known ${POD_IP_AT} s, virtual node NetworkUnavailable=False ${TUNNEL_AT} s, first request answered ${FIRST_REQUEST} s"
  echo "fabric: WAN cut -> gateway status not connected: ${gw_at:-timeout} s; -> NetworkUnavailable=True: ${node_at:-timeout} s"
  echo "fabric: WAN restored -> NetworkUnavailable=False: ${back:-timeout} s"
}
stop_fabric() { kill -INT "$LAB"; wait "$LAB" 2>/dev/null || true; LAB=; }

cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
proc_ticks() { local t=0; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

# run IMPL STREAMS -> prints a table row
measure() {
  local impl=$1 streams=$2 busy0 total0 busy1 total1 g0 g1 gbps pids=""
  [ "$impl" != veth ] && pids="$GW_a $GW_b"
  ip netns exec "$SERVER_NS" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  read -r busy0 total0 < <(cpu_ticks); g0=$(proc_ticks $pids)
  nsx "$CLIENT_NS" iperf3 -c "$TARGET" -p 5201 -t "$DUR" -P "$streams" -J > "$WORK/iperf.json" || true
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
  CLIENT_NS=${P}ap SERVER_NS=${P}bp TARGET=10.0.1.10
  case $impl in
    fabric) [ -x "$TANDEM_CLI" ] || { echo "| fabric | - | missing $TANDEM_CLI | | |"; continue; }; start_fabric ;;
    veth) start_veth ;;
    tandem) [ -x "$TANDEM" ] || { echo "| tandem | - | missing $TANDEM | | |"; continue; }; start_tandem ;;
    boringtun) [ -n "$BORINGTUN" ] || { echo "| boringtun | - | boringtun-cli missing | | |"; continue; }; start_uapi boringtun ;;
    wg-go) [ -n "$WGGO" ] || { echo "| wg-go | - | wireguard-go missing | | |"; continue; }; start_uapi wg-go ;;
  esac
  # Wait until the path works (handshake done).
  for _ in $(seq 50); do nsx "$CLIENT_NS" ping -c1 -W0.2 "$TARGET" >/dev/null 2>&1 && break; done
  measure "$impl" 1
  measure "$impl" 4
  case $impl in
    fabric) FAILURE=$(measure_failure); stop_fabric ;;
    veth) stop_veth ;;
    tandem) stop_tandem ;;
    *) stop_uapi ;;
  esac
done
if [ -n "${FAILURE:-}" ]; then echo "$FAILURE"; fi
