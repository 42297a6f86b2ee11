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
         include/tern/kernels/codec.h include/tern/tern/v1/tensor.pb.h lib/libtern_c.so \
         include/tern/clients/c/tern_c.h lib/libtern_embedded.so \
         include/tern/clients/embedded/tern_embedded.h; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
"$work/prefix/bin/tern" version
# The units start the tern installed with them.
for u in worker server scheduler; do
  grep -q "^ExecStart=$work/prefix/bin/tern $u " "$work/prefix/lib/systemd/system/tern-$u.service" \
    || { echo "tern-$u.service does not start $work/prefix/bin/tern:"; grep ExecStart "$work/prefix/lib/systemd/system/tern-$u.service"; exit 1; }
done
# The Python package finds the installed C API beside the installed tern on PATH.
if /usr/bin/python3 -c "import numpy" 2> /dev/null; then
  env -u TERN_LIBRARY PATH="$work/prefix/bin:$PATH" PYTHONPATH="$here/../../clients/python" \
    /usr/bin/python3 -c "
import tern.native as n
assert n.library() is not None, n.where()
print('tern.native: C API found beside the installed tern')"
  env -u TERN_EMBEDDED_LIBRARY PATH="$work/prefix/bin:$PATH" \
    PYTHONPATH="$here/../../clients/python:$build/clients/python" \
    /usr/bin/python3 -c "
import tern.embedded as e
assert e.library() is not None, e.where()
print('tern.embedded: the library found beside the installed tern')"
fi
cmake -S "$here/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
# The C++ client library's examples, built against the installed tree, in a real run: an
# installed `tern server` and two linear_client participants with their own model.
cmake -S "$here/../../examples/cpp" -B "$work/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure-examples.log" \
  || { cat "$work/configure-examples.log"; exit 1; }
cmake --build "$work/examples" > "$work/build-examples.log" || { cat "$work/build-examples.log"; exit 1; }
"$work/prefix/bin/tern" server --mode=federated --min_clients=2 --clients_per_round=2 --rounds=15 \
    --local_epochs=0 --local_steps=10 --lr=0.02 --grace_s=0 --linger_s=5 \
    --port_file="$work/server.port" > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 200); do [ -s "$work/server.port" ] && break; sleep 0.05; done
address=127.0.0.1:$(cat "$work/server.port")
"$work/examples/linear_client" "$address" 0 > "$work/client-0.log" 2>&1 & c0=$!
"$work/examples/linear_client" "$address" 1 > "$work/client-1.log" 2>&1 & c1=$!
ok=0
wait $c0 || ok=1
wait $c1 || ok=1
kill $server 2> /dev/null || true
wait $server 2> /dev/null || true
cat "$work/client-0.log" "$work/client-1.log"
[ $ok -eq 0 ] || { tail -20 "$work/server.log"; exit 1; }
# Both took part in every round, and the model they trained together is near the truth.
grep -q "15 rounds, 15 updates accepted" "$work/client-0.log"
awk '/off W\*/ { if ($(NF-3) + 0 > 0.1) exit 1 }' "$work/client-0.log"
