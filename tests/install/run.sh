#!/usr/bin/env bash
# Installs a built tern tree into a temporary prefix and builds and runs a project outside the
# tree against it with find_package(tern). Usage: tests/install/run.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in bin/tern lib/systemd/system/tern-worker.service lib/sysusers.d/tern.conf \
         share/tern/examples/worker.flags lib/cmake/tern/tern-config.cmake \
         include/tern/kernels/codec.h include/tern/tern/v1/tensor.pb.h; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
"$work/prefix/bin/tern" version
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
