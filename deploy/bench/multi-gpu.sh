#!/usr/bin/env bash
# The multi-GPU measurement (issue #17): one walk-forward study of 20+ windows trained on one GPU
# (--devices 0) and on every GPU of the host (--devices all), on the same machine in one command,
# with nvidia-smi sampling each device's utilization; prints wall times, the speed-up against
# linear, mean utilization per device, and whether every window's results equal the one-GPU
# run's. Run it from the repository root of a checkout with release binaries:
#
#   FOXHUNT=target/release/foxhunt XTASK=target/xtask/release/xtask deploy/bench/multi-gpu.sh [OUT]
#
# The study: one synthetic ES year (`xtask synth --years 1 --daily`, made once under OUT/data),
# week windows (train 4, validation 1, test 1, step 2: 24 windows), 5 epochs of 200 steps.
set -uo pipefail
FOXHUNT=${FOXHUNT:-target/release/foxhunt}
XTASK=${XTASK:-target/xtask/release/xtask}
OUT=${1:-target/multi-gpu}
# NVLink multicast stays off on the lent multi-GPU machines.
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
N=$(nvidia-smi --list-gpus | wc -l)
echo "$(date -u +%FT%TZ) $N GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)" | tee "$OUT/summary.txt"
DATA=$OUT/data
if [ ! -d "$DATA" ]; then
    "$XTASK" synth --years 1 --daily --out "$DATA" > "$OUT/synth.log" 2>&1 || { cat "$OUT/synth.log"; exit 1; }
fi
FLAGS=(--data-dir "$DATA" --symbol ES.FUT --train-weeks 4 --val-weeks 1 --test-weeks 1
    --step-weeks 2 --epochs 5 --max-steps-per-epoch 200 --device cuda --no-progress)

run() {
    local name=$1
    shift
    rm -rf "${OUT:?}/$name"
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits \
        -lms 200 > "$OUT/$name.smi.csv" &
    local smi=$!
    local s=$EPOCHREALTIME
    "$FOXHUNT" train "${FLAGS[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    local rc=$?
    local e=$EPOCHREALTIME
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    echo "$name $* rc=$rc wall_s=$(awk "BEGIN{print $e - $s}")" | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || tail -20 "$OUT/$name.log"
}

run one-gpu --devices 0
run all-gpus --devices all

python3 - "$OUT" "$N" <<'PY' | tee -a "$OUT/summary.txt"
import csv, json, sys
out, n = sys.argv[1], int(sys.argv[2])
walls = {}
for line in open(f"{out}/summary.txt"):
    parts = line.split()
    if parts and parts[0] in ("one-gpu", "all-gpus"):
        walls[parts[0]] = float(line.rsplit("wall_s=", 1)[1])
def results(name):
    r = json.load(open(f"{out}/{name}/report.json"))
    return r, {k: r[k] for k in ("windows", "skipped", "empty_windows", "aggregate")}
one, one_res = results("one-gpu")
alls, all_res = results("all-gpus")
windows = len(one["windows"])
speedup = walls["one-gpu"] / walls["all-gpus"]
print(f"windows {windows}; one GPU {walls['one-gpu']:.2f} s ({windows / walls['one-gpu']:.2f} windows/s); "
      f"{n} GPUs {walls['all-gpus']:.2f} s ({windows / walls['all-gpus']:.2f} windows/s)")
print(f"speed-up {speedup:.2f}x on {n} GPUs: {100 * speedup / n:.0f}% of linear (goal: >= 90%)")
same = [a == b for a, b in zip(one_res["windows"], all_res["windows"])]
print(f"per-window results equal to the one-GPU run's: {sum(same)} of {len(same)}; "
      f"aggregate equal: {one_res['aggregate'] == all_res['aggregate']}")
for name in ("one-gpu", "all-gpus"):
    util = {}
    for row in csv.reader(open(f"{out}/{name}.smi.csv")):
        if len(row) >= 3 and row[2].strip().isdigit():
            util.setdefault(int(row[1]), []).append(int(row[2]))
    means = ", ".join(f"GPU {d}: {sum(v) / len(v):.0f}% ({len(v)} samples)" for d, v in sorted(util.items()))
    print(f"{name} mean utilization: {means}")
PY
