#!/usr/bin/env bash
# The gossip freeze reproduction with default settings, repeated: three workers on a
# throwaway Redis, one frozen (SIGSTOP) for 8 s while five elections are asked for, then
# thawed. Counts actions that ran, ran twice, and were reported started.
#
#   docs/benchmarks/gossip-freeze.sh [ROUNDS] [PATH-TO-TENURE]
set -euo pipefail
rounds=${1:-20}
T=${2:-target/debug/tenure}
T=$(realpath "$T")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
work=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$work/redis.pid" --dir "$work" >/dev/null
trap 'kill "$(cat "$work/redis.pid")" 2>/dev/null; rm -rf "$work"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
R=redis://127.0.0.1:$port
ran_all=0; twice_all=0; started_all=0
for round in $(seq 1 "$rounds"); do
  d=$(mktemp -d -p "$work"); cd "$d"
  pids=()
  for w in a b c; do "$T" gossip worker --broker "$R" --group "g$round" --id "$w" >"$w.out" 2>"$w.err" & pids+=($!); done
  sleep 3
  kill -STOP "${pids[0]}"
  for i in 1 2 3 4 5; do
    ( "$T" gossip elect "p$i" --group "g$round" --action "echo \$TENURE_GOSSIP_WORKER p$i >> ran" \
        --broker "$R" --wait 20s >"e$i.out" 2>&1; echo $? >"e$i.code" ) &
  done
  sleep 8; kill -CONT "${pids[0]}"; sleep 5
  for i in 1 2 3 4 5; do while [ ! -f "e$i.code" ]; do sleep 0.2; done; done
  touch ran
  twice=$(awk '{print $2}' ran | sort | uniq -d | wc -l)
  ran=$(awk '{print $2}' ran | sort -u | wc -l)
  started=$(grep -l '^0$' e*.code | wc -l)
  ran_all=$((ran_all + ran)); twice_all=$((twice_all + twice)); started_all=$((started_all + started))
  kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true
  echo "round $round: $ran ran, $twice twice, $started reported started"
done
echo "total: $rounds rounds, $((rounds * 5)) actions: $ran_all ran, $twice_all ran twice, $started_all reported started"
