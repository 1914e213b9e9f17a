# What the GPU-run drivers (gpu_check.sh, triton_stack_check.sh, engine_versions_gpu.sh) share,
# sourced from the checkout's root: the common settings, the step banner, unpacking a carried
# bundle once, and the record of the GPU and the stack a run used.
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0
step() { echo "=== $1 ($(date -u +%H:%M:%S))"; }
unpack() {  # unpack BUNDLE into DIR once
  [ -e "$2/.done" ] && return 0
  [ -f "$1" ] || return 0
  mkdir -p "$2" && xz -dc "$1" | tar -x -C "$2" && touch "$2/.done"
}
environment() {  # environment OUT: the GPU, and torch / CUDA / Triton as PYTHONPATH finds them
  step environment
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
    $PY -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  } 2>&1 | tee "$1/environment.txt"
}
engine_bundles() {  # TileLang (.device-tl) and SGLang's files (.device-sg) unpacked into /tmp
  # once: SGLang's as DSV4SPEC_SGLANG_ROOT, TileLang before src/ in P (the PYTHONPATH to use)
  for b in .device-tl/tilelang_*.tar.xz; do unpack "$b" /tmp/tl; done
  unpack .device-sg/sglang_subset.tar.xz /tmp/sg
  [ -e /tmp/sg/.done ] && export DSV4SPEC_SGLANG_ROOT=/tmp/sg
  P=$PWD/src
  [ -e /tmp/tl/.done ] && P=/tmp/tl:$P
  return 0
}
cuda_home() {  # export CUDA_HOME where unset: DeepGEMM's build and its kernels' JIT take it, else
  # nvcc's grandparent folder, which a link or wrapper (/usr/local/bin/nvcc) gets wrong
  [ -n "${CUDA_HOME:-}" ] || export CUDA_HOME=$(realpath "$(nvcc --dryrun -c -x cu /dev/null \
    -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)")
}
deepgemm_setup() {  # deepgemm_setup vllm|sgl: .device/deepgemm_<kind>.tar.xz unpacked into
  # /tmp/deepgemm-<kind> once (sgl: its _C.so compiled against this torch), checked to import;
  # prints that folder (put it first on PYTHONPATH), or fails with the reason on stderr
  local dir=/tmp/deepgemm-$1
  cuda_home
  unpack ".device/deepgemm_$1.tar.xz" "$dir"
  [ -e "$dir/.done" ] || { echo "deepgemm $1: no .device/deepgemm_$1.tar.xz (scripts/deepgemm-bundle.sh $1)" >&2; return 1; }
  if [ "$1" = sgl ] && [ ! -f "$dir/deep_gemm/_C.so" ]; then
    $PY scripts/deepgemm_build.py "$dir" >&2 || return 1
  fi
  PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} $PY -c 'import sys, deep_gemm
from dsv4spec.bench.deepgemm import describe
print(describe(deep_gemm), file=sys.stderr)' || return 1
  echo "$dir"
}
