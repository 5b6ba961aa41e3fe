#!/usr/bin/env bash
# Build, HERE (a machine that reaches PyPI), the trimmed Ray that docs/results/ray/reproduce.sh carries to the GPU machine.
#
# Why: the GPU image has no Ray and no network, and Ray's cp312 wheel is 79 MB, over the 64 MiB a device call may
# carry. A local runtime needs Ray core only: the GCS, the raylet, the core worker, the runtime-env agent. So this
# unpacks the wheel, drops what a local runtime never loads (the Java jars, the dashboard's web client, the
# libraries rllib/tune/train/serve/data/llm/air/workflow, __pycache__; ray.widgets stays: the core imports it),
# strips the symbol tables of the three native binaries (_raylet.so, gcs_server, raylet: debugging symbols only),
# adds the pure-Python deps the image lacks (jsonschema, jsonschema-specifications, referencing, and rpds-py's
# cp312 build; the image has click, filelock, msgpack, packaging, protobuf, pyyaml, requests, attrs) and packs one
# tarball to unpack into /tmp/site: 203 MB unpacked → 105 MB trimmed → 18.5 MB as .tar.xz (xz -9: ~3 min here).
#
# Usage (repo root):
#   bash scripts/gpu/ray_pack.sh            # → .whl/ray-trim-cp312.tar.xz (18.5 MB); docs/results/ray/reproduce.sh unpacks it
#   bash scripts/gpu/ray_pack.sh --check    # the same trim for THIS Python (cp311 here), then start a runtime from
#                                           # it with a bare interpreter and only the image's deps: proves the trim
#                                           # is safe where the cp312 build cannot be imported
# Env: PYTHON (python3: the interpreter whose pip downloads and, with --check, whose version and site-packages
# stand in for the image's), RAY_VERSION (2.60.0), RAY_WHEEL (a local wheel to use instead of downloading Ray),
# WHEELS_DIR (keep the downloads there between runs), MAX_MB (35: refuse a bigger pack).
set -euo pipefail
RAY_VERSION=${RAY_VERSION:-2.60.0}
DEPS=(jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1)
PYTHON=${PYTHON:-python3}
MAX_MB=${MAX_MB:-35}
check=0; [ "${1:-}" = "--check" ] && check=1
if [ $check = 1 ]; then
  py=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
else
  py=3.12
fi
tag=cp${py/./}
out=${OUT_TAR:-.whl/ray-trim-$tag.tar.xz}
work=$(mktemp -d /tmp/ray-pack.XXXXXX)
trap 'rm -rf "$work"' EXIT
wheels=${WHEELS_DIR:-$work/wheels}
mkdir -p "$wheels" "$work/site" "$(dirname "$out")"

platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
download() {
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    "${platforms[@]}" -d "$wheels" "$@"
}
if [ -n "${RAY_WHEEL:-}" ]; then
  cp "$RAY_WHEEL" "$wheels/"
else
  download "ray==$RAY_VERSION"
fi
download "${DEPS[@]}"
ls -la "$wheels"

# A wheel is a zip of site-packages content: unzipping it is installing it (no entry-point scripts needed here).
for w in "$wheels"/ray-"$RAY_VERSION"-"$tag"-*.whl "$wheels"/jsonschema-*.whl "$wheels"/jsonschema_spec*.whl \
         "$wheels"/referencing-*.whl "$wheels"/rpds_py-*-"$tag"-*.whl; do
  unzip -q -o "$w" -d "$work/site"
done
rm -rf "$work"/site/*.data
before=$(du -sm "$work/site" | cut -f1)
r="$work/site/ray"
rm -rf "$r/jars" "$r/rllib" "$r/tune" "$r/train" "$r/serve" "$r/data" "$r/llm" "$r/air" "$r/workflow" \
       "$r/dashboard/client"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
strip --strip-unneeded "$r/_raylet.so" "$r/core/src/ray/gcs/gcs_server" "$r/core/src/ray/raylet/raylet"
after=$(du -sm "$work/site" | cut -f1)
echo "site: ${before} MB unpacked → ${after} MB trimmed"
XZ_OPT="-9 -T0" tar -C "$work/site" -cJf "$out" .
mb=$(( $(stat -c %s "$out") / 1048576 ))
echo "wrote $out ($(stat -c %s "$out") bytes, ~${mb} MB)"
if [ "$mb" -ge "$MAX_MB" ]; then
  echo "the pack is ${mb} MB, over MAX_MB=${MAX_MB}: it will not fit beside the working tree in one device call" >&2
  exit 1
fi
[ $check = 0 ] && exit 0

# --check: a bare interpreter (no site-packages) sees the unpacked pack plus ONLY the packages the GPU image has.
base=$("$PYTHON" -c 'import sys; print(sys._base_executable)')
sp=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')
"$base" -m venv --without-pip "$work/venv"
mkdir -p "$work/unpacked" "$work/image"
tar -C "$work/unpacked" -xJf "$out"
for m in click filelock msgpack packaging google yaml _yaml requests urllib3 idna charset_normalizer certifi attr attrs \
         typing_extensions.py; do
  [ -e "$sp/$m" ] && ln -s "$sp/$m" "$work/image/$m"
done
cat > "$work/check.py" <<'EOF'
"""Start a local runtime from the trimmed pack; a task gets its runtime_env, dies once, is retried."""
import os
import sys

import ray

assert ray.__file__.startswith(sys.argv[1]), ray.__file__
marker = os.path.join(sys.argv[2], "died")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 << 20,
         runtime_env={"env_vars": {"PACK_CHECK": "ok"}})


@ray.remote(max_retries=1, num_cpus=1)
def once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)  # the first attempt's worker dies; Ray retries in a new one
    return os.environ.get("PACK_CHECK"), ray.__file__, os.getpid()


value, where, pid = ray.get(once.remote(marker))
print("task:", value, where, "pid", pid, "resources", ray.cluster_resources())
assert value == "ok" and where.startswith(sys.argv[1]) and os.path.exists(marker)
ray.shutdown()
print("pack check: ok")
EOF
PYTHONPATH="$work/unpacked:$work/image" timeout 300 "$work/venv/bin/python" "$work/check.py" "$work/unpacked" "$work"
