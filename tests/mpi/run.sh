#!/usr/bin/env bash
# Data parallelism over MPI under a real `mpirun -np 2` (issue 18), called from .ci/run:
#  1. translation: 2 ranks x 1 thread train 20 updates with the losses of one process whose
#     batches split in the same 2 parts (--threads 2, in-process data parallelism), to 1e-5;
#  2. translation: 10 updates on 2 ranks, resumed to 20 in one process: the same losses;
#  3. language model: the same as 1;
#  4. language model: 10 updates in one process, resumed to 20 on 2 ranks: the losses of the
#     same run resumed in one process.
# Installs Open MPI and libclang when missing (Debian: libopenmpi-dev openmpi-bin
# libclang-dev), builds with --features mpi in the test profile (the dependencies `cargo test`
# already built are reused), and fails loudly when a loss differs.
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || missing+=(libopenmpi-dev)
dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev)
if ((${#missing[@]})); then
    echo "mpi: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# MPI_PROFILE=release reuses a release build instead (the profile's directory: test -> debug).
profile=${MPI_PROFILE:-test}
cargo build --profile "$profile" --features mpi --bin transformer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy: a later `cargo test` rebuilds target/debug/transformer without the feature.
bin="$work/transformer"
cp "target/$([ "$profile" = test ] && echo debug || echo "$profile")/transformer" "$bin"
mpirun=(mpirun -np 2 --oversubscribe --bind-to none)
[ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)

# A small translation task (reverse a sequence of digit words) and the README as LM text.
words=(zero one two three four five six seven eight nine)
for i in $(seq 1 400); do
    n=$((3 + i % 7)) src="" tgt=""
    for j in $(seq 1 $n); do
        w=${words[$(((i * 7 + j * j * 3) % 10))]}
        src="$src $w" tgt="$w $tgt"
    done
    printf '%s\t%s\n' "${src# }" "${tgt% }"
done >"$work/pairs.tsv"

train=(train --train "$work/pairs.tsv" --preset tiny --vocab-level word --tokens-per-batch 600
    --warmup 20 --log-every 1 --autosave 0 --seed 3)
lm=(train-lm --text README.md --vocab-size 300 --context 64 --batch 8 --d-model 64 --n-heads 4
    --d-ff 128 --layers 2 --dropout 0.1 --warmup 5 --eval-every 0 --log-every 1
    --autosave 0 --valid-fraction 0.05 --seed 5)

# `losses DIR`: "step loss" per line of DIR/metrics.jsonl (parsed as JSON: the keys' order is
# the writer's, not sorted).
losses() {
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], repr(r["loss"]))' "$1/metrics.jsonl" | sort -n
}
# `same A B FIRST`: the losses of updates FIRST..20 agree to 1e-5 (relative), else fail.
same() {
    awk -v first="$3" -v what="$1 vs $2" '
        NR == FNR { want[$1] = $2; next }
        $1 >= first && ($1 in want) { n++; d = $2 - want[$1]; if (d < 0) d = -d;
            r = d / (want[$1] < 0 ? -want[$1] : want[$1]); if (r > worst) worst = r;
            if (r > 1e-5) { printf "step %d: %s vs %s\n", $1, want[$1], $2; bad++ } }
        END { printf "mpi: %s: %d updates, largest relative difference %.2g\n", what, n, worst;
            exit (bad > 0 || n != 21 - first) }' <(losses "$1") <(losses "$2") ||
        { echo "mpi: FAILED: the losses of $1 and $2 differ" >&2; exit 1; }
}

t0=$SECONDS
"$bin" "${train[@]}" --threads 2 --max-steps 20 --out "$work/one"
"${mpirun[@]}" "$bin" "${train[@]}" --threads 1 --max-steps 20 --out "$work/two"
same "$work/one" "$work/two" 1
"${mpirun[@]}" "$bin" "${train[@]}" --threads 1 --max-steps 10 --out "$work/resumed"
"$bin" train --train "$work/pairs.tsv" --resume "$work/resumed" --out "$work/resumed" \
    --max-steps 20 --log-every 1 --autosave 0 --threads 2
same "$work/one" "$work/resumed" 11

"$bin" "${lm[@]}" --threads 2 --max-steps 20 --out "$work/lm-one"
"${mpirun[@]}" "$bin" "${lm[@]}" --threads 1 --max-steps 20 --out "$work/lm-two"
same "$work/lm-one" "$work/lm-two" 1
# train-lm plans its cosine to --max-steps: both resumed runs continue a 10-update plan.
"$bin" "${lm[@]}" --threads 2 --max-steps 10 --out "$work/lm-ten"
cp -r "$work/lm-ten" "$work/lm-ten-two"
resume_lm=(train-lm --text README.md --valid-fraction 0.05 --max-steps 20 --eval-every 0
    --log-every 1 --autosave 0)
"$bin" "${resume_lm[@]}" --resume "$work/lm-ten" --out "$work/lm-ten" --threads 2
"${mpirun[@]}" "$bin" "${resume_lm[@]}" --resume "$work/lm-ten-two" --out "$work/lm-ten-two" \
    --threads 1
same "$work/lm-ten" "$work/lm-ten-two" 11
echo "mpi: all checks passed ($((SECONDS - t0)) s of training)"
