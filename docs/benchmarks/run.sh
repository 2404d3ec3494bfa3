#!/usr/bin/env bash
# Runs `tenure bench` on SQLite and on a throwaway server of every kind, one store after
# another, and writes one JSON report per store next to this script.
#   cargo build --release -p tenure-cli -p tenure-lab --bins && docs/benchmarks/run.sh [STORE…]
# With --scale first, runs only the scale and contest scenarios and writes scale-STORE.json.
# With --memory first, measures peak resident memory per election from outside the
# process (/usr/bin/time): 10,000 elections through Batched against 100, and prints a row
# per store.
set -euo pipefail
only_scale=
memory=
if [ "${1:-}" = --scale ]; then only_scale=1; shift; fi
if [ "${1:-}" = --memory ]; then memory=1; shift; fi
cd "$(dirname "$0")/../.."
bin="${CARGO_TARGET_DIR:-target}/release"
out=docs/benchmarks
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

scenarios=rtt,acquire,handover,crash,load,run
latency=(--ttl 2s --samples 200 --elections 10 --candidates 3 --duration 10s)
scale=(--ttl 10s --scenario scale,contest --scale 10000 --processes 3 --duration 20s)

# Peak RSS (KiB) of one process leading N elections through Batched for 5 s.
peak() { # STORE-URL N
  /usr/bin/time -f %M -o "$tmp/peak" "$bin/tenure" --store "$1" bench --json --ttl 10s --scenario scale-batched \
    --scale "$2" --duration 5s > "$tmp/peak.json"
  python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["scale"]["batched"]; assert b["all_won"] and b["terms_lost"] == 0, b' "$tmp/peak.json"
  cat "$tmp/peak"
}

bench() { # STORE-URL NAME [extra scenario]
  local url=$1 name=$2 extra=${3:-}
  echo "== $name" >&2
  if [ -n "$memory" ]; then
    local small large
    small=$(peak "$url" 100) || return 1
    large=$(peak "$url" 10000) || return 1
    echo "| $name | $small KiB | $large KiB | $(python3 -c "print(f'{($large - $small) / 9900:.2f}')") KiB |"
    return
  fi
  if [ -n "$only_scale" ]; then
    "$bin/tenure" --store "$url" bench --json "${scale[@]}" > "$out/scale-$name.json"
    return
  fi
  "$bin/tenure" --store "$url" bench --json "${latency[@]}" --scenario "$scenarios${extra:+,$extra}" > "$tmp/latency.json"
  "$bin/tenure" --store "$url" bench --json "${scale[@]}" > "$tmp/scale.json" || echo '{"scale": null}' > "$tmp/scale.json"
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); a.update(scale=b["scale"], contest=b.get("contest")); json.dump(a, open(sys.argv[3],"w"), indent=1)' \
    "$tmp/latency.json" "$tmp/scale.json" "$out/$name.json"
}

stores=("$@")
[ $# -eq 0 ] && stores=(sqlite postgres mariadb redis etcd nats)
for kind in "${stores[@]}"; do
  if [ "$kind" = sqlite ]; then
    bench "sqlite:$tmp/bench.db" sqlite || echo "bench on sqlite failed" >&2
    continue
  fi
  coproc SERVE { "$bin/tenure-serve" "$kind"; }
  read -r url <&"${SERVE[0]}"
  # A fresh Redis grants nothing for one TTL plus a second (its restart guard).
  if [ "$kind" = redis ]; then if [ -n "$only_scale$memory" ]; then sleep 12; else sleep 4; fi; fi
  case $kind in
    nats) url="$url/bench"; extra= ;;
    etcd) extra=etcdctl ;;
    *) extra= ;;
  esac
  # A NATS bucket serves one TTL: the scale run (10 s) gets a bucket of its own.
  if [ "$kind" = nats ] && [ -n "$only_scale$memory" ]; then
    bench "${url}10" nats || echo "bench on nats failed" >&2
  elif [ "$kind" = nats ]; then
    echo "== nats" >&2
    "$bin/tenure" --store "$url" bench --json "${latency[@]}" --scenario "$scenarios" > "$tmp/latency.json"
    "$bin/tenure" --store "${url}10" bench --json "${scale[@]}" > "$tmp/scale.json" || echo '{"scale": null}' > "$tmp/scale.json"
    python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); a.update(scale=json.load(open(sys.argv[2]))["scale"]); json.dump(a, open(sys.argv[3],"w"), indent=1)' \
      "$tmp/latency.json" "$tmp/scale.json" "$out/nats.json"
  else
    bench "$url" "$kind" "$extra" || echo "bench on $kind failed" >&2
  fi
  eval "exec ${SERVE[1]}>&-"
  wait "$SERVE_PID" 2>/dev/null || true
done
[ -n "$only_scale$memory" ] || python3 "$out/chart.py"
