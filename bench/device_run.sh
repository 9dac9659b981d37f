#!/usr/bin/env bash
# One GPU-machine run (see bench/README_device.md): lay the tree out as the installed package, build the
# benchmark set for the local GPU, run the GPU tests and the benchmarks.  Logs and JSON go to $OUT.
#   bash bench/device_run.sh [all|tests|fwdtests|bwdtests|pagedtests|memcheck|serving|fwd|flex|dispatch|select|seqbuild|seqtune|
#                             seqeval|default|bwd|fp8|firstcall|confirmprobe|
#                             profilefirst]  (PROFILE_ARGS: e.g. --empty)
#   (several: "tests dispatch"); bwd: bench/bench_bwd.py (BWD_ARGS passes options, e.g. --quick)
#   default: bench/bench_default.py (what fmha_dsl.attention gives with default arguments; DEFAULT_PARTS picks parts;
#   every decision measured in the run unless DEFAULT_SHIPPED=1: then the shipped table's, as on a user's H200)
#   serving: bench/bench_serving.py (SERVING_ARGS, e.g. "--parts decode --quick"); memcheck: compute-sanitizer
#   over the serving GPU tests (MEMCHECK_K selects them)
set -uo pipefail
what=" ${*:-all} "
export OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r fmha_dsl /tmp/pkg/ && cp -r runtime /tmp/pkg/fmha_dsl/runtime \
  && cp -r grammar /tmp/pkg/fmha_dsl/grammar && cp -r kernelsets /tmp/pkg/fmha_dsl/kernelsets
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 FMHA_DSL_CACHE_DIR=/tmp/fmha-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
arch=$(python3 -P -c "from fmha_dsl.runtime.dispatch import detect_arch; print(detect_arch())")
if [[ $what == *" all "* || $what == *" fwd "* || $what == *" flex "* || $what == *" default "* ]]; then
  python3 -P -m fmha_dsl.cli build bench_fwd --arch "$arch" -o /tmp/bench -j 16 -q 2>&1 | tail -5 | tee "$OUT/build.log"
  cp /tmp/bench/build-report.json "$OUT/" 2>/dev/null
fi
if [[ $what == *" all "* || $what == *" tests "* || $what == *" fwdtests "* ]]; then   # fwdtests: this file alone
  python3 -P -m pytest -q tests/test_gpu.py -p no:cacheprovider -ra -x 2>&1 | tail -40 | tee "$OUT/test_gpu.log"
fi
if [[ $what == *" all "* || $what == *" tests "* || $what == *" bwdtests "* ]]; then
  python3 -P -m pytest -q tests/test_gpu_bwd.py -p no:cacheprovider -ra ${BWDTEST_ARGS:-} 2>&1 | tail -60 | tee "$OUT/test_gpu_bwd.log"
fi
if [[ $what == *" all "* || $what == *" pagedtests "* ]]; then
  FMHA_DSL_TUNE_CANDIDATES=${PAGED_CANDIDATES:-4} python3 -P -m pytest -q tests/test_gpu_paged.py -p no:cacheprovider -ra \
    ${PAGED_K:+-k "$PAGED_K"} 2>&1 | tail -40 | tee "$OUT/test_gpu_paged.log"
fi
if [[ $what == *" fp8 "* ]]; then   # FP8 serving: its GPU tests, the bench (FP8_ARGS, e.g. --quick), memcheck over the tests
  FMHA_DSL_TUNE_CANDIDATES=${PAGED_CANDIDATES:-4} python3 -P -m pytest -q tests/test_gpu_paged_fp8.py -p no:cacheprovider -ra \
    2>&1 | tail -30 | tee "$OUT/test_gpu_paged_fp8.log"
  timeout "${FP8_TIMEOUT:-100000}" python3 -P bench/bench_fp8_serving.py ${FP8_ARGS:-} --json "$OUT/bench_fp8.json" 2>&1 \
    | tee "$OUT/bench_fp8.log"
  FMHA_DSL_TUNE_CANDIDATES=2 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -P -m pytest -q tests/test_gpu_paged_fp8.py -p no:cacheprovider 2>&1 | tail -20 | tee "$OUT/memcheck_fp8.log"
  echo "memcheck exit: ${PIPESTATUS[0]}" | tee -a "$OUT/memcheck_fp8.log"
fi
if [[ $what == *" memcheck "* ]]; then   # the serving kernels under compute-sanitizer (kernels compiled first, outside)
  FMHA_DSL_TUNE_CANDIDATES=2 python3 -P -m pytest -q tests/test_gpu_paged.py -p no:cacheprovider -k "${MEMCHECK_K:-corrupt or both_table or append}" >/dev/null 2>&1
  FMHA_DSL_TUNE_CANDIDATES=2 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -P -m pytest -q tests/test_gpu_paged.py -p no:cacheprovider -k "${MEMCHECK_K:-corrupt or both_table or append}" 2>&1 \
    | tail -30 | tee "$OUT/memcheck.log"; echo "memcheck exit: ${PIPESTATUS[0]}" | tee -a "$OUT/memcheck.log"
fi
if [[ $what == *" all "* || $what == *" serving "* ]]; then
  timeout "${SERVING_TIMEOUT:-100000}" python3 -P bench/bench_serving.py ${SERVING_ARGS:-} --json "$OUT/bench_serving.json" 2>&1 \
    | tee "$OUT/bench_serving.log"
  cp "$FMHA_DSL_CACHE_DIR"/tuned/*.json "$OUT/" 2>/dev/null
fi
if [[ $what == *" retune "* ]]; then   # re-measure the shipped table's decisions (RETUNE_ARGS, e.g. --family fwd)
  mkdir -p "$FMHA_DSL_CACHE_DIR/tuned"; cp dbg/tuned/*.json "$FMHA_DSL_CACHE_DIR/tuned/" 2>/dev/null  # earlier calls'
  FMHA_DSL_TUNED_SHIPPED=0 timeout "${RETUNE_TIMEOUT:-100000}" python3 -P bench/retune_shipped.py ${RETUNE_ARGS:-} 2>&1 \
    | tee "$OUT/retune.log" | tail -5
  cp "$FMHA_DSL_CACHE_DIR"/tuned/*.json "$OUT/" 2>/dev/null
fi
if [[ $what == *" firstcall "* ]]; then   # first-call latency in the situations a user meets (FIRSTCALL_ARGS: --quick)
  timeout "${FIRSTCALL_TIMEOUT:-100000}" python3 -P bench/bench_firstcall.py ${FIRSTCALL_ARGS:-} --json "$OUT/bench_firstcall.json" \
    2>&1 | tee "$OUT/bench_firstcall.log"
fi
if [[ $what == *" profilefirst "* ]]; then   # where a cached first call's host time goes (cProfile)
  python3 -P bench/profile_firstcall.py ${PROFILE_ARGS:-} > "$OUT/profile_firstcall.log" 2>&1
  grep -E "^== |first|Error|####|compile|race|confirm|torch fast" "$OUT/profile_firstcall.log" | head -60
fi
if [[ $what == *" confirmprobe "* ]]; then   # shorter settles for the confirmation of shipped decisions (PROBE_ARGS)
  rm -rf /tmp/fmha-probe/tuned   # an earlier call's decisions would leave nothing to confirm
  FMHA_DSL_CACHE_DIR=/tmp/fmha-probe timeout "${PROBE_TIMEOUT:-100000}" python3 -P bench/probe_confirm.py ${PROBE_ARGS:-} \
    --json "$OUT/probe_confirm.json" 2>&1 | tee "$OUT/probe_confirm.log"
fi
if [[ $what == *" all "* || $what == *" bwd "* ]]; then
  timeout "${BWD_TIMEOUT:-100000}" python3 -P bench/bench_bwd.py ${BWD_ARGS:-} --json "$OUT/bench_bwd.json" 2>&1 \
    | tee "$OUT/bench_bwd.log"
  cp "$FMHA_DSL_CACHE_DIR"/tuned/*.json "$OUT/" 2>/dev/null   # the backward decisions it measured
fi
if [[ $what == *" all "* || $what == *" dispatch "* ]]; then
  python3 -P bench/bench_dispatch.py 2>&1 | tail -30 | tee "$OUT/bench_dispatch.log"
fi
if [[ $what == *" all "* || $what == *" fwd "* ]]; then
  python3 -P bench/bench_fwd.py --build /tmp/bench --peers sdpa --json "$OUT/bench_fwd_sdpa.json" 2>&1 | tee "$OUT/bench_fwd.log"
fi
if [[ $what == *" flex "* ]]; then
  sel=""; [[ -f "${FWD_JSON:-}" ]] && sel="--select-from $FWD_JSON"   # FWD_JSON: the sdpa run's JSON (re-time its top 3)
  python3 -P bench/bench_fwd.py --build /tmp/bench --peers flex $sel --json "$OUT/bench_fwd_flex.json" 2>&1 | tee "$OUT/bench_flex.log"
fi
# the seqtune kernel set (decode- to prefill-sized tiles, split-KV): build, tune on the default matrix, evaluate on
# held-out shapes, draw the report, and time dispatch through the tuned registry.  "select" = the three steps;
# each can run alone (the build folder, SEQ_DIR, is inside the checkout so it survives between device calls)
SEQ_DIR="${SEQ_DIR:-out/seqtune}"
if [[ $what == *" select "* || $what == *" seqbuild "* ]]; then
  python3 -P -m fmha_dsl.cli build seqtune_fwd --arch "$arch" -o "$SEQ_DIR" -j 16 -q 2>&1 | tail -5 | tee "$OUT/build_seqtune.log"
  tar -C "$SEQ_DIR" -cf "$OUT/seqtune.tar" .   # to carry into the next call
fi
if [[ $what == *" select "* || $what == *" seqtune "* ]]; then
  python3 -P -m fmha_dsl.cli tune "$SEQ_DIR" --budget "${TUNE_BUDGET:-300}" 2>&1 | tail -20 | tee "$OUT/tune.log"
  cp "$SEQ_DIR/registry.json" "$OUT/registry_tuned.json" 2>/dev/null
  tar -C "$SEQ_DIR" -cf "$OUT/seqtune.tar" .
fi
if [[ $what == *" select "* || $what == *" seqeval "* ]]; then
  python3 -P bench/bench_select.py --build "$SEQ_DIR" --skip-tune --json "$OUT/bench_select.json" 2>&1 | tee "$OUT/bench_select.log" | grep -v "^[bf][fp]16 d"
  python3 -P -m fmha_dsl.cli report "$SEQ_DIR" -o "$OUT/report.html" --png 2>&1 | tail -3
  python3 -P bench/bench_dispatch.py --registry "$SEQ_DIR" --json "$OUT/bench_dispatch_tuned.json" 2>&1 | tail -14
fi
if [[ $what == *" all "* || $what == *" default "* ]]; then
  best=$(ls bench/results/*_"$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -o 'H[0-9]00' | tr 'H' 'h')"_fwd_sdpa_run*.json 2>/dev/null | sort | tail -1)
  [[ -z "$best" ]] && best=$(ls bench/results/*_fwd_sdpa_run*.json | sort | tail -1)
  FMHA_DSL_TUNED_SHIPPED=${DEFAULT_SHIPPED:-0} timeout "${DEFAULT_TIMEOUT:-100000}" python3 -P bench/bench_default.py --parts "${DEFAULT_PARTS:-firstcall,prefill,padded,decode}" --best-from "$best" \
    --build /tmp/bench ${DEFAULT_ARGS:-} --json "$OUT/bench_default.json" 2>&1 | tee "$OUT/bench_default.log"
  cp "$FMHA_DSL_CACHE_DIR"/tuned/*.json "$OUT/" 2>/dev/null
fi
