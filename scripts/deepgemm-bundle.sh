#!/usr/bin/env bash
# Build the DeepGEMM bundles a GPU run carries (into .device/, git-ignored), so that the engines'
# mHC peers run DeepGEMM's tf32_hc_prenorm_gemm there, as deployed (`--deepgemm on`; how to run:
# docs/benchmarks.md). The released builds of DeepGEMM do not all load on the lent GPU's torch:
#   deepgemm_vllm.tar.xz  vLLM's own DeepGEMM (vllm/third_party/deep_gemm of the vLLM wheel,
#                         DeepGEMM 2.8.1), which vLLM runs where no other deep_gemm is installed.
#                         Its _C_extension.abi3.so calls torch through the stable C ABI only
#                         (aoti_torch_* / torch_* symbols), so it loads on any torch that exports
#                         them: checked here against TORCH_LIB_DIR when given. Carried as the
#                         top-level package deep_gemm, the name vLLM imports first. About 6 MB.
#   deepgemm_sgl.tar.xz   sgl-deep-gemm 0.2.3.post2, SGLang 0.5.23's pin, without its _C.so
#                         (built against a newer torch's C++ ABI: c10 and torch::Library symbols
#                         that torch 2.11 lacks), plus csrc/ of the same release from DEEPGEMM_SRC,
#                         a checkout of github.com/sgl-project/DeepGEMM at that release (its
#                         deep_gemm/include/deep_gemm and build_ext.py must equal the wheel's).
#                         On the GPU the package's own import compiles _C.so against the torch
#                         there (the wheel's build_ext.py: c++ with torch's and CUDA's headers;
#                         the kernels are JIT-compiled by nvcc at their first call).
# usage: scripts/deepgemm-bundle.sh [--check] [vllm|sgl|all] [OUT_DIR]   (default: vllm, .device)
#   --check      build nothing, write nothing: print what each bundle would hold, and for sgl the
#                compile command build_ext.py would run (with this machine's torch), checking that
#                every file and include folder it names exists; exits 1 where it reports that a
#                bundle cannot be built
#   VLLM=0.34.0  take vLLM 0.34.0's copy instead of 0.33.0's (the two .so differ)
#   TORCH_LIB_DIR=DIR  also check vLLM's .so against the torch libraries in DIR (say, torch
#                2.11.0+cu130's torch/lib, unzipped from its wheel): every stable-ABI symbol found
# On the device: `. scripts/gpu_lib.sh; deepgemm_setup vllm` (or sgl) unpacks it into /tmp and
# prints the PYTHONPATH entry; scripts/gpu_check.sh's deepgemm steps do it all.
set -euo pipefail
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
what=${1:-vllm}
out=${2:-.device}
case $what in vllm|sgl|all) ;; *) echo "usage: $0 [--check] [vllm|sgl|all] [OUT_DIR]" >&2; exit 2 ;; esac
VLLM=${VLLM:-0.33.0}
SGL_DEEP_GEMM=0.2.3.post2
VLLM_WHEELS=${VLLM_WHEELS:-$HOME/.cache/dsv4spec/wheels}
PY=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cannot=0  # --check: set where a bundle cannot be built, the exit status

pack() {  # pack SITE NAME: the folder's contents as OUT/NAME, compressed for the carry limit
  mkdir -p "$out"
  tar -cf - -C "$1" . | xz -T2 -9e > "$out/$2.tmp" && mv "$out/$2.tmp" "$out/$2"
  ls -la "$out/$2"
}

vllm_bundle() {
  local name=deepgemm_vllm.tar.xz wheel
  wheel=$(ls "$VLLM_WHEELS"/vllm-"$VLLM"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    [ $check = 1 ] && { echo "vllm: no vLLM $VLLM wheel in $VLLM_WHEELS (make setup downloads it)"; return 0; }
    $PY -m pip download -q --no-deps "vllm==$VLLM" -d "$VLLM_WHEELS"
    wheel=$(ls "$VLLM_WHEELS"/vllm-"$VLLM"-*.whl | head -1)
  fi
  mkdir -p "$tmp/vllm/site"
  unzip -q -o "$wheel" 'vllm/third_party/deep_gemm/*' -d "$tmp/vllm/w"
  mv "$tmp/vllm/w/vllm/third_party/deep_gemm" "$tmp/vllm/site/deep_gemm"
  local so
  so=$(ls "$tmp"/vllm/site/deep_gemm/_C_extension*.so)
  # what it needs of torch: C symbols of the stable ABI, nothing of torch's C++ API
  local cxx
  cxx=$(nm -D --undefined-only "$so" | awk '{print $2}' | grep '^_Z' | c++filt \
        | grep -c 'c10::\|at::\|torch::' || true)
  echo "vllm: $(basename "$wheel"): deep_gemm $(sed -n "s/^__version__ = '\(.*\)'/\1/p" \
        "$tmp/vllm/site/deep_gemm/__init__.py"), $(basename "$so"), $cxx symbols of torch's C++ API"
  [ "$cxx" = 0 ] || { echo "vllm: its extension needs torch's C++ ABI: it loads only on the torch it was built for" >&2; exit 1; }
  if [ -n "${TORCH_LIB_DIR:-}" ]; then
    nm -D --defined-only "$TORCH_LIB_DIR"/lib*.so 2>/dev/null | awk '{print $3}' | sort -u > "$tmp/torch.syms"
    local missing
    missing=$(nm -D --undefined-only "$so" | awk '{print $2}' | grep '^aoti_torch_\|^torch_' \
              | sort -u | comm -23 - "$tmp/torch.syms")
    echo "vllm: stable-ABI symbols missing from $TORCH_LIB_DIR: ${missing:-none}"
    [ -z "$missing" ] || exit 1
  fi
  printf 'vLLM %s vllm/third_party/deep_gemm as deep_gemm\nsha256 %s\n' "$VLLM" \
    "$(sha256sum "$so" | cut -d' ' -f1)" > "$tmp/vllm/site/DEEPGEMM_BUNDLE"
  [ $check = 1 ] && { echo "vllm: would write $out/$name"; return 0; }
  pack "$tmp/vllm/site" "$name"
}

sgl_bundle() {
  local name=deepgemm_sgl.tar.xz site=$tmp/sgl/site
  mkdir -p "$tmp/sgl/whl" "$site"
  if ! $PY -m pip download -q --no-deps --only-binary=:all: "sgl-deep-gemm==$SGL_DEEP_GEMM" \
      -d "$tmp/sgl/whl"; then
    echo "sgl: cannot be built: pip could not download sgl-deep-gemm==$SGL_DEEP_GEMM" >&2
    [ $check = 1 ] || exit 1
    cannot=1
    return 0
  fi
  unzip -q -o "$tmp"/sgl/whl/sgl_deep_gemm-*.whl 'deep_gemm/*' -d "$site"
  rm -f "$site/deep_gemm/_C.so"  # built on the device, against the torch there
  # elfutils' headers, which deep_jit's exception.hpp includes (libdw itself is dlopen'ed): the
  # GPU image has no libdw-dev, so they travel (deepgemm_build.py puts them on CPATH)
  ( cd "$tmp/sgl" && apt-get download -q libdw-dev libelf-dev >/dev/null 2>&1 ) \
    || echo "sgl: apt-get download libdw-dev libelf-dev failed: the build needs elfutils' headers" >&2
  for deb in "$tmp"/sgl/*.deb; do [ -f "$deb" ] && dpkg -x "$deb" "$tmp/sgl/deb"; done
  [ -d "$tmp/sgl/deb/usr/include/elfutils" ] && cp -r "$tmp/sgl/deb/usr/include" "$site/include-extra"
  local version
  version=$(cat "$site/deep_gemm/VERSION")
  [ "$version" = "$SGL_DEEP_GEMM" ] || { echo "sgl: the wheel says $version" >&2; exit 1; }
  if [ -z "${DEEPGEMM_SRC:-}" ] || [ ! -f "$DEEPGEMM_SRC/csrc/torch_library_api.cpp" ]; then
    echo "sgl: DEEPGEMM_SRC must be a checkout of github.com/sgl-project/DeepGEMM at the" \
         "$SGL_DEEP_GEMM release (one with csrc/torch_library_api.cpp); got '${DEEPGEMM_SRC:-}'" >&2
    [ $check = 1 ] || exit 1
    "$PY" "$here/deepgemm_build.py" --dry-run "$site" || true
    echo "sgl: cannot be built without that checkout"
    cannot=1
    return 0
  else
    # the release check: the checkout's kernel headers and build script are the wheel's
    diff -rq "$DEEPGEMM_SRC/deep_gemm/include/deep_gemm" "$site/deep_gemm/include/deep_gemm" \
      && cmp "$DEEPGEMM_SRC/deep_gemm/build_ext.py" "$site/deep_gemm/build_ext.py" \
      || { echo "sgl: $DEEPGEMM_SRC is not the $SGL_DEEP_GEMM release the wheel was built from" >&2; exit 1; }
    cp -r "$DEEPGEMM_SRC/csrc" "$site/csrc"
    echo "sgl: csrc of $DEEPGEMM_SRC ($(git -C "$DEEPGEMM_SRC" rev-parse HEAD 2>/dev/null || echo 'not a git checkout')) matches the wheel"
  fi
  # the command the package's import runs on the device (here with this machine's torch)
  "$PY" "$here/deepgemm_build.py" --dry-run "$site"
  printf 'sgl-deep-gemm %s, csrc from %s\n' "$SGL_DEEP_GEMM" "${DEEPGEMM_SRC:-(none)}" \
    > "$site/DEEPGEMM_BUNDLE"
  [ $check = 1 ] && { echo "sgl: would write $out/$name"; return 0; }
  pack "$site" "$name"
}

case $what in
  vllm) vllm_bundle ;;
  sgl) sgl_bundle ;;
  all) vllm_bundle; sgl_bundle ;;
esac
exit $cannot
