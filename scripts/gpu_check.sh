#!/usr/bin/env bash
# What this project measures on the GPU machine, one part per call. A device call may run
# 10 minutes, and a fresh machine's bf16 s2-pro server takes ~60-150 s to start (cold
# Triton/cuDNN caches); every step below has a time limit that leaves room for both.
# Results go to $OUT (default out/gpu). The time limits are set from the old parts' runs,
# not yet timed in this form on a GPU.
#
#   bash scripts/gpu_check.sh tests     # every GPU test: pytest -m gpu (560 s limit)
#       TESTS="tests/test_kernel_decode_attention.py ...": other test files or pytest
#       arguments instead (kernel tests run compiled on a GPU)
#   bash scripts/gpu_check.sh engine    # the engine alone, s2-pro shape, eager vs CUDA graphs (560 s limit)
#       QUANT=fp8: FP8 weights; ENGINE_ARGS: more engine_bench flags (its baselines)
#   bash scripts/gpu_check.sh load      # the reference load c=1,16,64 + the naive baseline c=1,4,
#                                       # gated against this card's frozen reference (300 + 200 s limits)
#       QUANT=fp8: FP8 weights, gated against load-fp8.json; NAIVE=0: no naive baseline;
#       BASE_TREE=<dir>: the acceptance run of a change: the same load first from <dir> (a
#       checkout of the tree before it, copied into the repo under an ignored folder and
#       carried), then from this tree, each with its own server, both gated, then the two
#       side by side (280 + 300 s limits; no naive baseline unless NAIVE=1). E.g.
#         mkdir -p .carry/base && git archive BASE engine kernels latency_bench realtime clients \
#             ':!engine/assets' | tar -x -C .carry/base        # then carry .carry/base and .whl/serve
#       (engine/assets, 38 MB of default voice, is copied in from this tree on the machine)
#   bash scripts/gpu_check.sh capacity  # the reference workload past 64 streams: c=64,96,128 in bf16
#                                       # and FP8, a server each (270 s limit each)
#       CAP_LEVELS (64,96,128), QUANTS ("none fp8"), CAP_S (seconds per server, 270)
#   bash scripts/gpu_check.sh conversations  # open-loop capacity: conversations of 4 turns arrive, the user
#                                       # talks 2-6 s between turns; the last level of CONV_LEVELS
#                                       # (16,32,64,128) with TTFA p99 <= 150 ms and no underrun
#       CONV_DURATION (seconds per level, 60), CONV_S (560 s limit), QUANT; BASE_TREE=<dir> as for
#       load: the same search from <dir> first, then this tree, a server each, both tables
#       (CONV_S 270 each, CONV_DURATION 30)
#       CONV_FRAMES (frames a turn, 200: a talk share ~0.79; 100: ~0.5), CONV_ARGS (more
#       conversation flags, e.g. "--max-running 256")
#   bash scripts/gpu_check.sh burst     # every connection flushes each turn at once (--sync-flush):
#                                       # BURST_LEVELS (16,64) connections, 3 turns; BASE_TREE as for load
#   bash scripts/gpu_check.sh idle      # idle connections held ready with the reference voice cached, a
#                                       # sample of 16 speaking a turn: IDLE_LEVELS (500,1000,2000), up
#                                       # to the first that fails (IDLE_S: 560 s limit), QUANT
#   bash scripts/gpu_check.sh soak      # mixed traffic for SOAK_DURATION s (360): SOAK_CLIENTS (32) live
#                                       # clients speak, cancel and abandon turns, voices stored and deleted,
#                                       # one-shot HTTP; RSS, fds, threads, GPU memory must not grow (SOAK_S:
#                                       # 560 s limit), QUANT
#   bash scripts/gpu_check.sh kernels   # the kernel table: FP8 GEMMs and MLP block vs cuBLAS, GEMV,
#                                       # decode attention, sampling, q/k/v + RoPE, fast attention (limits: 570 s in all)
#       KERNELS: a subset of "fp8 gemv attention sample qk_rope fast_attention"
#   bash scripts/gpu_check.sh profile   # one decode step's kernels by GPU time (batch 1, 64) and the
#                                       # codec worker's calls and kernels (200 + 200 s limits)
#       QUANT=fp8: the step with FP8 weights
#   bash scripts/gpu_check.sh all       # every part in turn (~50 min of limits: for a machine of one's own,
#                                       # not one device call)
# Common: MODEL (s2-pro), DEVICE (cuda), LEVELS (the load's levels, 1,16,64), REFDIR (the
# frozen reference folder; by default picked from the card's name).
#
# The machine's image lacks the service's packages: their wheels travel in .whl/serve
# (starlette, uvicorn, websockets, httptools; 1 MB, git-ignored, named in the call's carry)
# and are installed here into /tmp/site. PyAV (.whl/av, 36 MB) is needed only to resample
# or encode Opus/MP3, which no part does. README, "Measuring".
set -u
part="${1:-tests}"
out="${OUT:-out/gpu}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
wheels=$(ls .whl/*.whl .whl/*/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
      '| CUDA', torch.cuda.is_available())" >> "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
MODEL=${MODEL:-s2-pro}
DEVICE=${DEVICE:-cuda}
QUANT=${QUANT:-none}
# this card's frozen references (latency_bench/reference/<card>/): a gate against another
# card's numbers says nothing
if [ -z "${REFDIR:-}" ]; then
    case "$(sed -n 2p "$out/gpu.txt")" in
        *H100*) REFDIR=latency_bench/reference/h100-s2pro ;;
        *H200*) REFDIR=latency_bench/reference/h200-s2pro ;;
        *) REFDIR="" ;;
    esac
fi
# the reference workload: random weights of the model's shape, a ~340-token voice prompt
# (cached after the first connection), 3 turns of 200 frames per connection
bench=(--model "$MODEL" --device "$DEVICE" --max-new-tokens 200 --fixed-frames --synthetic-reference 7 --turns 3
       --think 0.3 --server-arg=--max-len=1536)

# base_tree: $BASE_TREE's absolute path, with this tree's default voice copied in (the base
# tree is carried without its 38 MB of assets)
base_tree() {
    local base; base=$(cd "$BASE_TREE" && pwd) || return 2
    [ -d "$base/engine/assets" ] || cp -r engine/assets "$base/engine/"
    echo "$base"
}

need_service_packages() {
    python3 -c "import starlette, uvicorn, websockets" 2>/dev/null && return 0
    echo "the service's packages are missing: carry .whl/serve (README, \"Measuring\")"; exit 2
}

# bench_load TREE NAME QUANT LEVELS SECONDS [latency_bench args...]: the reference workload
# run from TREE (cd there: its own code and its own server), results in $out/NAME.json,
# the log in $out/NAME.log, its tables printed
bench_load() {
    local tree=$1 name=$2 q=$3 levels=$4 limit=$5 work=/tmp/gpu_check/$2; shift 5
    rm -rf "$work"; mkdir -p "$work"
    # GIT_CEILING_DIRECTORIES: a base tree inside this repo must not report this repo's commit
    (cd "$tree" && PYTHONPATH="/tmp/site:$tree" GIT_CEILING_DIRECTORIES="$(dirname "$tree")" timeout "$limit" \
        python3 -m latency_bench "${bench[@]}" --concurrency "$levels" --server-arg=--quant="$q" "$@" --out "$work") 2>&1 \
        | grep -v "active=" > "$out/$name.log"
    grep -E "^ *[0-9]+ |^== |c=[0-9]+:|started in|Error|error:" "$out/$name.log" | tail -n 30 | sed "s/^/$name: /"
    cp "$work/results.json" "$out/$name.json" 2>/dev/null || { echo "$name: no results (cut at $limit s?)"; return 1; }
    for f in "$work"/server-*.log; do [ -f "$f" ] && cp "$f" "$out/$name-$(basename "$f")"; done
    return 0
}

# gate NAME REFERENCE: $out/NAME.json against this card's frozen REFERENCE
gate() {
    if [ -n "$REFDIR" ] && [ -f "$REFDIR/$2" ]; then
        python3 -m latency_bench.gate --reference "$REFDIR/$2" --current "$out/$1.json" 2>&1 | tee "$out/gate-$1.log"
    else
        echo "$1: no frozen $2 for this card (REFDIR='$REFDIR'): not gated"
    fi
}

part_tests() {
    # ${TESTS} unquoted: several files and pytest arguments. The image lacks PyAV, which 8
    # service-test modules import and none of which holds a GPU test: collected past them
    timeout "${TESTS_S:-560}" python3 -m pytest -q -rfE --tb=short ${TESTS:--m gpu --continue-on-collection-errors tests} \
        > "$out/gpu_tests.log" 2>&1
    grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu_tests.log" | tail -n 25
}

part_engine() {
    timeout "${ENGINE_S:-560}" python3 -m latency_bench.engine_bench --model "$MODEL" --device "$DEVICE" \
        --batch 1,2,4,8,16,32,48,64 --quant "$QUANT" --steps 30 --context 400 --max-len 1536 \
        --prompt-lengths 100,300,1000 ${ENGINE_ARGS:-} --out "$out/engine" 2>&1 | grep -v Warn | tee "$out/engine_bench.log" \
        | tail -n 40
}

part_load() {
    need_service_packages
    local name=load ref=load.json levels=${LEVELS:-1,16,64} naive=${NAIVE:-1}
    [ "$QUANT" = fp8 ] && { name=load-fp8; ref=load-fp8.json; }
    if [ -n "${BASE_TREE:-}" ]; then
        local base; base=$(base_tree) || exit 2
        naive=${NAIVE:-0}
        bench_load "$base" "base-$name" "$QUANT" "$levels" "${LOAD_S:-280}" && gate "base-$name" "$ref"
    fi
    bench_load "$PWD" "$name" "$QUANT" "$levels" "${LOAD_S:-300}" && gate "$name" "$ref"
    if [ -n "${BASE_TREE:-}" ] && [ -f "$out/base-$name.json" ] && [ -f "$out/$name.json" ]; then
        echo "== $name: current tree / base tree ($BASE_TREE), same machine, same call"
        python3 -m latency_bench.ab "$out/base-$name.json" "$out/$name.json" | tee "$out/ab-$name.txt"
    fi
    if [ "$naive" = 1 ]; then
        # one utterance at a time: c=4 already takes ~4 turns' time, so one turn each
        bench_load "$PWD" naive "$QUANT" 1,4 "${NAIVE_S:-200}" --baseline naive --only-baseline \
            --baseline-concurrency 1,4 --baseline-turns 1
    fi
}

part_capacity() {
    need_service_packages
    # --max-connections and --max-queued follow the largest level (latency_bench/__main__.py)
    local q
    for q in ${QUANTS:-none fp8}; do
        bench_load "$PWD" "capacity-$q" "$q" "${CAP_LEVELS:-64,96,128}" "${CAP_S:-270}"
    done
}

# bench_conv TREE NAME SECONDS DURATION: the open-loop capacity search with the reference voice
# and 200-frame turns, run from TREE (its own code and server; the service's streams follow
# the top level plus its Poisson spread), results in $out/NAME.json, its table printed
bench_conv() {
    local tree=$1 name=$2 limit=$3 duration=$4 work=/tmp/gpu_check/$2
    rm -rf "$work"; mkdir -p "$work"
    (cd "$tree" && PYTHONPATH="/tmp/site:$tree" GIT_CEILING_DIRECTORIES="$(dirname "$tree")" timeout "$limit" \
        python3 -m latency_bench.conversation --model "$MODEL" --device "$DEVICE" \
        --max-new-tokens "${CONV_FRAMES:-200}" --fixed-frames --synthetic-reference 7 --server-arg=--max-len=1536 \
        --server-arg=--quant="$QUANT" --find-capacity --levels "${CONV_LEVELS:-16,32,64,128}" \
        --duration "$duration" ${CONV_ARGS:-} --out "$work") 2>&1 | grep -v " open=" > "$out/$name.log"
    grep -E "started in|Error|error:" "$out/$name.log" | tail -n 5 | sed "s/^/$name: /"
    sed -n '/^== open-loop/,/^capacity:/p' "$out/$name.log"
    cp "$work/results.json" "$out/$name.json" 2>/dev/null || echo "$name: no results (cut at $limit s?)"
    cp "$work/server.log" "$out/$name-server.log" 2>/dev/null
    return 0
}

part_conversations() {
    need_service_packages
    if [ -n "${BASE_TREE:-}" ]; then
        local base; base=$(base_tree) || exit 2
        bench_conv "$base" base-conversations "${CONV_S:-270}" "${CONV_DURATION:-30}"
        bench_conv "$PWD" conversations "${CONV_S:-270}" "${CONV_DURATION:-30}"
    else
        bench_conv "$PWD" conversations "${CONV_S:-560}" "${CONV_DURATION:-60}"
    fi
}

# bench_burst TREE NAME: the synchronized flushes from TREE, results in $out/NAME.json
bench_burst() {
    local tree=$1 name=$2 work=/tmp/gpu_check/$2
    rm -rf "$work"; mkdir -p "$work"
    (cd "$tree" && PYTHONPATH="/tmp/site:$tree" GIT_CEILING_DIRECTORIES="$(dirname "$tree")" timeout "${BURST_S:-270}" \
        python3 -m latency_bench.conversation --model "$MODEL" --device "$DEVICE" --max-new-tokens 200 \
        --fixed-frames --synthetic-reference 7 --server-arg=--max-len=1536 --server-arg=--quant="$QUANT" \
        --sync-flush --conversations "${BURST_LEVELS:-16,64}" --conv-turns 3 --think 1 --no-plot \
        ${BURST_ARGS:-} --out "$work") > "$out/$name.log" 2>&1
    grep -E "started in|Error|error:" "$out/$name.log" | tail -n 5 | sed "s/^/$name: /"
    sed -n '/^== synchronized/,/^wrote/p' "$out/$name.log"
    cp "$work/results.json" "$out/$name.json" 2>/dev/null || echo "$name: no results (cut?)"
    cp "$work/server.log" "$out/$name-server.log" 2>/dev/null
    return 0
}

part_burst() {
    need_service_packages
    if [ -n "${BASE_TREE:-}" ]; then
        local base; base=$(base_tree) || exit 2
        bench_burst "$base" base-burst
    fi
    bench_burst "$PWD" burst
}

part_idle() {
    need_service_packages
    # the reference voice (cached after the first connection) and 40-frame turns; the
    # service's --max-connections follows the top level (latency_bench/idle.py)
    local work=/tmp/gpu_check/idle
    rm -rf "$work"; mkdir -p "$work"
    timeout "${IDLE_S:-560}" python3 -m latency_bench.idle --model "$MODEL" --device "$DEVICE" \
        --connections "${IDLE_LEVELS:-500,1000,2000}" --synthetic-reference 7 --fixed-frames \
        --server-arg=--max-len=1536 --server-arg=--quant="$QUANT" --out "$work" > "$out/idle.log" 2>&1
    grep -E "started in|^\[idle\]|Error|error:" "$out/idle.log" | tail -n 10
    sed -n '/^== idle/,/^held:/p' "$out/idle.log"
    cp "$work/results.json" "$out/idle.json" 2>/dev/null || echo "idle: no results (cut at ${IDLE_S:-560} s?)"
    cp "$work/server.log" "$out/idle-server.log" 2>/dev/null
    return 0
}

part_soak() {
    need_service_packages
    # 360 s of traffic leaves the 560 s limit room for a cold s2-pro start (~60-150 s) and
    # the two rests (latency_bench/soak.py)
    local work=/tmp/gpu_check/soak
    rm -rf "$work"; mkdir -p "$work"
    timeout "${SOAK_S:-560}" python3 -m latency_bench.soak --model "$MODEL" --device "$DEVICE" \
        --duration "${SOAK_DURATION:-360}" --clients "${SOAK_CLIENTS:-32}" --fixed-frames \
        --server-arg=--quant="$QUANT" --out "$work" > "$out/soak.log" 2>&1
    grep -E "started in|^\[soak\]|Error|error:" "$out/soak.log" | tail -n 10
    sed -n '/^== soak/,/^soak:/p' "$out/soak.log"
    cp "$work/results.json" "$out/soak.json" 2>/dev/null || echo "soak: no results (cut at ${SOAK_S:-560} s?)"
    cp "$work/server.log" "$out/soak-server.log" 2>/dev/null
    return 0
}

part_kernels() {
    # each benchmark times its kernel against the PyTorch/cuBLAS path it replaces, same run
    local k
    for k in ${KERNELS:-fp8 gemv attention sample qk_rope fast_attention}; do
        echo "== $k"
        case $k in
            fp8) timeout 140 python3 -m latency_bench.kernel_bench --out "$out/kernel_bench" ;;
            gemv) timeout 110 python3 -m latency_bench.gemv_bench --out "$out/gemv_bench" ;;
            attention) timeout 170 python3 -m latency_bench.attention_bench --batch 64 --context 1000 --stages 2,3 \
                           --out "$out/attention_bench" ;;
            sample) timeout 50 python3 -m latency_bench.sample_bench --out "$out/sample_bench" ;;
            qk_rope) timeout 40 python3 -m latency_bench.qk_rope_bench --out "$out/qk_rope_bench" ;;
            fast_attention) timeout 60 python3 -m latency_bench.fast_attention_bench --out "$out/fast_attention_bench" ;;
            *) echo "unknown kernel benchmark $k" ;;
        esac 2>&1 | grep -v "Warn\|^  (skipped\|^    (" | tee "$out/kernels-$k.log" | tail -n 30
    done
}

part_profile() {
    timeout "${PROFILE_S:-200}" python3 -m latency_bench.profile_step --model "$MODEL" --device "$DEVICE" \
        --batch 1,64 --steps 5 --quant "$QUANT" --out "$out/profile" 2>&1 | grep -v Warn \
        | tee "$out/profile_step.log" | head -n 60
    timeout "${CODEC_S:-200}" python3 -m latency_bench.profile_codec --model "$MODEL" --batch 1,16,64 \
        --profile-batch 64 --ops 20 --out "$out/profile_codec" 2>&1 | grep -v Warn | tee "$out/profile_codec.log" | head -n 60
}

case "$part" in
    tests|engine|load|capacity|conversations|burst|idle|soak|kernels|profile) "part_$part" ;;
    all) for p in tests engine kernels profile load capacity; do echo "=== $p"; "part_$p"; done ;;
    *) echo "unknown part $part (tests, engine, load, capacity, conversations, burst, idle, soak, kernels, profile, all)"; exit 2 ;;
esac
