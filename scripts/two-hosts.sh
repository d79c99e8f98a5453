#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a virtual Ethernet link (veth), each
# namespace a "node" with its own address, and 2 nodes x 2 ranks of the GPT launched across them as
# a cluster launches them:
#   * torchrun's multi-node rendezvous (c10d backend, the endpoint on node A's address, each node's
#     agent started in its namespace with --local-addr);
#   * mpirun from node A, starting node B's daemon without ssh: --mca plm_rsh_agent names a script
#     that runs the command in the namespace of the "host" it is given (Open MPI's TCP traffic on
#     the link: btl_tcp_if_include, oob_tcp_if_include);
# on the CPU backend (the gloo engine under torchrun, the MPI engine under mpirun) and on the
# simulated CUDA backend (its simulated NCCL under both). Every rank selects the link's interface
# with UNIHAL_SOCKET_IFNAME (prefix uh2h-veth, as NCCL_SOCKET_IFNAME); the logs must show each
# node's interface and address, and every launch's losses must equal 4 devices of one process.
# The simulated NCCL moves data through shared memory (/dev/shm is common to both namespaces); what
# crosses the link is the bootstrap: the job's store, the unique id, gloo's and MPI's traffic.
#
# Needs root (ip netns), iproute2, Open MPI, PyTorch's torchrun and a build with the mpi and gloo
# features. Fails, never skips, when any is missing.
#   scripts/two-hosts.sh BIN_DIR CUDA_SIM_LIB     (e.g. target/debug target/debug/libunihal_sim_cuda.so)
# Environment: UNIHAL_TORCHRUN (torchrun), TWO_HOSTS_OUT (reports and logs; target/two-hosts),
# TWO_HOSTS_STEPS (4).
set -euo pipefail
BIN="$(cd "${1:?usage: scripts/two-hosts.sh BIN_DIR CUDA_SIM_LIB}" && pwd)"
CUDA_SIM="$(realpath "${2:?usage: scripts/two-hosts.sh BIN_DIR CUDA_SIM_LIB}")"
TORCHRUN="${UNIHAL_TORCHRUN:-torchrun}"
OUT="${TWO_HOSTS_OUT:-target/two-hosts}"
STEPS="${TWO_HOSTS_STEPS:-4}"
command -v ip >/dev/null || { echo "two hosts: iproute2 (ip) is missing" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "two hosts: mpirun is missing (openmpi-bin)" >&2; exit 1; }
command -v "$TORCHRUN" >/dev/null || { echo "two hosts: torchrun ($TORCHRUN) is missing" >&2; exit 1; }
test -x "$BIN/gpt" || { echo "two hosts: $BIN/gpt is missing" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

NS_A=uh2h-a NS_B=uh2h-b ADDR_A=10.77.0.1 ADDR_B=10.77.0.2
cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add uh2h-veth-a type veth peer name uh2h-veth-b
ip link set uh2h-veth-a netns "$NS_A"
ip link set uh2h-veth-b netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev uh2h-veth-a
ip -n "$NS_B" addr add "$ADDR_B/24" dev uh2h-veth-b
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set uh2h-veth-a up
ip -n "$NS_B" link set uh2h-veth-b up
echo "two hosts: $NS_A (uh2h-veth-a $ADDR_A) <-> $NS_B (uh2h-veth-b $ADDR_B)"

# Open MPI's "ssh": `agent HOST COMMAND...` runs COMMAND in HOST's namespace, as that node.
AGENT="$OUT/netns-agent.sh"
cat > "$AGENT" <<EOF
#!/bin/sh
host="\$1"; shift
case "\$host" in
  $ADDR_A) ns=$NS_A node=node-a ;;
  $ADDR_B) ns=$NS_B node=node-b ;;
  *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" env UNIHAL_SIM_NODE=\$node sh -c "\$*"
EOF
chmod +x "$AGENT"

GPT_ARGS=(--steps "$STEPS" --sample 0)
COMMON=(UNIHAL_SOCKET_IFNAME=uh2h-veth UNIHAL_LOG=INFO UNIHAL_CCL_TIMEOUT=120 OMP_NUM_THREADS=1
    UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=2 UNIHAL_CUDA_LIB="$CUDA_SIM" UNIHAL_NCCL_LIB="$CUDA_SIM"
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" UNIHAL_KERNEL_CACHE="${UNIHAL_KERNEL_CACHE:-$OUT/kernel-cache}")

# Rank 0's losses against 4 devices of one process (1e-5 relative), 4 ranks in the report.
compare() {  # NAME REFERENCE
    python3 - "$OUT/$1.json" "$OUT/$2.json" "$1" <<'PY'
import json, sys
got, ref, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
assert got["ranks"] == 4, f"{name}: {got['ranks']} ranks"
g, r = [s["loss"] for s in got["steps"]], [s["loss"] for s in ref["steps"]]
assert len(g) == len(r), f"{name}: {len(g)} steps, reference {len(r)}"
for i, (a, b) in enumerate(zip(r, g)):
    assert abs(a - b) <= 1e-5 * abs(a), f"{name}: step {i}: {b}, 4 devices of one process {a}"
print(f"two hosts: {name}: {len(g)} losses equal to 4 devices of one process (last {g[-1]:.6f})")
PY
}

# Each node's ranks logged their interface and address (UNIHAL_SOCKET_IFNAME), and every rank made
# its communicator.
check_logs() {  # NAME [EXTRA-PATTERN-A EXTRA-PATTERN-B]
    local logs=("$OUT/$1".*.log)
    for want in "socket interface uh2h-veth-a address $ADDR_A" "socket interface uh2h-veth-b address $ADDR_B" \
        ${2:+"$2"} ${3:+"$3"}; do
        [ "$(grep -h "$want" "${logs[@]}" | wc -l)" -ge 2 ] \
            || { cat "${logs[@]}"; echo "two hosts: $1: fewer than 2 ranks logged '$want'" >&2; exit 1; }
    done
    for r in 0 1 2 3; do
        grep -q "\[$r\] unihal INFO COLL communicator rank $r of 4" "${logs[@]}" \
            || { cat "${logs[@]}"; echo "two hosts: $1: rank $r made no communicator" >&2; exit 1; }
    done
    echo "two hosts: $1: ranks logged their interfaces: $(grep -ho "socket interface uh2h-veth-[ab] address [0-9.]*" "${logs[@]}" | sort -u | paste -sd ';')"
}

torchrun_2x2() {  # NAME BACKEND [VAR=VALUE ...]
    local name="$1" backend="$2" pids=() port=$((29400 + RANDOM % 500)); shift 2
    for node in a b; do
        local ns="$NS_A" addr="$ADDR_A" host=true
        if [ "$node" = b ]; then ns="$NS_B" addr="$ADDR_B" host=false; fi
        ip netns exec "$ns" env "${COMMON[@]}" "$@" UNIHAL_SIM_NODE="node-$node" \
            UNIHAL_LOG_FILE="$OUT/$name.%h.%p.log" \
            "$TORCHRUN" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
            --rdzv-endpoint "$ADDR_A:$port" --rdzv-id "$name" --rdzv-conf "is_host=$host" \
            --local-addr "$addr" --no-python "$BIN/gpt" --backend "$backend" "${GPT_ARGS[@]}" \
            --json "$OUT/$name.json" > "$OUT/$name.node-$node.out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { tail -n 40 "$OUT/$name".node-*.out; echo "two hosts: $name: a node failed" >&2; exit 1; }
    done
}

mpirun_2x2() {  # NAME BACKEND [VAR=VALUE ...]
    local name="$1" backend="$2" exports=(); shift 2
    local kv
    for kv in "${COMMON[@]}" "$@" "UNIHAL_LOG_FILE=$OUT/$name.%h.%p.log"; do exports+=(-x "$kv"); done
    ip netns exec "$NS_A" env UNIHAL_SIM_NODE=node-a mpirun --allow-run-as-root --oversubscribe \
        --host "$ADDR_A:2,$ADDR_B:2" -n 4 --mca plm_rsh_agent "$AGENT" \
        --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
        "${exports[@]}" "$BIN/gpt" --backend "$backend" "${GPT_ARGS[@]}" --json "$OUT/$name.json" \
        > "$OUT/$name.out" 2>&1 \
        || { tail -n 40 "$OUT/$name.out"; echo "two hosts: $name: mpirun failed" >&2; exit 1; }
}

# The references: 4 devices of one process.
env "${COMMON[@]}" "$BIN/gpt" --backend cpu --devices 4 "${GPT_ARGS[@]}" --json "$OUT/reference-cpu.json" > "$OUT/reference-cpu.out" 2>&1
env "${COMMON[@]}" UNIHAL_SIM_DEVICES=4 "$BIN/gpt" --backend cuda --devices 4 "${GPT_ARGS[@]}" --json "$OUT/reference-cuda.json" > "$OUT/reference-cuda.out" 2>&1

torchrun_2x2 torchrun-cpu-gloo cpu UNIHAL_CPU_CCL=gloo
check_logs torchrun-cpu-gloo "TCP transport on address $ADDR_A" "TCP transport on address $ADDR_B"
compare torchrun-cpu-gloo reference-cpu

torchrun_2x2 torchrun-cuda-simulated cuda
check_logs torchrun-cuda-simulated
compare torchrun-cuda-simulated reference-cuda

mpirun_2x2 mpirun-cpu-mpi cpu UNIHAL_CPU_CCL=mpi
check_logs mpirun-cpu-mpi
compare mpirun-cpu-mpi reference-cpu

mpirun_2x2 mpirun-cuda-simulated cuda
check_logs mpirun-cuda-simulated
compare mpirun-cuda-simulated reference-cuda
# Without the selection, gloo binds the host name's address (loopback here, as on a machine whose
# host name resolves to 127.0.0.1) and the nodes cannot reach each other: the launch must fail, and
# within the collective timeout, never hang.
COMMON=("${COMMON[@]/UNIHAL_SOCKET_IFNAME=uh2h-veth/UNIHAL_SOCKET_IFNAME=}")
COMMON=("${COMMON[@]/UNIHAL_CCL_TIMEOUT=120/UNIHAL_CCL_TIMEOUT=10}")
start=$(date +%s)
if (torchrun_2x2 torchrun-cpu-gloo-no-interface cpu UNIHAL_CPU_CCL=gloo) > "$OUT/no-interface.out" 2>&1; then
    echo "two hosts: gloo across the nodes without UNIHAL_SOCKET_IFNAME succeeded: the check above proves nothing" >&2
    exit 1
fi
grep -h "TCP transport on address" "$OUT"/torchrun-cpu-gloo-no-interface.*.log | sort -u | sed 's/^/two hosts: without the selection: /' | head -n 2
echo "two hosts: without UNIHAL_SOCKET_IFNAME the gloo launch failed after $(( $(date +%s) - start )) s, as it must"
echo "two hosts: 4 launches of 2 nodes x 2 ranks passed"
