#!/usr/bin/env bash
# The GPU measurements behind the engines' newest call patterns, run on a GPU machine from a
# checkout (the image's torch and Triton; results under OUT_DIR):
#   vllm034    dsv4spec bench vllm on vLLM 0.34.0's source (both call patterns, MTP and DSpark
#              per-step sums), one run per width
#   vllm033    a cross-check of the shared rows on vLLM 0.33.0's source (a few counts)
#   precompile the vLLM plugin's mHC precompile per width, timed on the GPU (Triton's cache off)
#   dspark     dsv4spec bench dspark (SGLang's DSpark hc_head) with the per-step sums
#   tune       dsv4spec tune --hooks dspark_hc_head into a copy of the packaged tables of the
#              running Triton stack (OUT_DIR/tables)
#   tests      pytest -m gpu of the DSpark hook (the packaged tables)
#   tests-vllm pytest -m gpu of the vLLM plugin, on 0.34.0's source
#   doctor     dsv4spec doctor on this GPU, its GPU test, and bench stack --check-only
# Bundles, unpacked into /tmp once: .device-tl/tilelang_*.tar.xz (TileLang, the engines' pin),
# .device-sg/sglang_subset.tar.xz (SGLang's Python files), .device/triton38_*.tar.xz (Triton
# 3.8, put first on PYTHONPATH with TRITON38=1). vLLM's sources: .vllm-src/<version>/.
set -uo pipefail
OUT=${1:?usage: engine_versions_gpu.sh OUT_DIR [steps...]}
shift
STEPS=${*:-vllm034 vllm033 precompile dspark tune tests tests-vllm}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. scripts/gpu_lib.sh
engine_bundles
if [ "${TRITON38:-0}" = 1 ]; then
  for b in .device/triton38_*.tar.xz; do unpack "$b" /tmp/t38; done
  sed -i '/amd/d' /tmp/t38/triton-*.dist-info/entry_points.txt 2>/dev/null
  P=/tmp/t38:$P
fi
export PYTHONPATH=$P
V34=$PWD/.vllm-src/0.34.0
V33=$PWD/.vllm-src/0.33.0

environment "$OUT"

for s in $STEPS; do
  case $s in
    vllm034)
      for H in 7168 4096; do
        step "bench vllm on 0.34.0, H = $H"
        DSV4SPEC_VLLM_SRC=$V34 $PY -m dsv4spec.cli bench vllm --hidden $H \
          --out "$OUT/vllm034_h$H" 2>&1 | tee "$OUT/bench_vllm034_h$H.log" | tail -40
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    vllm033)
      step "bench vllm on 0.33.0 (cross-check)"
      DSV4SPEC_VLLM_SRC=$V33 $PY -m dsv4spec.cli bench vllm --hidden 7168 --tokens 1 4 32 64 \
        --batch 1 --drafts 1 --dspark-block 0 --out "$OUT/vllm033_check" 2>&1 \
        | tee "$OUT/bench_vllm033_check.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    precompile)
      step "vLLM plugin mHC precompile, timed"
      TRITON_CACHE_DIR=$(mktemp -d) $PY - <<'EOF' 2>&1 | tee "$OUT/precompile_vllm_mhc.log"
import time, torch, triton
from dsv4spec.integrations.mhc_precompile import Signature, precompile
from dsv4spec.integrations.vllm.mhc import served_tokens
arch = torch.cuda.get_device_capability()
print("device", torch.cuda.get_device_name(), "triton", triton.__version__)
for deep_gemm in (False, True):
    for H in (7168, 4096):
        total, count = 0.0, 0
        for op in ("mhc_pre", "mhc_fused_post_pre", "mhc_post"):
            tokens = served_tokens(op, H, arch, deep_gemm)
            t0 = time.perf_counter()
            n = precompile(op, tokens, H, 0, Signature()) if tokens else 0
            dt = time.perf_counter() - t0
            total, count = total + dt, count + n
            print(f"deep_gemm={deep_gemm} H={H} {op}: {n} variants in {dt:.1f} s")
        print(f"deep_gemm={deep_gemm} H={H}: {count} variants in {total:.1f} s")
EOF
      ;;
    dspark)
      step "bench dspark --steps"
      # the per-step sums time SGLang's TileLang mHC kernels: only where TileLang is here
      steps=; [ -e /tmp/tl/.done ] && steps=--steps
      $PY -m dsv4spec.cli bench dspark $steps --out "$OUT/dspark" 2>&1 \
        | tee "$OUT/bench_dspark.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tune)
      mkdir -p "$OUT/tables"
      stack=$($PY -c 'import triton; print(".".join(triton.__version__.split(".")[:2]))')
      cp "src/dsv4spec/integrations/tables/NVIDIA_H200.triton$stack.json" "$OUT/tables/" \
        2>/dev/null || cp src/dsv4spec/integrations/tables/NVIDIA_H200.json \
        "$OUT/tables/NVIDIA_H200.triton$stack.json"
      step "tune --hooks dspark_hc_head (Triton $stack)"
      $PY -m dsv4spec.cli tune --engine sglang --hooks dspark_hc_head --out-dir "$OUT/tables" --force \
        2>&1 | tee "$OUT/tune_dspark_triton$stack.log" | tail -15
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tests)
      step "pytest -m gpu (the DSpark hook)"
      $PY -m pytest -m gpu -q -p no:cacheprovider tests/integrations/sglang/test_dspark_hc_head.py \
        2>&1 | tee "$OUT/pytest_gpu_dspark.log" | tail -20
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tests-vllm)
      step "pytest -m gpu (the vLLM plugin, on 0.34.0's source)"
      DSV4SPEC_VLLM_SRC=$V34 $PY -m pytest -m gpu -q -p no:cacheprovider tests/integrations/vllm \
        2>&1 | tee "$OUT/pytest_gpu_vllm.log" | tail -20
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    doctor)
      step "dsv4spec doctor (the packaged tables), its GPU test, bench stack --check-only"
      { time $PY -m dsv4spec.cli doctor; } > "$OUT/doctor.txt" 2>&1; echo "exit $?" >> "$OUT/doctor.txt"
      $PY -m dsv4spec.cli doctor --json > "$OUT/doctor.json" 2>/dev/null
      tail -8 "$OUT/doctor.txt"
      $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_doctor.py 2>&1 \
        | tee "$OUT/pytest_gpu_doctor.log" | tail -8
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      $PY -m dsv4spec.cli bench stack --check-only --out "$OUT/stack" 2>&1 \
        | tee "$OUT/bench_stack_check.log" | tail -8 ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
step done
exit $status
