#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4 and its CuTe DSL runtime) carried to the GPU machine in two device calls: its
# nvidia-cutlass-dsl-libs-cu13 wheel (92 MB) is more than one call's 64 MiB carry (../shared/GPU_FACTS.md).
#   here:               bash scripts/gpu/carry_fa4.sh pack      -> .fa4/p1 (48 MB), .fa4/p2 and .fa4/wheels/ (git-ignored)
#   call 1 (carry .fa4/p1):                  bash scripts/gpu/carry_fa4.sh stash && ...   (keeps p1 in /tmp)
#   call 2, at once on the same warm machine (carry .fa4/p2, .fa4/wheels):
#                       bash scripts/gpu/carry_fa4.sh install && bash scripts/gpu/run_all.sh kernel-vs-fa4
# install puts everything in /tmp/site, which scripts/gpu/run_all.sh puts on PYTHONPATH.
set -euo pipefail
case "${1:-}" in
pack)
  rm -rf .fa4 && mkdir -p .fa4/wheels && tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$tmp" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 quack-kernels==0.6.5 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 nvidia-cutlass-dsl-libs-cu13==4.8.1
  (cd "$tmp" && mkdir cu13 && cd cu13 && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl \
    && tar cf - nvidia_cutlass_dsl | xz -9e -T2 > ../cu13.tar.xz)   # ~64 MB, a few minutes on 2 cores
  head -c 48000000 "$tmp/cu13.tar.xz" > .fa4/p1 && tail -c +48000001 "$tmp/cu13.tar.xz" > .fa4/p2
  mv "$tmp"/*.whl .fa4/wheels/ && rm .fa4/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl && rm -rf "$tmp"
  ls -la .fa4 .fa4/wheels ;;
stash) cp .fa4/p1 /tmp/fa4-p1 && echo "fa4: part 1 kept in /tmp" ;;
install)
  [ -f /tmp/fa4-p1 ] || { echo "fa4: /tmp/fa4-p1 missing (call 1 ran on another machine?)"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .fa4/wheels/*.whl
  cat /tmp/fa4-p1 .fa4/p2 | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/site')"
  echo "fa4: installed in /tmp/site" ;;
*) echo "usage: carry_fa4.sh pack|stash|install" >&2; exit 2 ;;
esac
