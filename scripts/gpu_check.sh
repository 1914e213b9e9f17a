#!/usr/bin/env bash
# Run the GPU test suite and the benchmarks in one go from a source checkout, on a GPU machine
# whose python3 already has torch and triton (no network needed).
#   scripts/gpu_check.sh OUT_DIR [steps...]
#   steps: tests tests-plugin sanitizer eager-cost cleanup hc-head model-step e2e e2e-fp32
#          sweep-partials plugin mhc metadata pdl
#   (default: tests eager-cost cleanup hc-head sanitizer); cleanup:quick, hc-head:quick and e2e:quick run the short versions.
# Writes logs and results under OUT_DIR; OUT_DIR/results/ holds the benchmark JSON/MD/PNG.
# SGLang's kernels join the benchmarks as peers when its source is found (an installed sglang, or
# DSV4SPEC_SGLANG_ROOT pointing at an unpacked wheel: a folder holding sglang/).
# Without a GPU that nvidia-smi lists and torch sees it says so in one line, writes nothing and
# exits 2.
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT_DIR [steps...]}
shift
STEPS=${*:-tests eager-cost cleanup hc-head sanitizer}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
. scripts/gpu_lib.sh

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check.sh: no NVIDIA GPU here ($(command -v nvidia-smi >/dev/null && echo 'nvidia-smi lists none' || echo 'no nvidia-smi')): it runs the GPU suite on a GPU machine; nothing was written" >&2
  exit 2
fi
why=$($PY -c 'import torch; print("" if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA GPU")' 2>/dev/null) \
  || why="$PY cannot import torch"
if [ -n "$why" ]; then
  echo "gpu_check.sh: $why: it runs the GPU suite on a GPU machine; nothing was written" >&2
  exit 2
fi
mkdir -p "$OUT/results"

environment "$OUT"

for s in $STEPS; do
  case $s in
    tests)
      step "pytest -m gpu"
      $PY -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sanitizer)
      step "compute-sanitizer memcheck over the GPU cleanup tests"
      # The profiler-based kernel count is left out: CUPTI and the sanitizer do not run together.
      compute-sanitizer --tool memcheck --print-limit 20 \
        $PY -m pytest -m gpu -q -p no:cacheprovider -k "not one_kernel and not launches_nothing" tests/ops/test_c128_cleanup.py \
        > "$OUT/sanitizer_memcheck.log" 2>&1
      echo "exit code $?" >> "$OUT/sanitizer_memcheck.log"
      tail -8 "$OUT/sanitizer_memcheck.log" ;;
    sweep-partials)
      step "hc_head partials tilings, 1-D vs 2-D sums"
      $PY -m dsv4spec.cli bench hc-head-sweep --sweeps partials-2d --out "$OUT/results" 2>&1 | tee "$OUT/sweep_hc_head_partials.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    e2e-fp32)
      # The lossless check at every (preset, bs) in float32, where decode and verify GEMMs do
      # not flip near-tied greedy choices (bf16 does, with random weights: docs/benchmarks.md).
      step "dsv4spec bench e2e --dtype float32"
      $PY -m dsv4spec.cli bench e2e --dtype float32 --name e2e_fp32 --out "$OUT/results" 2>&1 \
        | tee "$OUT/bench_e2e_fp32.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tests-plugin)
      step "pytest -m gpu: the plugin and the ops it hooks"
      $PY -m pytest -m gpu -q -p no:cacheprovider tests/integrations tests/kernels \
        tests/ops/test_hc_head.py tests/ops/test_c128_cleanup.py 2>&1 \
        | tee "$OUT/pytest_gpu_plugin.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    pdl)
      # the mHC ops' PDL order: the ordering test, the mHC GPU tests, both orders timed
      step "pytest -m gpu: PDL order and the mHC ops"
      $PY -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_pdl_order.py \
        tests/kernels/test_mhc_variants.py tests/ops/test_mhc.py tests/ops/test_mhc_post_head.py \
        2>&1 | tee "$OUT/pytest_gpu_pdl.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      step "dsv4spec bench pdl"
      $PY -m dsv4spec.cli bench pdl --out "$OUT/results" 2>&1 | tee "$OUT/bench_pdl.log" | tail -50
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    eager-cost|cleanup|hc-head|model-step|e2e|plugin|mhc|metadata|cleanup:quick|hc-head:quick|e2e:quick|mhc:quick|metadata:quick)
      name=${s%:quick}
      flags=$([ "$s" != "$name" ] && echo --quick)
      case $name in cleanup|eager-cost) flags="$flags --peer sglang" ;; esac
      # vLLM's hc_head joins as a peer where its source and TileLang are found (else one line)
      [ "$name" = hc-head ] && flags="$flags --peer sglang vllm"
      # the plugin's first-sight compile is timed cold: no kernel in Triton's disk cache
      cache=$([ "$name" = plugin ] && echo "TRITON_CACHE_DIR=$(mktemp -d)")
      step "dsv4spec bench $name $flags"
      env $cache $PY -m dsv4spec.cli bench "$name" $flags --out "$OUT/results" 2>&1 \
        | tee "$OUT/bench_$name.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
step done
exit $status
