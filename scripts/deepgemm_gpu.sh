#!/usr/bin/env bash
# The engines' mHC peers with DeepGEMM on, as deployed (SGLang 0.5.23 and vLLM run DeepGEMM's
# tf32_hc_prenorm_gemm in mhc_pre at every token count and in the boundary above 32 tokens), on a
# GPU machine from a checkout (the image's torch and Triton; results under OUT_DIR):
#   scripts/deepgemm_gpu.sh OUT_DIR [steps...]     (default: smoke tune-sglang tune-vllm)
#   smoke        each carried DeepGEMM set up (sgl: _C.so compiled here) and
#                tests/kernels/test_deepgemm_smoke.py under it: tf32_hc_prenorm_gemm against float64
#   bench        dsv4spec bench mhc --deepgemm on, pre and post_pre at decode and verify sizes
#   tune-sglang  dsv4spec tune --engine sglang --deepgemm on for mhc_pre and mhc_fused_post_pre
#   tune-vllm    dsv4spec tune --engine vllm --deepgemm on for mhc_pre and mhc_fused_post_pre
#   tune-off-sglang, tune-off-vllm
#                dsv4spec tune --deepgemm off, every hook of the engine (the plain tables, read
#                where the engine runs no DeepGEMM; TUNE_HOOKS="..." for some hooks only); no
#                DeepGEMM bundle needed. To resume a run a
#                time limit cut, put its OUT_DIR/tables/*.partial into OUT_DIR/tables first
#   mid-t        scripts/mhc_mid_t_ab.py: mhc_pre and the boundary at 17-512 tokens, the plan beside
#                the other tensor-core tilings and the finalize as a dependent launch, and beside
#                vLLM's DeepGEMM path (OUT_DIR/mhc_mid_t_ab.json/.md)
#   tma          scripts/mhc_tma_ab.py: mhc_pre and the boundary with TMA-loaded, pipelined
#                tensor-core partials at 33-512 tokens beside the plan and vLLM's DeepGEMM path
#                (OUT_DIR/mhc_tma_ab.json/.md)
#   ncu          scripts/mhc_ncu.py: Nsight Compute on each launch of ours (the plan and the
#                tensor-core tilings) and of vLLM's DeepGEMM path, 64, 256 and 16 tokens, H 7168
#                (OUT_DIR/ncu_run: mhc_ncu.json/.md and a report per case)
# Each tune writes OUT_DIR/tables/<device>.triton<M.m>.json (the two engines in one file) and
# resumes from its .partial there. Bundles, unpacked into /tmp once: .device/deepgemm_vllm.tar.xz
# and .device/deepgemm_sgl.tar.xz (scripts/deepgemm-bundle.sh; SGLang's peer runs sgl-deep-gemm
# where its bundle was carried, else vLLM's DeepGEMM, and its results name which),
# .device-tl/tilelang_*.tar.xz (TileLang, the engines' pin), .device-sg/sglang_subset.tar.xz
# (SGLang's Python files). vLLM's source: .vllm-src/0.33.0 (with utils/deep_gemm.py: make setup).
# Planned for 10-minute calls: smoke + tune-sglang in one, tune-vllm in another (docs/benchmarks.md).
# TRITON=3.8 runs every step under Triton 3.8 (the engines' stack, what torch 2.14.x installs):
# .device-t38/triton38_site.tar.xz (../shared/tools/triton-bundle.sh .device-t38), unpacked into
# /tmp/t38 once; it does not fit one call beside TileLang, so a machine kept warm from an earlier
# call (whose bundles stay unpacked in /tmp) runs it with the Triton bundle alone carried.
set -uo pipefail
OUT=${1:?usage: deepgemm_gpu.sh OUT_DIR [steps...]}
shift
STEPS=${*:-smoke tune-sglang tune-vllm}
mkdir -p "$OUT/tables"
cd "$(dirname "$0")/.."
. scripts/gpu_lib.sh
seconds_left() {  # seconds_left MARGIN: of the call's CALL_SECONDS (from this script's start),
  # less MARGIN, at least 60
  local left=$(( ${CALL_SECONDS:-570} - SECONDS - $1 ))
  echo $(( left > 60 ? left : 60 ))
}
engine_bundles
if [ "${TRITON:-}" = 3.8 ]; then
  for b in .device-t38/triton38_*.tar.xz; do unpack "$b" /tmp/t38; done
  [ -e /tmp/t38/.done ] || { echo "TRITON=3.8: no Triton 3.8 bundle unpacked in /tmp/t38"; exit 1; }
  P=/tmp/t38:$P
fi
[ -e /tmp/tl/.done ] || echo "no TileLang unpacked in /tmp/tl: the engines' mHC peers cannot load"
[ -d .vllm-src/0.33.0/vllm ] && export DSV4SPEC_VLLM_SRC=$PWD/.vllm-src/0.33.0
export PYTHONPATH=$P

environment "$OUT"
step "DeepGEMM set-up"
cuda_home  # here, not inside deepgemm_setup's subshell: every later step's JIT needs it
echo "CUDA_HOME=$CUDA_HOME"
declare -A DG=()
for kind in sgl vllm; do
  [ -f ".device/deepgemm_$kind.tar.xz" ] || continue
  dir=$(deepgemm_setup $kind 2>>"$OUT/deepgemm_setup.log") && DG[$kind]=$dir
done
cat "$OUT/deepgemm_setup.log" 2>/dev/null | tail -20
echo "usable: ${!DG[*]}"
# a missing DeepGEMM fails the run only where a step needs it (tune-off-* do not)
needs_dg=0; for s in $STEPS; do case $s in tune-off-*) ;; *) needs_dg=1 ;; esac; done
[ ${#DG[@]} -gt 0 ] || [ $needs_dg = 0 ] \
  || { echo "no carried DeepGEMM imports here (see deepgemm_setup.log)"; status=1; }
# SGLang's peer: its own pin where it built, else vLLM's DeepGEMM (same sm90 kernel source)
SGL_DG=${DG[sgl]:-${DG[vllm]:-}}
VLLM_DG=${DG[vllm]:-}

for s in $STEPS; do
  case $s in
    smoke)
      for kind in "${!DG[@]}"; do
        step "pytest -m gpu tests/kernels/test_deepgemm_smoke.py ($kind)"
        PYTHONPATH=${DG[$kind]}:$P $PY -m pytest -m gpu -q -p no:cacheprovider \
          tests/kernels/test_deepgemm_smoke.py 2>&1 | tee "$OUT/pytest_deepgemm_$kind.log" | tail -8
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    bench)
      [ -n "$SGL_DG" ] || { echo "bench: no DeepGEMM set up"; status=1; continue; }
      step "dsv4spec bench mhc --deepgemm on"
      PYTHONPATH=$SGL_DG:$P $PY -m dsv4spec.cli bench mhc --deepgemm on --ops pre post_pre \
        --providers sglang vllm ours --tokens 1 4 9 16 32 33 64 256 --name mhc_deepgemm \
        --out "$OUT" 2>&1 | tee "$OUT/bench_mhc_deepgemm.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tune-sglang|tune-vllm)
      engine=${s#tune-}
      dg=$([ "$engine" = sglang ] && echo "$SGL_DG" || echo "$VLLM_DG")
      [ -n "$dg" ] || { echo "$s: no DeepGEMM set up"; status=1; continue; }
      step "dsv4spec tune --engine $engine --deepgemm on"
      # stopped before the call's 10 minutes (CALL_SECONDS, counted from this script's start),
      # its points kept in OUT_DIR/tables/*.partial
      left=$(seconds_left 0)
      PYTHONPATH=$dg:$P timeout $left $PY -m dsv4spec.cli tune --engine "$engine" --deepgemm on \
        --hooks mhc_pre mhc_fused_post_pre --force --out-dir "$OUT/tables" 2>&1 \
        | tee "$OUT/tune_$engine.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tune-off-sglang|tune-off-vllm)
      engine=${s#tune-off-}
      step "dsv4spec tune --engine $engine --deepgemm off"
      # the packaged plain file of this GPU and stack seeds the output: its other engine's
      # hooks are kept beside the ones measured here
      $PY -c 'import json, pathlib, shutil, sys, torch
from dsv4spec.integrations import tables
name, stack = torch.cuda.get_device_name(), tables.running_stack()
out = pathlib.Path(sys.argv[1]) / tables.device_file_name(name, stack)
for src in (tables.PACKAGED_DIR / tables.device_file_name(name, s) for s in (stack, None)):
    if (not out.exists() and src.is_file()
            and tables.file_stack(json.loads(src.read_text())) == stack):
        shutil.copy(src, out)
        print("seeded", out, "from", src)
        break' "$OUT/tables"
      left=$(seconds_left 0)
      timeout $left $PY -m dsv4spec.cli tune --engine "$engine" --deepgemm off --force \
        ${TUNE_HOOKS:+--hooks $TUNE_HOOKS} --out-dir "$OUT/tables" 2>&1 \
        | tee -a "$OUT/tune_off_$engine.log" | tail -25
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    mid-t|tma)
      # mid-t: the plan beside the other tilings; tma: beside the TMA partials (a prototype)
      script=$([ "$s" = tma ] && echo mhc_tma_ab || echo mhc_mid_t_ab)
      step "scripts/$script.py (17 or 33 to 512 tokens)"
      left=$(seconds_left 30)
      engines=""; [ -n "$VLLM_DG" ] && engines="vllm"
      PYTHONPATH=${VLLM_DG:+$VLLM_DG:}$P $PY scripts/$script.py "$OUT" --seconds $left \
        --engines $engines 2>&1 | tee "$OUT/$script.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ncu)
      [ -n "$VLLM_DG" ] || echo "ncu: no vLLM DeepGEMM set up: ours alone"
      step "scripts/mhc_ncu.py (Nsight Compute)"
      left=$(seconds_left 30)
      providers="ours"; [ -n "$VLLM_DG" ] && providers="ours vllm"
      PYTHONPATH=${VLLM_DG:+$VLLM_DG:}$P $PY scripts/mhc_ncu.py "$OUT/ncu_run" --seconds $left \
        --providers $providers 2>&1 | tee "$OUT/mhc_ncu.log" | tail -12
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
step done
exit $status
