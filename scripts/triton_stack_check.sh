#!/usr/bin/env bash
# Our kernels under the engines' Triton (3.8, what torch 2.14.x installs) beside the GPU image's
# own (3.6), on one GPU machine, from a source checkout (no network).
#   scripts/triton_stack_check.sh OUT_DIR [steps...]
# Bundles, unpacked once per machine into /tmp when present in the checkout:
#   .device/triton38_*.tar.xz   Triton 3.8 (../shared/tools/triton-bundle.sh), put first on
#                               PYTHONPATH for the 3.8 steps; the image's torch stays
#   .device-tl/tilelang_*.tar.xz  TileLang (../shared/tools/tilelang-bundle.sh): the engines'
#                               TileLang kernels as peers (tune)
#   .device-sg/sglang_subset.tar.xz  SGLang 0.5.23's Python files that the plugin's tests and
#                               peers read (DSV4SPEC_SGLANG_ROOT)
# Steps (default: tests38 cached36 stack ab):
#   tests38        pytest -m gpu tests/ops tests/kernels under 3.8
#   cached36       the cached-launch GPU tests under 3.6 (the direct launch's 3.6 layout)
#   stack          bench stack under 3.6 and 3.8, then the two side by side
#   ab             scripts/mhc_triton38_ab.py under 3.8 (the boundary's tilings at decode sizes),
#                  with fp32 and bf16 norm weights, through the kernels' function and the op
#   integrations38 pytest -m gpu tests/integrations under 3.8
#   sanitizer38    compute-sanitizer memcheck under 3.8: bench stack --check-only (mHC, hc_head,
#                  rollback) and the metadata builders' GPU tests
#   tune38         dsv4spec tune for SGLang and vLLM under 3.8 (tables into OUT_DIR/tables)
set -uo pipefail
OUT=${1:?usage: triton_stack_check.sh OUT_DIR [steps...]}
shift
STEPS=${*:-tests38 cached36 stack ab}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. scripts/gpu_lib.sh
for b in .device/triton38_*.tar.xz; do unpack "$b" /tmp/t38; done
for b in .device-tl/tilelang_*.tar.xz; do unpack "$b" /tmp/tl; done
unpack .device-sg/sglang_subset.tar.xz /tmp/sg
[ -e /tmp/sg/.done ] && export DSV4SPEC_SGLANG_ROOT=/tmp/sg
for d in .vllm-src/0.33.0 .vllm-src; do  # make setup's unpacked vLLM source (per version)
  [ -d "$d/vllm" ] && { export DSV4SPEC_VLLM_SRC=$PWD/$d; break; }
done
T36=$PWD/src
T38=/tmp/t38:$PWD/src
[ -e /tmp/tl/.done ] && T38=/tmp/t38:/tmp/tl:$PWD/src
[ -e /tmp/t38/.done ] || { echo "no Triton 3.8 bundle unpacked in /tmp/t38"; exit 1; }

step environment
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  for p in $T36 $T38; do
    PYTHONPATH=$p $PY -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, triton.__file__)'
  done
} 2>&1 | tee "$OUT/environment.txt"

for s in $STEPS; do
  case $s in
    tests38)
      step "pytest -m gpu tests/ops tests/kernels (Triton 3.8)"
      PYTHONPATH=$T38 $PY -m pytest -m gpu -q -p no:cacheprovider tests/ops tests/kernels 2>&1 \
        | tee "$OUT/pytest_gpu_ops_kernels_triton38.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    cached36)
      step "cached-launch GPU tests (Triton 3.6)"
      PYTHONPATH=$T36 $PY -m pytest -m gpu -q -p no:cacheprovider -k "cached_launch or direct" \
        tests/ops tests/kernels 2>&1 | tee "$OUT/pytest_gpu_cached_launch_triton36.log" | tail -8
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    stack)
      for v in 36 38; do
        step "bench stack (Triton ${v:0:1}.${v:1})"
        p=T$v
        PYTHONPATH=${!p} $PY -m dsv4spec.cli bench stack --out "$OUT" 2>&1 \
          | tee "$OUT/bench_stack_triton$v.log" | tail -4
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done
      PYTHONPATH=$T36 $PY -m dsv4spec.cli bench stack --out "$OUT" --name stack_triton3.6_vs_3.8 \
        --compare "$OUT/stack_triton3.6.json" "$OUT/stack_triton3.8.json" > /dev/null || status=1 ;;
    ab)
      # fp32 and bf16 norm weights, through the kernels' function and through the op (as bench
      # stack and tune call it): which of the two makes the 16-token boundary slower
      for opts in "" "--norm-weight bfloat16" "--via-op" "--norm-weight bfloat16 --via-op"; do
        step "mhc_triton38_ab.py $opts (Triton 3.8)"
        PYTHONPATH=$T38 $PY scripts/mhc_triton38_ab.py "$OUT" $opts 2>&1 \
          | tee -a "$OUT/mhc_ab_triton38.log" | tail -16
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    integrations38)
      step "pytest -m gpu tests/integrations (Triton 3.8)"
      PYTHONPATH=$T38 $PY -m pytest -m gpu -q -p no:cacheprovider tests/integrations 2>&1 \
        | tee "$OUT/pytest_gpu_integrations_triton38.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sanitizer38)
      step "compute-sanitizer memcheck (Triton 3.8)"
      { PYTHONPATH=$T38 compute-sanitizer --tool memcheck --print-limit 20 \
          $PY -m dsv4spec.cli bench stack --check-only --out "$OUT"
        echo "exit code $?"
        PYTHONPATH=$T38 compute-sanitizer --tool memcheck --print-limit 20 \
          $PY -m pytest -m gpu -q -p no:cacheprovider tests/integrations/sglang/test_metadata.py \
          tests/integrations/sglang/test_compression_metadata_hook.py \
          tests/integrations/sglang/test_metadata_verify.py
        echo "exit code $?"
      } > "$OUT/sanitizer_memcheck_triton38.log" 2>&1
      grep -E "ERROR SUMMARY|exit code|passed|failed" "$OUT/sanitizer_memcheck_triton38.log" ;;
    tune38)
      mkdir -p "$OUT/tables"
      for e in sglang vllm; do
        step "dsv4spec tune --engine $e (Triton 3.8)"
        PYTHONPATH=$T38 $PY -m dsv4spec.cli tune --engine $e --out-dir "$OUT/tables" --force 2>&1 \
          | tee "$OUT/tune_${e}_triton38.log" | tail -12
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
step done
exit $status
