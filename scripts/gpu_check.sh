#!/usr/bin/env bash
# Everything this project measures on the GPU machine, one part per call (each call of
# the device tool is limited to 10 minutes). Results go to $OUT (or out/gpu).
#   bash scripts/gpu_check.sh tests    # GPU tests + compiled kernel tests
#   bash scripts/gpu_check.sh quick    # GPU tests, engine bench c=1/16/64, fused q/k/v kernel bench (~4 min)
#   bash scripts/gpu_check.sh engine   # engine benchmark, s2-pro shape, eager vs CUDA graphs
#   bash scripts/gpu_check.sh load     # WebSocket load sweep c=1,16,64, s2-pro shape
#   bash scripts/gpu_check.sh naive    # the naive serving baseline (same workload, fewer levels)
#   bash scripts/gpu_check.sh fp8      # FP8 kernel tests (compiled) and the kernel benchmark
#   bash scripts/gpu_check.sh sweep    # FP8 kernel tests and the GEMM tile sweep (~6 min)
#   bash scripts/gpu_check.sh adopt    # FP8 GPU tests, tile sweep written into kernels/fp8_configs.py, engine FP8 vs bf16 (~9 min)
#   bash scripts/gpu_check.sh kvfp8    # FP8 KV cache: tests, engine FP8 weights with bf16 vs FP8 KV at contexts 400/1000, FP8 load sweep (~9 min)
#   bash scripts/gpu_check.sh codecpolicy  # c=32,64 load (bf16) under codec policies (hold lead, chunk size) (~5 min)
#   bash scripts/gpu_check.sh fp8load  # FP8 load sweep c=1,16,32,64 and its gate against load-fp8.json (~3 min)
#   bash scripts/gpu_check.sh kvfp8-short  # FP8 KV read path: its tests, engine at context 1000 vs bf16 KV (~1.5 min)
#   bash scripts/gpu_check.sh attention  # decode attention alone, bf16 vs FP8 KV, over its launch choices (~3 min)
#   bash scripts/gpu_check.sh ncu        # Nsight Compute counters of the FP8 GEMMs (M = 1, 54) and decode attention (bf16, FP8 KV) (~2 min; NCU_SOURCE=1: by source line)
#   bash scripts/gpu_check.sh mlpfused   # the MLP's two FP8 GEMMs in one launch: GPU tests, MLP block at M = 1..64, engine step vs fp8 (~6 min)
#   bash scripts/gpu_check.sh fp8check   # the attention sweep + the FP8 kernel table on the adopted launch table (~6 min)
#   bash scripts/gpu_check.sh attnlaunch  # decode attention's measured launch vs the short splits: tests, engine step, bf16 and FP8 KV (~4 min)
#   bash scripts/gpu_check.sh fp8e2e   # FP8 tests, engine bench with FP8 and bf16, kernel table (~8 min)
#   bash scripts/gpu_check.sh survey   # GPU + kernel tests, engine bench, codec call times, step profile, load sweep with per-turn timing (~5 min)
#   bash scripts/gpu_check.sh reference  # GPU tests, load sweep c=1,16,32,64 + naive baseline, files flat in $OUT (~8 min)
#   bash scripts/gpu_check.sh codec64    # codec worker call times (graphs) + one c=64 load level with turn timing (~2.5 min)
#   bash scripts/gpu_check.sh shares     # GPU tests, load c=1,16,64 with where the service's time goes per level (~4 min)
#   bash scripts/gpu_check.sh codecstate # codec kernel tests, codec call times in 3 variants, load c=1,16,64 with and without them (~7 min)
#   bash scripts/gpu_check.sh stalls     # c=64 load with the stall sampler (what blocks the event loop)
#   bash scripts/gpu_check.sh codec      # codec worker calls with the Snake kernel vs PyTorch, eager codec profile (~2 min)
#   bash scripts/gpu_check.sh convhist   # codec kernel tests, codec calls and c=64 load (first frames 1 and 2), codec calls before the history change (~9 min)
#   bash scripts/gpu_check.sh secondframe  # GPU tests, load c=1,16,64 with the second frame made by the prefill thread vs the decode batch (~7 min)
#   bash scripts/gpu_check.sh gemv       # small-batch GEMV: tests, launch sweep (written to kernels/gemv_configs.py), kernel vs cuBLAS, engine with/without (~9 min)
#   bash scripts/gpu_check.sh gemv-profile  # the GEMV table without a sweep (FP8 pre-quantized too), the batch-1 step's kernels (~3 min)
#   bash scripts/gpu_check.sh pdl        # PDL: support check, GEMV/MLP and engine step (bf16, FP8) with and without it, GPU tests (~8 min)
#   bash scripts/gpu_check.sh sample     # the sampling kernel: GPU tests, walk vs gathered benchmark, FP8 load gated (~5 min)
#   bash scripts/gpu_check.sh pdlgate    # PDL as used: GPU tests, FP8 engine step, load c=1,16,64 FP8 and bf16 each gated (~9.5 min)
#   bash scripts/gpu_check.sh heads      # fp32 head logits + FP8 GEMM's unrolled split-K sum vs the tree before, same call (~9.5 min)
#   bash scripts/gpu_check.sh retest     # GPU tests with whole tracebacks, FP8 kernel table, engine step FP8 and bf16 (~8 min)
#   bash scripts/gpu_check.sh headsgate  # serving_tests, load c=1,16,64 FP8 and bf16 each gated (~9 min; limits short)
#   bash scripts/gpu_check.sh fp8gate    # serving_tests with room, FP8 load c=1,16,64 gated (~8 min)
#   bash scripts/gpu_check.sh ab64       # FP8 load at c=64, this tree vs .carry/base.tar's, same call (~5 min)
#   bash scripts/gpu_check.sh firstframes  # load c=1,16,64x3 bf16, a turn's first audio of 1 and of 2 frames, same call (~6 min)
#   bash scripts/gpu_check.sh thirdframe  # (with its diff applied) load c=16,64x3 bf16, the prefill thread's third frame vs its second only (~7 min)
#   bash scripts/gpu_check.sh h200adopt  # the TMA table re-tuned (written back), kernel table, engine FP8 vs bf16, no tests (~8 min)
#   bash scripts/gpu_check.sh first2     # load c=1,16,64x2 FP8, a turn's first audio of 2 frames vs 1, same call (~5.5 min)
#   bash scripts/gpu_check.sh sharedprefix  # shared voice prefix reads: GPU tests, decode attention alone own vs shared rows, load c=16,64x2 bf16 with vs without (~8 min)
#   bash scripts/gpu_check.sh h100next   # shared-prefix tests + attention alone, then load c=64x2 FP8: default / first audio of 2 frames / shared prefix reads (~9 min)
#   bash scripts/gpu_check.sh prefillblocked  # the blocked prefill attention: its tests compiled, engine prefill per-query vs blocked, load c=16,64x2 bf16 per-query vs blocked (the default) (~8 min)
#   bash scripts/gpu_check.sh arms       # FP8: the cascade decode attention vs the default: tests, alone, engine step (+ prefill A/B), load c=64x2 per arm (~8 min)
#   bash scripts/gpu_check.sh fp8arms    # FP8 load c=64x2: the default / first audio of 2 frames / PDL on every graph (~9 min)
#   bash scripts/gpu_check.sh cutin      # load c=16,64x3 bf16, --codec-cut-in vs the default, same call (~5.5 min)
#   bash scripts/gpu_check.sh tma        # the TMA FP8 GEMM: its GPU tests (warp-specialized cases in a child with a time limit), its
#                                        # choices without warp specialization vs the current table and cuBLAS at M = ${TMA_M:-1} (~7 min)
#   bash scripts/gpu_check.sh swiglu     # the MLP's SwiGLU in the gate/up GEMM: FP8 GPU tests, kernel table + MLP block, engine step fp8 vs fp8-swiglu-epilogue (~6 min)
#   bash scripts/gpu_check.sh issue5ab   # load c=64x2: bf16 and FP8, each with the codec and with --codec-silent (no codec work), same call (~9 min)
#   bash scripts/gpu_check.sh firsttail  # where the server's first c=64 run's tail goes: per-turn timing, GC pauses, stalled-loop stacks, client loop lag; FP8 c=64x2 (~2 min; QUANTS="fp8 none" adds bf16, ~4 min)
#   bash scripts/gpu_check.sh firstreplay  # each CUDA graph's first launch vs later ones (the replay after capture off), bf16 and FP8 + PDL on all; GPU tests of the graph paths; c=64x2 FP8 load (~8 min)
#   bash scripts/gpu_check.sh tailfix    # firsttail FP8 (the codec worker's batched flush of segment ends), then bf16 c=64x2 default vs --codec-busy-streams 32, fresh servers (~6 min)
#   bash scripts/gpu_check.sh capacity   # the reference workload at c=64,96,128 (--max-running 128) bf16, 96,128 FP8, a server each, the defaults; naive c=1 (~9 min)
#     (CAP_S / CAP_FP8_S / NAIVE_S: each run's seconds, 0 leaving that run out; CAP_LEVELS: bf16's levels)
#   bash scripts/gpu_check.sh busygate   # the reference load at c=1,16,64 in FP8 and bf16 with today's defaults, gated (~9 min; h200next is its name for the H200 call)
#   bash scripts/gpu_check.sh capbusy    # c=96,128 (LEVELS) with the defaults (the guard --codec-busy-streams 32 on), bf16 and FP8, a server each (~6 min)
#   bash scripts/gpu_check.sh h200next   # busygate, on an H200 (~9 min), then h200cap:
#   bash scripts/gpu_check.sh h200cap    # capacity's bf16 and FP8 at c=96,128 (~7 min, warm machine)
#   bash scripts/gpu_check.sh h200short  # bf16 only: its load gated, then c=96,128 (~8 min on a fresh machine)
#   bash scripts/gpu_check.sh step       # GPU tests, engine bench with the blocks' small ops as kernels vs PyTorch, step profile, codec profile (~5 min)
#   also: quick, profile, engine-s1, diagnose, timing, load+naive, tests+engine (see below)
# The machine's image lacks starlette/uvicorn/websockets/PyAV: they travel as wheels,
# carried by the device call: .whl/serve (the service's four, 1 MB; enough for the load
# parts: PCM out, WAV references at the codec's rate) and .whl/av (PyAV, 36 MB: only where
# a part resamples, encodes Opus/MP3 or decodes other formats). README, "Measuring on a GPU".
set -u
part="${1:-tests}"
out="${OUT:-out/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
wheels=$(ls .whl/*.whl .whl/*/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt"
cat "$out/gpu.txt"
# frozen references of the card this call got (the lent machine is mostly an H100; issue 5's
# and 7's targets are the H200's): a gate against another card's numbers says nothing
case "$(head -2 "$out/gpu.txt" | tail -1)" in
    *H100*) refdir=latency_bench/reference/h100-s2pro ;;
    *) refdir=latency_bench/reference/h200-s2pro ;;
esac
# gate NAME: this call's $out/NAME.json against $refdir/NAME.json, if this card has one
gate() {
    if [ -f "$refdir/$1.json" ]; then
        python3 -m latency_bench.gate --reference "$refdir/$1.json" --current "$out/$1.json"
    else
        echo "no frozen $1.json for this card in $refdir: not gated"
    fi
}
# every test that needs the GPU (compiled kernels, CUDA graphs), and the FP8 ones
gpu_tests=(tests/test_gpu.py tests/test_kernel_decode_attention.py tests/test_kernel_qk_rope_kv.py tests/test_chunked_prefill.py
           tests/test_kernel_add_rms_norm.py tests/test_kernel_swiglu.py tests/test_kernel_fast_attention.py tests/test_step_kernels.py
           tests/test_kernel_snake.py tests/test_kernel_snake_train.py tests/test_kernel_sample.py tests/test_kernel_conv_state.py
           tests/test_kernel_residual.py tests/test_kernel_gemv.py tests/test_shared_prefix.py
           tests/test_kernel_prefill_attention.py)
fp8_tests=(tests/test_kernel_fp8_quant.py tests/test_kernel_fp8_gemm.py tests/test_quant.py)
# random weights of the S2-Pro shape; a ~300-token voice prompt; 200-frame utterances
bench=(--model s2-pro --device cuda --max-new-tokens 200 --fixed-frames --synthetic-reference 7 --turns 3 --think 0.3)
# true when an engine_bench --kv-quant none,fp8 run's last batch was > 3% faster with the FP8 cache
kv_fp8_faster() {
    python3 -c "import json, sys; g = json.load(open('$1'));
r = g['graphs']['decode'][-1]['step_ms'] / g['graphs_kv_fp8']['decode'][-1]['step_ms']; print(f'last batch: FP8 KV {r:.2f}x');
sys.exit(0 if r > 1.03 else 1)"
}
# a copy of this tree in /tmp/base with .carry/base.tar unpacked over it (`git archive BASE
# engine kernels latency_bench ':!engine/assets'` here; carry .carry/base.tar): the A/B's
# baseline side, run with cd /tmp/base and PYTHONPATH=/tmp/base:/tmp/site
unpack_base() {
    rm -rf /tmp/base; mkdir -p /tmp/base; cp -r engine kernels latency_bench realtime scripts /tmp/base/
    tar -xf .carry/base.tar -C /tmp/base
}
# the serving path's, the GEMV's and the FP8 GPU tests within $1 seconds, failures with
# their tracebacks in $out/gpu_tests.log; without the default voice's tests (a call that
# carries the wheels leaves its weights here)
serving_tests() {
    timeout "$1" python3 -m pytest -q --tb=short -rfE tests/test_gpu.py tests/test_kernel_gemv.py tests/test_quant.py \
        -k "not gate_greedy and not bundle_speaks" > "$out/gpu_tests.log" 2>&1
    grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | grep "passed\|failed\|error\|FAIL" | tail -8
}
# the reference workload at c=1,16,64 with --quant=$1 (fp8 or none) within $2 seconds,
# gated against its frozen reference (load-fp8.json or load.json); files $out/<name>.json
gated_load() {
    local q=$1 work=/tmp/load_$1 name
    name=$([ "$q" = fp8 ] && echo load-fp8 || echo load)
    rm -rf "$work"; mkdir -p "$work"
    timeout "$2" python3 -m latency_bench "${bench[@]}" --concurrency 1,16,64 \
        --server-arg=--max-len=1536 --server-arg=--quant="$q" --out "$work" 2>&1 | grep -v "active=" | tail -6
    cp "$work/results.json" "$out/$name.json"
    gate "$name" 2>&1 | tail -6 | tee "$out/gate-$q.log"
}
# one load run of the reference workload: load NAME QUANT CONCURRENCY TIMEOUT [server args...];
# its results in $out/NAME.json and the c lines printed with NAME in front
load() {
    local name=$1 q=$2 levels=$3 limit=$4 work=/tmp/load-$1; shift 4
    rm -rf "$work"; mkdir -p "$work"
    local extra=(); for a in "$@"; do extra+=(--server-arg="$a"); done
    timeout "$limit" python3 -m latency_bench "${bench[@]}" --concurrency "$levels" --server-arg=--max-len=1536 \
        --server-arg=--quant="$q" "${extra[@]}" --out "$work" 2>&1 | grep -v "active=" | grep -E "^ *[0-9]|server started" | sed "s/^/$name: /"
    cp "$work/results.json" "$out/$name.json" 2>/dev/null || echo "$name: no results (cut at $limit s?)"
}
# per level of a load run's results.json: the step interval, the decode step's GPU time,
# the mean batch, the codec's share of GPU time and where the underruns began
shares_lines() {
    python3 -c "import json; r = json.load(open('$1'))['runs']['engine']
for lv in r:
    s, u = lv.get('engine_shares') or {}, lv.get('underrun_at_audio_s') or {}
    print('  c=%d step %.2f ms (GPU %.2f) batch %.1f, codec GPU %.0f%% (%.2f ms a frame, %.0f%% padding), underruns at %.3f s of audio (p50)' % (
          lv['concurrency'], s.get('step_interval_ms', 0), s.get('decode_gpu_ms_per_step', 0), s.get('mean_batch', 0),
          100 * s.get('codec_gpu_share', 0), s.get('codec_gpu_ms_per_frame', 0), 100 * s.get('codec_padding', 0),
          u.get('p50') or 0) + (', %d codec rounds cut short' % s['codec_cuts']
          if s.get('codec_cuts') else ''))" 2>&1 | tail -5
}
# load runs of the reference workload in bf16, one server per variant, in one call:
# ab_loads PREFIX LEVELS SECONDS NAME[:FLAG[,FLAG...]] ...; each variant's results in
# $out/PREFIX-NAME.json and its shares lines printed; a variant that would have less than
# 90 of the SECONDS left is skipped
ab_loads() {
    local prefix=$1 levels=$2 limit=$3 start v name left; shift 3
    start=$(date +%s)
    for v in "$@"; do
        name=${v%%:*}
        local flags=(); [ "$v" != "$name" ] && IFS=, read -ra flags <<< "${v#*:}"
        left=$(( limit - ($(date +%s) - start) ))
        [ "$left" -lt 90 ] && { echo "skipped $name: $left s left"; continue; }
        load "$prefix-$name" none "$levels" "$left" "${flags[@]}"
        shares_lines "$out/$prefix-$name.json"
        echo "$name done at $(( $(date +%s) - start )) s"
    done
}
# the server's first c=64 runs, per-turn timing, GC pauses, stalled-loop stacks and the
# client's loop lag: first_tail "QUANTS" SECONDS (a fresh server per weight type; the
# `firsttail` part)
first_tail() {
    local q
    for q in $1; do
        load firsttail-$q none 64,64 "$2" --quant=$q --log-timing --debug-stalls
        shares_lines "$out/firsttail-$q.json"
        python3 -c "import json; [print('  client loop lag', lv.get('client_loop_lag_s')) for lv in json.load(open('$out/firsttail-$q.json'))['runs']['engine']]"
        cp /tmp/load-firsttail-$q/server-engine.log "$out/server-engine-$q.log" 2>/dev/null
        grep "turn " /tmp/load-firsttail-$q/server-engine.log | python3 scripts/turn_timing.py 192,192
        grep -i "stall\|samples\|lag" /tmp/load-firsttail-$q/server-engine.log | head -30
    done
}
# the reference workload past 64 streams (--max-running is the largest level: 128): bf16
# at c=64, 96, 128 and FP8 at 96, 128, a server each, then the naive baseline at c=1 (one
# turn): capacity_sweep BF16_SECONDS FP8_SECONDS NAIVE_SECONDS, 0 seconds leaving that run
# out (for a call short of device time, or one that finishes an earlier call's sweep)
# (the `capacity` part)
capacity_sweep() {
    if [ "$1" -gt 0 ]; then
        load capacity-none none "${CAP_LEVELS:-64,96,128}" "$1"
        shares_lines "$out/capacity-none.json"
    fi
    if [ "$2" -gt 0 ]; then
        load capacity-fp8 fp8 96,128 "$2"
        shares_lines "$out/capacity-fp8.json"
    fi
    if [ "$3" -gt 0 ]; then
        timeout "$3" python3 -m latency_bench "${bench[@]}" --baseline naive --only-baseline --baseline-concurrency 1 \
            --baseline-turns 1 --concurrency 1 --server-arg=--max-len=1536 --out /tmp/naive 2>&1 | grep -v "active=" | tail -4
        cp /tmp/naive/results.json "$out/naive.json"
    fi
}
case "$part" in
tests)
    timeout 540 python3 -m pytest -q -x "${gpu_tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
    ;;
tests+engine)
    timeout 200 python3 -m pytest -q "${gpu_tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
    timeout 330 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,4,16,32,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 100,300,1000 --out "$out" 2>&1 | tee "$out/engine_bench.log"
    ;;
quick)
    timeout 90 python3 -m pytest -q "${gpu_tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
    timeout 100 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out" 2>&1 | tee "$out/engine_bench.log"
    timeout 60 python3 -m latency_bench.qk_rope_bench --out "$out/qk_rope" 2>&1 | tee "$out/qk_rope_bench.log"
    ;;
survey)
    timeout 150 python3 -m pytest -q "${gpu_tests[@]}" "${fp8_tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
    timeout 120 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out" 2>&1 | tee "$out/engine_bench.log"
    timeout 60 python3 -m latency_bench.diagnose --model s2-pro --device cuda --codec-batch 1,16,64 --codec-frames 1,4 \
        --concurrency "" --out "$out/diagnose" 2>&1 | grep -v "cudnn=False" | tee "$out/diagnose.log"
    timeout 100 python3 -m latency_bench.profile_step --model s2-pro --device cuda --batch 1,64 --steps 5 \
        --out "$out/profile" 2>&1 | head -60 | tee "$out/profile.log"
    timeout 320 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,64 --server-arg=--max-len=1536 \
        --server-arg=--log-timing --out "$out/load" 2>&1 | tee "$out/load.log"
    grep "turn " "$out/load/server-engine.log" | python3 scripts/turn_timing.py
    ;;
step)
    # the decode step's and the codec's kernels against the PyTorch ops they replace, in one run
    timeout 150 python3 -m pytest -q "${gpu_tests[@]}" 2>&1 | tail -15 | tee "$out/gpu_tests.log"
    timeout 170 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --step-kernels-baseline --out "$out" 2>&1 | tee "$out/engine_bench.log"
    timeout 80 python3 -m latency_bench.profile_step --model s2-pro --device cuda --batch 1,64 --steps 5 \
        --out "$out/profile" 2>&1 | grep -v Warn | head -70 > "$out/profile.log"; head -30 "$out/profile.log"
    timeout 150 python3 -m latency_bench.profile_codec --model s2-pro --batch 1,16,64 --profile-batch 64 \
        --out "$out/profile_codec" 2>&1 | grep -v Warn | tee "$out/profile_codec.log"
    ;;
codec)
    # compiled codec-kernel tests, the worker's call times in three variants, the eager
    # call's kernels and its slowest ops
    timeout 120 python3 -m pytest -q tests/test_kernel_conv_state.py tests/test_kernel_snake.py tests/test_kernel_residual.py 2>&1 | tail -3
    timeout 200 python3 -m latency_bench.profile_codec --model s2-pro --batch 1,16,64 --profile-batch 64 --ops 40 \
        --out "$out/profile_codec" 2>&1 | grep -v Warn | tee "$out/profile_codec.log"
    ;;
codec64)
    # the codec worker's call times (graphs) and one c=64 load level with per-turn timing
    work=/tmp/codec64; rm -rf "$work"; mkdir -p "$work"
    timeout 90 python3 -m latency_bench.diagnose --model s2-pro --device cuda --codec-batch 1,16,64 --codec-frames 1,4 \
        --concurrency "" --out "$work/diagnose" 2>&1 | grep "worker call\|cudnn=True" | tee "$out/codec64.log"
    timeout 150 python3 -m latency_bench "${bench[@]}" --concurrency 64 --server-arg=--max-len=1536 \
        --server-arg=--log-timing --out "$work/load" 2>&1 | grep -v "active=" | tee -a "$out/codec64.log"
    grep "turn " "$work/load/server-engine.log" | python3 scripts/turn_timing.py 192 | tee -a "$out/codec64.log"
    cp "$work/load/results.json" "$out/load64.json"
    ;;
shares)
    # GPU tests, then the load sweep c=1,16,64 with where the service's time went per level
    # (latency_bench/shares.py: step interval vs the step's GPU time, thread shares, codec)
    # (GPU_TESTS=0 skips the tests; SERVER_ARGS adds server flags, e.g. an A/B baseline)
    work=/tmp/shares; rm -rf "$work"; mkdir -p "$work"
    if [ "${GPU_TESTS:-1}" != 0 ]; then timeout 150 python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -15 | tee "$out/gpu_tests.log"; fi
    timeout 240 python3 -m latency_bench "${bench[@]}" --concurrency ${CONCURRENCY:-1,16,64} --server-arg=--max-len=1536 \
        ${SERVER_ARGS:-} --out "$work/load" 2>&1 | grep -v "active=" | tee "$out/shares.log"
    cp "$work/load/results.json" "$out/load-shares.json"
    ;;
codecstate)
    # the codec's kernels (kernels/conv_state.py, ring_attention.py, residual.py, snake.py,
    # layout.py): their compiled tests and the GPU tests, the codec worker's call times in
    # three variants (PyTorch, Snake kernel, all kernels), then the load sweep with every
    # kernel (the default) and, as its baseline in the same call, with the Snake kernel
    # only (BASELINE=0 skips it) (~7 min)
    work=/tmp/codecstate; rm -rf "$work"; mkdir -p "$work"
    timeout 200 python3 -m pytest -q tests/test_kernel_conv_state.py tests/test_kernel_snake.py tests/test_kernel_residual.py tests/test_gpu.py ${GPU_TEST_FILTER:-} 2>&1 \
        | tail -15 | tee "$out/gpu_tests.log"
    timeout 150 python3 -m latency_bench.profile_codec --model s2-pro --batch 1,16,64 --profile-batch 64 --ops 30 \
        --out "$out/profile_codec" 2>&1 | grep -v Warn | tee "$out/profile_codec.log"
    for kernels in all snake; do
        if [ "$kernels" = snake ] && [ "${BASELINE:-1}" = 0 ]; then continue; fi
        timeout 200 python3 -m latency_bench "${bench[@]}" --concurrency ${CONCURRENCY:-1,16,64} --server-arg=--max-len=1536 \
            --server-arg=--codec-kernels=$kernels --out "$work/load-$kernels" 2>&1 | grep -v "active=" | tail -9 | tee -a "$out/shares.log"
        cp "$work/load-$kernels/results.json" "$out/load-$kernels.json"
    done
    ;;
stalls)
    # c=64 only, with the service's stall sampler: GC pauses and thread stacks while the
    # event loop was blocked
    work=/tmp/stalls; rm -rf "$work"; mkdir -p "$work"
    timeout 200 python3 -m latency_bench "${bench[@]}" --concurrency 64 --server-arg=--max-len=1536 \
        --server-arg=--log-timing --server-arg=--debug-stalls --out "$work/load" 2>&1 | grep -v "active=" | tee "$out/stalls.log"
    grep "turn " "$work/load/server-engine.log" | python3 scripts/turn_timing.py 192 | tee -a "$out/stalls.log"
    grep -v "turn \|INFO" "$work/load/server-engine.log" | tail -120 | tee -a "$out/stalls.log"
    ;;
reference)
    # the frozen-reference run: GPU tests, load sweep (with per-turn timing) and the naive
    # baseline; the files worth keeping are copied flat into $out (8 files come back)
    work=/tmp/reference; rm -rf "$work"; mkdir -p "$work"
    # (the serving path's GPU tests only: the whole list no longer fits 150 s, and was cut
    # at 17% in the e1b325e run; `tests` runs it all)
    timeout 150 python3 -m pytest -q tests/test_gpu.py tests/test_kernel_gemv.py 2>&1 \
        | tail -15 > "$out/gpu_tests.log"; cat "$out/gpu_tests.log"
    timeout 240 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,32,64 --server-arg=--max-len=1536 \
        --server-arg=--log-timing --out "$work/load" 2>&1 | grep -v "active=" | tee "$out/load.log"
    grep "turn " "$work/load/server-engine.log" | python3 scripts/turn_timing.py 3,48,96,192 | tee -a "$out/load.log"
    grep -i "loop lag\|error\|traceback" "$work/load/server-engine.log" | tail -8 | tee -a "$out/load.log"
    timeout 200 python3 -m latency_bench "${bench[@]}" --baseline naive --only-baseline --baseline-concurrency 1,4 \
        --baseline-turns 1 --concurrency 1,4 --server-arg=--max-len=1536 --out "$work/naive" 2>&1 | grep -v "active=" | tee "$out/naive.log"
    cp "$work/load/results.json" "$out/load.json"; cp "$work/load/ttfa_throughput.png" "$out/ttfa_throughput.png"
    cp "$work/naive/results.json" "$out/naive.json"
    ;;
fp8)
    timeout 240 python3 -m pytest -q "${fp8_tests[@]}" 2>&1 | tee "$out/fp8_tests.log"
    timeout 300 python3 -m latency_bench.kernel_bench --out "$out/kernel_bench" 2>&1 | tee "$out/kernel_bench.log"
    ;;
sweep)
    # FP8 kernel tests compiled, then the GEMM's tile sweep (kernels/fp8_configs.py comes from it)
    timeout 200 python3 -m pytest -q "${fp8_tests[@]}" > "$out/fp8_tests.log" 2>&1; tail -5 "$out/fp8_tests.log"
    timeout 380 python3 -m latency_bench.kernel_sweep --out "$out/kernel_sweep" 2>&1 | tee "$out/kernel_sweep.log"
    ;;
adopt)
    # sweep, adopt and measure in one call: the FP8 GPU tests, the tile sweep written into this
    # copy's kernels/fp8_configs.py (it comes back in $out to be committed), then the engine
    # step with FP8 on that table against bf16 (same run; batch 54: the c=64 load's mean
    # batch). SWEEP_ARGS adds sweep flags, SWEEP_S its time limit (default 260 s):
    # SWEEP_ARGS="--tma --no-warp-specialize" SWEEP_S=200 TESTS_S=200 adopts the TMA kernel where it wins
    # (2026-12-06, H100: the whole sweep took 94 s; TESTS_S=60 cut the FP8 tests short, they need ~200 s)
    if [ "${TESTS_S:-130}" != 0 ]; then  # TESTS_S=0: no tests
        timeout ${TESTS_S:-130} python3 -m pytest -q "${fp8_tests[@]}" tests/test_gpu.py -k "fp8 or cublas or batch" > "$out/fp8_tests.log" 2>&1
        tail -8 "$out/fp8_tests.log"
    fi
    timeout ${SWEEP_S:-260} python3 -m latency_bench.kernel_sweep ${SWEEP_ARGS:-} --write-configs kernels/fp8_configs.py --out "$out/kernel_sweep" 2>&1 \
        | tee "$out/kernel_sweep.log" | grep -A80 "^TUNED with"
    cp kernels/fp8_configs.py "$out/"
    for q in fp8 none; do
        timeout 80 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,54,64 --quant $q \
            --skip-eager --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 | grep -v Warn | tail -8
    done
    ;;
kvfp8)
    # the FP8 KV cache: its kernel and engine tests compiled, the engine step with it against
    # the bf16 cache (same run; FP8 weights) at two contexts, then the FP8 load sweep with it
    timeout 110 python3 -m pytest -q tests/test_kernel_decode_attention.py tests/test_kernel_qk_rope_kv.py tests/test_kv_fp8.py \
        tests/test_gpu.py -k "fp8 or alone or sync or store" > "$out/kv_tests.log" 2>&1; tail -4 "$out/kv_tests.log"
    for ctx in 400 1000; do
        timeout 100 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant fp8 \
            --kv-quant none,fp8 --steps 30 --context $ctx --max-len 1536 --prompt-lengths 300 --out "$out/engine_kv_$ctx" \
            2>&1 | grep -v Warn | grep "^ \|against\|segments"
    done
    # the load sweep only if the FP8 cache made the batch-64 step at context 1000 faster
    kv_fp8_faster "$out/engine_kv_1000/engine_bench.json" || exit 0
    work=/tmp/kvload; rm -rf "$work"; mkdir -p "$work"
    timeout 250 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,32,64 --server-arg=--max-len=1536 \
        --server-arg=--quant=fp8 --server-arg=--kv-quant=fp8 --server-arg=--log-timing --out "$work/load" 2>&1 \
        | grep -v "active=" | tee "$out/load.log"
    cp "$work/load/results.json" "$out/load-fp8-kvfp8.json"
    ;;
kvfp8-short)
    # the FP8 KV cache's read path again after a kernel change: its tests, the engine step at
    # context 1000 against the bf16 cache, and if faster, the load at c=16 and 64
    timeout 60 python3 -m pytest -q tests/test_kernel_decode_attention.py tests/test_kv_fp8.py 2>&1 | tail -2
    timeout 90 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant fp8 \
        --kv-quant none,fp8 --steps 30 --context 1000 --max-len 1536 --prompt-lengths 300 --out "$out/engine_kv_1000" \
        2>&1 | grep -v Warn | grep "^ \|against\|segments"
    kv_fp8_faster "$out/engine_kv_1000/engine_bench.json" || exit 0
    work=/tmp/kvload; rm -rf "$work"; mkdir -p "$work"
    timeout 130 python3 -m latency_bench "${bench[@]}" --concurrency 16,64 --server-arg=--max-len=1536 \
        --server-arg=--quant=fp8 --server-arg=--kv-quant=fp8 --out "$work/load" 2>&1 | grep -v "active=" | tail -6
    cp "$work/load/results.json" "$out/load-fp8-kvfp8-c16-64.json"
    ;;
codecpolicy)
    # issue 5's c=64 gap: the codec's share of the GPU and its queue. The same load at
    # c=32,64 ($CONCURRENCY) under codec policies name:hold-lead:max-chunk[:first-frames],
    # one server each; $VARIANTS overrides the list; CODEC_TEST=0 skips the GPU test
    if [ "${CODEC_TEST:-1}" != 0 ]; then timeout 120 python3 -m pytest -q tests/test_gpu.py -k "codec_graphs" 2>&1 | tail -3; fi
    for variant in ${VARIANTS:-base:0.3:4 hold1:1.0:4 chunk8:1.0:8}; do
        IFS=: read -r name hold chunk first <<< "$variant"
        work=/tmp/codecpolicy-$name; rm -rf "$work"; mkdir -p "$work"
        echo "== $name: --codec-hold-lead $hold --codec-max-chunk $chunk --codec-first-frames ${first:-1}"
        timeout 170 python3 -m latency_bench "${bench[@]}" --concurrency "${CONCURRENCY:-32,64}" --server-arg=--max-len=1536 \
            --server-arg=--codec-hold-lead=$hold --server-arg=--codec-max-chunk=$chunk --server-arg=--codec-first-frames=${first:-1} \
            --out "$work/load" 2>&1 | grep -v "active=" | tail -6
        cp "$work/load/results.json" "$out/load-codec-$name.json"
    done
    ;;
fp8load)
    # the FP8 load sweep (the README's FP8 reference run) and its gate against load-fp8.json
    work=/tmp/fp8load; rm -rf "$work"; mkdir -p "$work"
    timeout 180 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,32,64 --server-arg=--max-len=1536 \
        --server-arg=--quant=fp8 --out "$work/load" 2>&1 | grep -v "active=" | tail -8
    cp "$work/load/results.json" "$out/load-fp8.json"; cp "$work/load/ttfa_throughput.png" "$out/" 2>/dev/null
    gate load-fp8
    ;;
attention)
    # the decode-attention kernel alone, bf16 against FP8 KV cache, over split / block / warps / stages (~3 min)
    timeout 300 python3 -m latency_bench.attention_bench --batch 64 --context 1000 --stages 1,2,3 \
        --out "$out/attention_bench" 2>&1 | tee "$out/attention_bench.log" | sort -t: -k2 -n | head -12
    tail -1 "$out/attention_bench.log"
    ;;
ncu)
    # Nsight Compute's counters for the step's heaviest kernels (latency_bench/ncu_kernels.py):
    # the FP8 linear layers at M = 1 and 54, decode attention over bf16 and FP8 KV caches at
    # batch 54, context 800 (the FP8 one also at the launch that was fastest on the H100).
    # Why each is ~2x its bytes floor: DRAM throughput, stall reasons, issue, occupancy.
    # NCU_SOURCE=1 adds the stall samples by source line (SourceCounters, the Python lines
    # imported) for the kernels matching NCU_KERNELS (a regex; default decode attention);
    # untried on the device so far (the part without it ran on 2026-12-06).
    # (~2 min; needs a Firecracker machine, where ncu reads counters: device KINDS.md)
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    source_args=()
    if [ "${NCU_SOURCE:-0}" = 1 ]; then
        source_args=(--section SourceCounters --section WarpStateStats --import-source yes
                     -k "regex:${NCU_KERNELS:-decode_attention}")
    fi
    timeout 400 "$ncu_bin" --profile-from-start off --clock-control none --nvtx \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis "${source_args[@]}" \
        -o "$out/ncu" -f python3 -m latency_bench.ncu_kernels --m 1,54 --batch 54 --context 800 \
        --fp8-launch 512,32,1,3 > "$out/ncu_run.log" 2>&1; tail -3 "$out/ncu_run.log"
    "$ncu_bin" -i "$out/ncu.ncu-rep" --page details > "$out/ncu_details.txt" 2>&1
    "$ncu_bin" -i "$out/ncu.ncu-rep" --page raw --csv > "$out/ncu_raw.csv" 2>&1
    [ "${NCU_SOURCE:-0}" = 1 ] && "$ncu_bin" -i "$out/ncu.ncu-rep" --page source --csv > "$out/ncu_source.csv" 2>&1
    grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible" \
        "$out/ncu_details.txt" | head -150
    ;;
mlpfused)
    # the MLP block's two FP8 GEMMs in one persistent launch (kernels/fp8_mlp.py, quant mode
    # fp8-mlp-one-launch; measured 2026-12-06 on an H100, slower: reference/h100-s2pro/mlp-one-launch/): its GPU tests (the two launches'
    # bits, eager and replayed in a graph), the MLP block at M = 1, 16, 54, 64 beside the
    # two-launch paths, then the engine step in fp8 and fp8-mlp-one-launch (~6 min)
    timeout 150 python3 -m pytest -q tests/test_kernel_fp8_mlp.py tests/test_quant.py -k "mlp or one_launch" 2>&1 | tail -2
    timeout 150 python3 -m latency_bench.kernel_bench --shapes none --mlp-m 1,16,54,64 --out "$out/kernel_mlp" 2>&1 \
        | grep "^MLP" | tee "$out/kernel_mlp.log"
    for q in fp8 fp8-mlp-one-launch; do
        timeout 110 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,54,64 --quant $q \
            --skip-eager --steps 30 --context 800 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 \
            | grep -v Warn | grep "^ *[0-9]" | sed "s/^/$q: /"
    done
    ;;
fp8check)
    # the next FP8 questions in one call: the attention sweep above, then the kernel table
    # (GEMMs vs _scaled_mm, the MLP at M = 1) on the adopted launch table (~6 min)
    bash "$0" attention
    timeout 200 python3 -m latency_bench.kernel_bench --out "$out/kernel_bench" 2>&1 | grep -v "^  (skipped" \
        | tee "$out/kernel_bench.log" | tail -30
    ;;
attnlaunch)
    # decode attention's measured launch (kernels/decode_attention.py launch_choice) against
    # the short splits it replaced: the kernel's GPU tests, then the engine step at context
    # 1000 with a bf16 and an FP8 KV cache, under each launch (~4 min)
    timeout 150 python3 -m pytest -q tests/test_kernel_decode_attention.py tests/test_gpu.py 2>&1 | tail -3
    for launch in short measured; do
        timeout 170 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --steps 30 \
            --context 1000 --max-len 1536 --prompt-lengths 300 --kv-quant none,fp8 --attention-launch $launch \
            --out "$out/engine_attn_$launch" 2>&1 | grep -v Warn | tail -9
    done
    ;;
fp8e2e)
    # FP8 tests compiled, the engine step with FP8 and with bf16 (same run), the kernel table
    timeout 150 python3 -m pytest -q "${fp8_tests[@]}" tests/test_step_kernels.py > "$out/fp8_tests.log" 2>&1; tail -4 "$out/fp8_tests.log"
    for q in fp8 none; do
        timeout 150 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant $q \
            --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 | grep -v Warn | tail -12
    done
    timeout 150 python3 -m latency_bench.kernel_bench --out "$out/kernel_bench" 2>&1 | grep -v "^  (skipped" | tee "$out/kernel_bench.log"
    ;;
profile)
    timeout 200 python3 -m latency_bench.profile_step --model s2-pro --device cuda --batch 1,64 --steps 5 \
        --out "$out/profile" 2>&1 | tee "$out/profile.log"
    ;;
engine-s1)
    timeout 300 python3 -m latency_bench.engine_bench --model s1-mini --device cuda --batch 1,4,16,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 100,300,1000 --out "$out/s1" 2>&1 | tee "$out/engine_bench_s1.log"
    ;;
engine)
    timeout 560 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,2,4,8,16,32,48,64 \
        --steps 30 --context 400 --max-len 1536 --prompt-lengths 100,300,1000 --out "$out" 2>&1 | tee "$out/engine_bench.log"
    ;;
load)
    timeout 560 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,64 --server-arg=--max-len=1536 \
        --out "$out/load" 2>&1 | tee "$out/load.log"
    ;;
load+naive)
    timeout 330 python3 -m latency_bench "${bench[@]}" --concurrency 1,16,64 --server-arg=--max-len=1536 \
        --out "$out/load" 2>&1 | tee "$out/load.log"
    timeout 230 python3 -m latency_bench "${bench[@]}" --baseline naive --only-baseline --baseline-concurrency 1,4 \
        --baseline-turns 1 --concurrency 1,4 --server-arg=--max-len=1536 --out "$out/naive" 2>&1 | tee "$out/naive.log"
    ;;
timing)
    timeout 300 python3 -m latency_bench "${bench[@]}" --concurrency 1 --turns 3 --max-new-tokens 60 \
        --server-arg=--max-len=1536 --server-arg=--log-timing --out "$out/timing" 2>&1 | grep -v "^  c=" | tee "$out/timing.log"
    grep "turn " "$out/timing/server-engine.log"
    ;;
diagnose)
    timeout 500 python3 -m latency_bench.diagnose --model s2-pro --device cuda --codec-batch 1,16,64 \
        --codec-frames 1,2,4 --concurrency 1,16 --frames 100 --out "$out/diagnose" 2>&1 | tee "$out/diagnose.log"
    ;;
naive)
    timeout 560 python3 -m latency_bench "${bench[@]}" --baseline naive --only-baseline --baseline-concurrency 1,4 \
        --baseline-turns 1 --concurrency 1,4 --server-arg=--max-len=1536 --out "$out/naive" 2>&1 | tee "$out/naive.log"
    ;;
convhist)
    # conv_input's history in programs of its own (the working tree) against the history
    # tile in every program (ab/conv_input_everywhere.patch, applied after the first half):
    # the codec kernels' compiled tests and GPU tests, the codec call times, then c=64 load
    # with per-turn timing, once with --codec-first-frames=2 (~9 min)
    work=/tmp/convhist; rm -rf "$work"; mkdir -p "$work"
    timeout 200 python3 -m pytest -q tests/test_kernel_conv_state.py tests/test_kernel_snake.py tests/test_kernel_residual.py \
        tests/test_kernel_snake_train.py tests/test_gpu.py -k "not fp8" 2>&1 | tail -8 | tee "$out/gpu_tests.log"
    timeout 90 python3 -m latency_bench.profile_codec --model s2-pro --batch 64 --profile-batch 64 --ops 12 \
        --out "$out/profile_codec" 2>&1 | grep -v Warn | tee "$out/profile_codec.log"
    for ff in 1 2; do
        timeout 130 python3 -m latency_bench "${bench[@]}" --concurrency 64 --server-arg=--max-len=1536 \
            --server-arg=--log-timing --server-arg=--codec-first-frames=$ff --out "$work/load-ff$ff" 2>&1 \
            | grep -v "active=" | tail -6 | tee -a "$out/load.log"
        grep "turn " "$work/load-ff$ff/server-engine.log" | python3 scripts/turn_timing.py 192 | tee -a "$out/load.log"
        cp "$work/load-ff$ff/results.json" "$out/load-ff$ff.json"
    done
    if [ -f ab/conv_input_everywhere.patch ]; then
        patch -p1 < ab/conv_input_everywhere.patch && timeout 80 python3 -m latency_bench.profile_codec --model s2-pro \
            --batch 64 --profile-batch 64 --ops 12 --out "$out/profile_codec_before" 2>&1 | grep -v Warn \
            | tee "$out/profile_codec_before.log"
    fi
    ;;
secondframe)
    # each segment's second frame made by the prefill thread (the default) against the
    # decode batch making it (--no-prefill-second-frame), same call: the GPU tests, then
    # the load sweep with per-turn timing, both ways (~7 min)
    work=/tmp/secondframe; rm -rf "$work"; mkdir -p "$work"
    # (GPU_TESTS=0 skips the tests; CONCURRENCY: the default's levels, BASE_CONCURRENCY the
    # baseline's; TURN_GROUPS: turns per level for the per-turn timing, 3 per connection)
    if [ "${GPU_TESTS:-1}" != 0 ]; then
        timeout 200 python3 -m pytest -q --tb=short tests/test_gpu.py tests/test_kernel_snake.py -k "not fp8" 2>&1 \
            | grep -v "^  \|Warning\|warn" | tail -40 | tee "$out/gpu_tests.log"
    fi
    for way in prefill decode; do
        flag=""; levels=${CONCURRENCY:-1,16,64}
        if [ "$way" = decode ]; then flag="--server-arg=--no-prefill-second-frame"; levels=${BASE_CONCURRENCY:-$levels}; fi
        timeout 240 python3 -m latency_bench "${bench[@]}" --concurrency $levels --server-arg=--max-len=1536 \
            --server-arg=--log-timing $flag --out "$work/load-$way" 2>&1 | grep -v "active=" | tail -9 | tee -a "$out/load.log"
        grep "turn " "$work/load-$way/server-engine.log" | python3 scripts/turn_timing.py ${TURN_GROUPS:-3,48,192} \
            | tee -a "$out/load.log"
        cp "$work/load-$way/results.json" "$out/load-f1-$way.json"
    done
    ;;
gemv)
    # the small-batch GEMV (kernels/gemv.py): its tests and the engine's GPU tests, the
    # launch sweep written into kernels/gemv_configs.py (returned in $OUT), the kernel
    # against cuBLAS / the FP8 GEMM, then the engine step with and without it, bf16 (~9 min)
    timeout 200 python3 -m pytest -q --tb=short tests/test_kernel_gemv.py tests/test_gpu.py tests/test_step_kernels.py \
        > "$out/gpu_tests.log" 2>&1; grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | tail -12
    timeout 300 python3 -m latency_bench.gemv_bench --sweep --write-configs --out "$out" 2>&1 | grep -v "^    ([A-Z]" \
        | tee "$out/gemv_bench.log"
    cp kernels/gemv_configs.py "$out/"
    timeout 200 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,2,4,8,16,64 --skip-eager \
        --gemv-baseline --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine" 2>&1 \
        | grep -v Warn | tee "$out/engine_bench.log"
    ;;
gemv-profile)
    # the GEMV's table without a sweep (incl. the FP8 GEMV on pre-quantized activations and
    # the MLP block as four launches), then what the batch-1 step's GPU time is made of
    # now that its GEMMs are GEMVs (~3 min)
    timeout 200 python3 -m latency_bench.gemv_bench --out "$out" 2>&1 | grep -v "^    ([A-Z]" | tee "$out/gemv_bench.log"
    timeout 100 python3 -m latency_bench.profile_step --model s2-pro --device cuda --batch 1 --steps 5 \
        --out "$out/profile" 2>&1 | grep -v Warn | head -40 > "$out/profile.log"; head -30 "$out/profile.log"
    ;;
pdl)
    # programmatic dependent launch (kernels/pdl.py): whether this Triton and GPU have it, the
    # GEMV and MLP tables with PDL off / on, the engine step bf16 and FP8 as the runner
    # captures it (PDL at engine/runner.py PDL_BATCHES) against PDL nowhere and everywhere
    # (same run each), then the serving path's GPU tests (~8 min)
    python3 -c "from kernels import pdl; print('PDL:', pdl.supported('cuda') or 'supported', '| self-check:', pdl.self_check('cuda') or 'passed')" \
        2>&1 | tail -3 | tee "$out/pdl.txt"
    timeout 150 python3 -m latency_bench.gemv_bench --pdl off,on --m 1 --out "$out" 2>&1 \
        | grep -v "^    ([A-Z]" | tee "$out/gemv_bench.log"
    for q in none fp8; do
        timeout 150 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant $q --skip-eager \
            --pdl-baseline --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 \
            | grep -v Warn | tee "$out/engine_bench_$q.log"
    done
    timeout 150 python3 -m pytest -q --tb=short tests/test_pdl.py tests/test_kernel_gemv.py tests/test_gpu.py > "$out/gpu_tests.log" 2>&1
    grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | tail -12
    ;;
pdlgate)
    # PDL as the runner uses it, gated: the serving path's GPU tests, the FP8 engine step
    # against PDL nowhere / everywhere, then the load at c=1,16,64 in FP8 and in bf16, each
    # gated against its frozen reference (load-fp8.json, load.json) (~9.5 min)
    timeout 80 python3 -m pytest -q --tb=short tests/test_pdl.py tests/test_gpu.py -k "pdl or batched or graphs or second" \
        > "$out/gpu_tests.log" 2>&1; grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | tail -6
    timeout 80 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant fp8 --skip-eager \
        --pdl-baseline --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_fp8" 2>&1 \
        | grep -v Warn | tee "$out/engine_bench_fp8.log" | grep -v prefill
    gated_load fp8 150
    gated_load none 190
    ;;
sample)
    # the sampling kernel's gathered draw (kernels/sample.py): its GPU tests and the
    # runner's sampled frames against PyTorch, the walk vs gathered benchmark, then the
    # FP8 load at c=1,16,64 gated against load-fp8.json (~5 min)
    timeout 100 python3 -m pytest -q --tb=short tests/test_kernel_sample.py tests/test_step_kernels.py \
        > "$out/gpu_tests.log" 2>&1; grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | tail -6
    timeout 90 python3 -m latency_bench.sample_bench --out "$out" 2>&1 | grep -v Warn | tee "$out/sample_bench.log"
    gated_load fp8 170
    ;;
heads)
    # fp32 sampling-head logits and the FP8 GEMM's unrolled split-K sum (and, when it ran,
    # the scales loaded one group ahead, since taken out), against the tree before them in
    # the same call (unpack_base): the serving path's and the FP8 GPU tests with the gate
    # printed, the FP8 kernel table, the engine step in FP8 and bf16, each both sides (~9.5 min)
    timeout 140 python3 -m pytest -q -s --tb=short tests/test_gpu.py tests/test_kernel_gemv.py tests/test_quant.py \
        tests/test_kernel_fp8_gemm.py -k "not sweep" > "$out/gpu_tests.log" 2>&1
    grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | grep "passed\|failed\|error\|frames equal\|FAIL" | tail -8
    unpack_base
    for side in new base; do
        dir=$PWD; [ $side = base ] && dir=/tmp/base
        (cd "$dir" && PYTHONPATH="$dir:/tmp/site" timeout 100 python3 -m latency_bench.kernel_bench --m 1,16,64 \
            --replays 10 --out "$out/kernel_$side" 2>&1 | grep -v Warn | tail -22 > "$out/kernel_$side.log")
        for q in fp8 none; do
            (cd "$dir" && PYTHONPATH="$dir:/tmp/site" timeout 75 python3 -m latency_bench.engine_bench --model s2-pro \
                --device cuda --batch 1,16,64 --quant $q --skip-eager --steps 30 --context 400 --max-len 1536 \
                --prompt-lengths 300 --out "$out/engine_${q}_$side" 2>&1 | grep -v Warn | grep "^ *[0-9]\|step\|graphs" \
                | tail -5 | sed "s/^/$side $q: /")
        done
    done
    cat "$out/kernel_new.log"; echo "--- base"; cat "$out/kernel_base.log"
    ;;
ab64)
    # TTFA at c=64 in FP8 against the tree before the fp32 heads and the unrolled split-K sum
    # (unpack_base), same call, this tree first (~7 min)
    unpack_base
    for side in new base; do
        dir=$PWD; [ $side = base ] && dir=/tmp/base
        (cd "$dir" && PYTHONPATH="$dir:/tmp/site" timeout 190 python3 -m latency_bench "${bench[@]}" --concurrency 64 \
            --server-arg=--max-len=1536 --server-arg=--quant=fp8 --out "$out/ab64_$side" 2>&1 | grep -v "active=" \
            | grep "^  64" | sed "s/^/$side: /")
    done
    ;;
fp8gate)
    # headsgate's second half with room: the GPU tests given 240 s (150 s cut them after 33
    # passed), then the FP8 load at c=1,16,64 gated against load-fp8.json given 300 s (160 s
    # cut it: the FP8 service's start compiles more kernel variants now) (~9 min)
    serving_tests 240
    start=$(date +%s); gated_load fp8 300; echo "FP8 load: $(( $(date +%s) - start )) s"
    ;;
headsgate)
    # the fp32 sampling heads and the unrolled split-K sum, gated: serving_tests, then the
    # load at c=1,16,64 in FP8 and in bf16, each against its frozen reference (~9 min; the
    # limits proved short on a fresh machine: fp8gate has the FP8 half with room)
    serving_tests 150
    gated_load fp8 160
    gated_load none 200
    ;;
firstframes)
    # issue 5's underruns at c=64: in the 2026-12-05 call (priority/) they began after a
    # turn's first frame (46 ms of audio), before the second came, although the prefill
    # thread makes it. A turn's first audio of two frames (--codec-first-frames=2) against
    # the default 1, bf16, same call, each one server, c=1 and 16 once and c=64 three
    # times (a c=64 level is ~10 s of load; one run is noisy) (~6 min)
    ab_loads first 1,16,64,64,64 580 ${VARIANTS:-1:--codec-first-frames=1 2:--codec-first-frames=2}
    ;;
thirdframe)
    # issue 5's underruns at c=64 after a turn's first two or three frames: the prefill
    # thread's third frame too (--prefill-third-frame) against the second only (the
    # default), bf16, same call, c=16 once and c=64 three times; the engine's GPU test
    # with it first (~7 min). Measured 2026-12-05 and not kept: `git apply
    # latency_bench/reference/h100-s2pro/third-frame/prefill-third-frame.diff` first
    timeout 100 python3 -m pytest -q --tb=short -rfE tests/test_gpu.py -k "batched_equals_alone" \
        > "$out/gpu_tests.log" 2>&1; grep "passed\|failed\|error" "$out/gpu_tests.log" | tail -3
    ab_loads frames 16,64,64,64 480 ${VARIANTS:-second third:--prefill-third-frame}
    ;;
h200adopt)
    # adopt with the TMA sweep and without the FP8 tests (~200 s, for a later call), then
    # issue 7's kernel table (GEMMs vs _scaled_mm, MLP block at M = 1) on the new table (~8 min)
    TESTS_S=0 SWEEP_ARGS="--tma --no-warp-specialize" SWEEP_S=${SWEEP_S:-200} bash "$0" adopt
    timeout 110 python3 -m latency_bench.kernel_bench --out "$out/kernel_bench" 2>&1 | grep -v "^  (skipped" \
        | tee "$out/kernel_bench.log" | tail -12
    ;;
sharedprefix|h100next)
    # shared voice prefix reads (on by default since 2026-12-06, --no-shared-prefix-reads
    # the baseline; kernels/decode_attention.py): the kernel's and the runner's tests compiled (graphs
    # too), decode attention alone at batch 64 with the load's ~340-position voice prompt
    # shared against own rows (both caches), then load A/Bs, one server per arm
    timeout 120 python3 -m pytest -q --tb=short -rfE tests/test_kernel_decode_attention.py tests/test_shared_prefix.py \
        > "$out/gpu_tests.log" 2>&1; grep "passed\|failed\|error" "$out/gpu_tests.log" | tail -3
    for ctx in 700 1000; do
        timeout 60 python3 -m latency_bench.attention_bench --batch 64 --context $ctx --shared-prefix 340 \
            --out "$out/attention_$ctx" 2>&1 | grep "prefix"
    done
    if [ "$part" = sharedprefix ]; then
        ab_loads shared 16,64,64 ${LOAD_S:-390} ${VARIANTS:-own:--no-shared-prefix-reads shared}
    else  # as run on 2026-12-06 (before shared reads were the default; now fp8 and fp8first2 share)
        ab_loads next 64,64 ${LOAD_S:-420} ${VARIANTS:-fp8:--quant=fp8,--no-shared-prefix-reads fp8first2:--quant=fp8,--codec-first-frames=2,--no-shared-prefix-reads fp8shared:--quant=fp8}
    fi
    ;;
prefillblocked)
    # the segment prefill's attention through kernels/prefill_attention.py (a block of 16
    # new positions per program; the default since 2026-12-06) against one decode query
    # per position (--prefill-attention per-query): its tests and the chunked prefill's
    # compiled, the engine's prefill (one prompt, 16 segments after a 340-position voice)
    # both ways in one run, then the load (bf16) with per-query against the default
    timeout 150 python3 -m pytest -q --tb=short -rfE tests/test_kernel_prefill_attention.py tests/test_chunked_prefill.py \
        tests/test_gpu.py -k "prefill or batched or graphs" > "$out/gpu_tests.log" 2>&1
    grep "passed\|failed\|error" "$out/gpu_tests.log" | tail -3
    timeout 120 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16 --skip-eager \
        --prefill-attention blocked,per-query --steps 10 --context 400 --max-len 1536 --prompt-lengths 300 \
        --out "$out/engine_prefill" 2>&1 | grep -v Warn | grep "prefill"
    ab_loads prefill 16,64,64 ${LOAD_S:-330} ${VARIANTS:-per-query:--prefill-attention=per-query blocked}
    ;;
arms)
    # the cascade decode attention (--prefix-cascade; kernels/cascade_attention.py) in FP8
    # (issue 7's serving mode) against the default (shared prefix reads, blocked prefill):
    # its GPU tests, the cascade alone (own rows / shared reads / cascade, and the
    # cascade's own part in 128- and 256-position splits), the engine step at batch 54 and
    # 64 with a shared 340-position voice prompt (own rows / shared reads / cascade) and
    # the prefill blocked vs per-query, then the load at c=64 twice per arm (~8 min; the
    # limits add up to under 600 s). As run on 2026-12-06 (`0c97cac`, RESULTS.md) the
    # prefill default was per-query and a third load arm was --prefill-attention=blocked.
    timeout 120 python3 -m pytest -q --tb=short -rfE tests/test_kernel_cascade_attention.py tests/test_shared_prefix.py \
        tests/test_kernel_prefill_attention.py > "$out/gpu_tests.log" 2>&1; grep "passed\|failed\|error" "$out/gpu_tests.log" | tail -3
    for ctx in 700 1000; do
        timeout 50 python3 -m latency_bench.attention_bench --batch 64 --context $ctx --shared-prefix 340 --cascade --cascade-splits 128,256 \
            --out "$out/attention_cascade_$ctx" 2>&1 | grep -i "prefix\|cascade"
    done
    timeout 150 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 54,64 --quant fp8 --skip-eager \
        --shared-prefix 340 --prefill-attention blocked,per-query --steps 30 --context 800 --max-len 1536 \
        --prompt-lengths 300 --out "$out/engine_arms" 2>&1 | grep -v Warn | tee "$out/engine_arms.log" | grep -v "prefill [ 0-9]* tokens"
    ab_loads arms 64,64 ${LOAD_S:-220} ${VARIANTS:-fp8:--quant=fp8 cascade:--quant=fp8,--prefix-cascade}
    ;;
firstreplay)
    # engine/graphs.py replays every graph once after capturing it (the driver uploads a
    # graph on its first launch): what that first launch costs per graph family with the
    # replay off, bf16 and FP8 with PDL on every decode graph (whose first c=64 run had a
    # second-long tail, RESULTS.md), then the graph paths' GPU tests with the replay on
    # and the FP8 load at c=64 twice (does the server's first run still have the longest tail?)
    timeout 130 python3 -m latency_bench.first_replay --out "$out/first_replay_bf16" 2>&1 | grep -v Warn | tail -3
    timeout 130 python3 -m latency_bench.first_replay --quant fp8 --pdl-all-batches --out "$out/first_replay_fp8_pdlall" \
        2>&1 | grep -v Warn | tail -3
    # (the tests ran past 120 s on an H200, 2026-12-06, with none failed)
    timeout 200 python3 -m pytest -q --tb=short -rfE tests/test_gpu.py tests/test_shared_prefix.py tests/test_chunked_prefill.py \
        > "$out/gpu_tests.log" 2>&1; grep "passed\|failed\|error" "$out/gpu_tests.log" | tail -3
    ab_loads firstreplay 64,64 ${LOAD_S:-170} ${VARIANTS:-fp8:--quant=fp8}
    ;;
firsttail)
    # the server's first c=64 run after start has had the longest TTFA tail and most
    # underruns (2026-12-06 on the H200, FP8: p99 1,014 ms and 28 underruns, then 83 ms
    # and 0; not when c=1 and c=16 ran first), and replaying every graph after capture
    # did not remove it: where those turns' time went (--log-timing: say -> prefill ->
    # first audio, per run), the server's GC pauses and stalled-loop stacks
    # (--debug-stalls), the client's own loop lag (results.json), c=64 twice in FP8
    # (QUANTS="fp8 none": bf16 too, a server each)
    first_tail "${QUANTS:-fp8}" ${LOAD_S:-200}
    ;;
tailfix)
    # 2026-12-07: the first c=64 run's tail with the codec worker flushing a run of
    # segment ends as one batch (engine/codec_worker.py; the tail was 2nd turns waiting
    # ~0.5 s between prefill and first audio): firsttail in FP8 (a fresh server, c=64
    # twice, per-turn timing), then bf16 on fresh servers, c=64 twice each: the default
    # (its first run is the bf16 first-run tail) against --codec-busy-streams 32 (a turn's
    # first audio of two frames once 32 streams speak, for bf16's 2-4 underruns at c=64;
    # below 32 the default's one frame, so c=1 and 16 are the default's by construction)
    # (~6 min; "default" is the guard off, as the default was then)
    first_tail "${TAIL_QUANTS:-fp8}" ${LOAD_S:-150}
    ab_loads busy 64,64 ${BUSY_S:-260} ${VARIANTS:-default:--codec-busy-streams=0 busy:--codec-busy-streams=32}
    ;;
capacity)
    # issue 5's "largest concurrency one H200 holds within the TTFA targets": the reference
    # workload past 64 streams (--max-running is the largest level: 128), bf16 at c=64,
    # 96, 128 and FP8 at 96, 128, a server each; then the naive baseline at c=1 (one turn)
    # in the same call (~9 min)
    capacity_sweep ${CAP_S:-250} ${CAP_FP8_S:-200} ${NAIVE_S:-100}
    ;;
h200cap)
    # the capacity part past 64 streams on an H200 (bf16 c=96,128 and FP8 96,128 with
    # --max-running 128), after h200next on the same warm machine (~7 min)
    CAP_LEVELS=96,128 capacity_sweep ${CAP_S:-200} ${CAP_FP8_S:-200} ${NAIVE_S:-0}
    ;;
h200short)
    # h200next's bf16 half, for a short budget on a fresh machine (its first server pays the
    # cold Triton/cuDNN caches: an FP8 server took 149 s to start on a fresh H100): the
    # reference load in bf16 (issue 5's setting) gated against the H200's reference, then
    # bf16 at c=96,128 (~8 min)
    gated_load none ${BF16_S:-290}
    CAP_LEVELS=96,128 capacity_sweep ${CAP_S:-180} 0 0
    ;;
busygate|h200next)
    # the defaults with --codec-busy-streams 32 on (2026-12-07): the reference load at
    # c=1,16,64 in FP8 and in bf16, each gated against this card's frozen reference (the
    # H200's were made with the guard off: its FP8 c=64 TTFA p50 may fail by the guard's
    # ~6 ms, as on the H100) (~9 min; the time limits leave room for a fresh machine's cold
    # Triton/cuDNN caches: an FP8 server took 149 s to start on a fresh H100, 86 s warm).
    # On an H200, then `h200cap` on the warm machine.
    gated_load fp8 ${FP8_S:-300}
    gated_load none ${BF16_S:-250}
    ;;
capbusy)
    # the capacity sweep's c=96 and 128 (LEVELS) with a turn's first audio of two frames
    # once 32 streams speak (--codec-busy-streams 32, the default since 2026-12-07; without
    # it the underruns there began at a turn's start, H100: bf16 5 at c=96, 34 at 128, FP8
    # 55 at 128), bf16 and FP8, a server each (~6 min); the guard off:
    # VARIANTS="bf16:--codec-busy-streams=0 fp8:--quant=fp8,--codec-busy-streams=0"
    ab_loads capbusy ${LEVELS:-96,128} ${LOAD_S:-420} ${VARIANTS:-bf16busy fp8busy:--quant=fp8}
    ;;
fp8arms)
    # FP8 at c=64 with the blocked prefill (the default since 2026-12-06), the two arms
    # still open on top of it: a turn's first audio of 2 frames (underruns) and PDL on
    # every decode graph (--pdl-all-batches), each against the default, c=64 twice per arm,
    # one server each (~9 min)
    ab_loads fp8arms 64,64 ${LOAD_S:-540} ${VARIANTS:-fp8:--quant=fp8 first2:--quant=fp8,--codec-first-frames=2 pdlall:--quant=fp8,--pdl-all-batches}
    ;;
first2)
    # issue 5's underruns at c=64 with FP8 weights: a turn's first audio of 2 frames
    # (--codec-first-frames 2; measured in bf16 only: underruns 105 -> 6, TTFA p50 79 ->
    # 121 ms on an H200) against 1, both --quant fp8, same call, c=1, 16, 64 twice (~5.5 min)
    ab_loads first2 1,16,64,64 ${LOAD_S:-540} ${VARIANTS:-fp8:--quant=fp8 fp8first2:--quant=fp8,--codec-first-frames=2}
    ;;
cutin)
    # issue 5's gaps early in a reply at c=64: --codec-cut-in (a frame of a stream near
    # the start of its audio cuts the codec's round in progress short) against the
    # default, bf16, same call, c=16 once and c=64 three times (~5.5 min)
    ab_loads cut 16,64,64,64 500 ${VARIANTS:-default cutin:--codec-cut-in}
    ;;
tma)
    # issue 7: the TMA kernel (kernels/fp8_gemm_tma.py; built 2026-12-05 without a GPU):
    # its compiled tests, then its choices (tiles x splits x one program per unit or
    # persistent) against kernels/fp8_configs.py's in the same run, and cuBLAS's
    # block-scaled GEMM; nothing is adopted (--write-configs needs every M class).
    # 2026-12-05 on an H100 (call 8 of that session): the tests stalled at the first
    # warp-specialized persistent split case (now run in a child with a time limit) and
    # the sweep of 814 choices (M = 1,16,64 with warp specialization) did not finish
    # compiling in 400 s: so no warp specialization here and one M class per call
    # (~223 choices over the five shapes; TMA_M=16, 64, 128 in later calls) (~7 min).
    # -k names the test functions: that call's `-k "tma"` passed 39 tests before its limit
    # where it selects 12 here, as if every test matched (a "tma" in a parent node's name?)
    timeout 200 python3 -m pytest -q -rfE tests/test_kernel_fp8_gemm.py -k "test_tma_ or persistent_tma" 2>&1 | tail -8 | tee "$out/gpu_tests.log"
    timeout 330 python3 -m latency_bench.kernel_sweep --tma --no-warp-specialize --m ${TMA_M:-1} --out "$out/tma" 2>&1 \
        | grep -v Warn > "$out/tma_sweep.log"; grep -v "^  (" "$out/tma_sweep.log" | tail -32
    ;;
swiglu)
    # issue 7's MLP block (M = 1, target <= 26 us): the SwiGLU and its quantization in the
    # gate/up GEMM's epilogue (quant "fp8-swiglu-epilogue", engine/quant.py; built
    # 2026-12-05 without a GPU) against the unfused FP8 MLP: the compiled FP8 tests, the
    # kernel table with both MLP blocks, the engine step in both layouts, same call (~6 min)
    timeout 200 python3 -m pytest -q -rfE tests/test_kernel_fp8_gemm.py tests/test_quant.py 2>&1 | tail -6 \
        | tee "$out/gpu_tests.log"
    timeout 100 python3 -m latency_bench.kernel_bench --m 1,16,64 --replays 10 --out "$out/kernel" 2>&1 \
        | grep -v Warn | tail -22 | tee "$out/kernel.log"
    for q in fp8 fp8-swiglu-epilogue; do
        timeout 75 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant $q \
            --skip-eager --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 \
            | grep -v Warn | grep "^ *[0-9]\|step\|graphs" | tail -5 | sed "s/^/$q: /"
    done
    ;;
issue5ab)
    # issue 5's c=64 load in arms, one server each, all on one machine, c=64 twice each.
    # 2026-12-06 on an H100 (latency_bench/reference/h100-s2pro/codec-contention/): the
    # codec confined to 32 SMs 0.24x the frames/s (a green context; removed), the codec's
    # calls taking turns with the decode steps 0.16x (codec-alternate.diff there), a
    # shared release every 50 ms + bucket step 8 + cut-in 1.01x (the codec's GPU time a
    # frame 0.84x, padding 30% -> 5%, but TTFA p99 ~1.2 s) and cut-in alone 1.00x.
    # Now the split: the same load with the codec skipped (--codec-silent: silence of the
    # right length, no codec work) in bf16 and FP8, so what is left of the c=64 gap
    # without any codec shows (~9 min)
    ab_loads ab 64,64 560 ${VARIANTS:-default silent:--codec-silent fp8silent:--quant=fp8,--codec-silent fp8:--quant=fp8}
    ;;
retest)
    # the serving path's and the FP8 GPU tests with whole tracebacks (heads' 140 s cut the
    # failure report off), then the FP8 kernel table and the engine step in FP8 and bf16 (~8 min)
    timeout 300 python3 -m pytest -q -s --tb=short -rfE tests/test_gpu.py tests/test_quant.py \
        > "$out/gpu_tests.log" 2>&1
    grep -v "^  \|Warning\|warn" "$out/gpu_tests.log" | grep "passed\|failed\|error\|frames equal\|FAIL" | tail -14
    timeout 100 python3 -m latency_bench.kernel_bench --m 1,16,64 --replays 10 --out "$out/kernel" 2>&1 \
        | grep -v Warn | tail -22 | tee "$out/kernel.log"
    for q in fp8 none; do
        timeout 75 python3 -m latency_bench.engine_bench --model s2-pro --device cuda --batch 1,16,64 --quant $q \
            --skip-eager --steps 30 --context 400 --max-len 1536 --prompt-lengths 300 --out "$out/engine_$q" 2>&1 \
            | grep -v Warn | grep "^ *[0-9]\|step\|graphs" | tail -5 | sed "s/^/$q: /"
    done
    ;;
*) echo "unknown part $part"; exit 2 ;;
esac
