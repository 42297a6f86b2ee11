#!/usr/bin/env bash
# Every check that needs a GPU, in one run (docs/cuda.md): the CUDA tests, memcheck and
# racecheck over them, and tern_gpu_bench at 16M and 64M floats with torch.topk as the anchor.
#
#   bench/gpu/device_checks.sh [BUILD_DIR] [LOG_DIR]        (build, /tmp/tern-gpu-checks)
#
# BUILD_DIR holds kernels/cuda_device_test and bench/tern_gpu_bench (built with nvcc; they may
# be copied to a GPU machine with their shared libraries on LD_LIBRARY_PATH). Each step has its
# own time limit (TERN_SANITIZER_TIMEOUT, 150 s by default, for each sanitizer run) so a slow
# step cannot eat the others; the summary at the end names each step's exit status.
set -u
build=${1:-build}
logs=${2:-/tmp/tern-gpu-checks}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$logs"
test_bin=$build/kernels/cuda_device_test
[ -x "$test_bin" ] || test_bin=$build/bin/cuda_device_test
bench_bin=$build/bench/tern_gpu_bench
[ -x "$bench_bin" ] || bench_bin=$build/bin/tern_gpu_bench
python=${PYTHON:-python3}
sanitizer_timeout=${TERN_SANITIZER_TIMEOUT:-150}
summary=()

step() {  # step NAME LIMIT_S COMMAND...: runs it, its output to LOG_DIR/NAME.log and the tail here
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n 12 "$logs/$name.log"
  summary+=("$name rc=$rc $((SECONDS - t0))s")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
step tests 300 "$test_bin"
for n in 16777216 67108864; do
  step "bench_$n" 120 "$bench_bin" "$n" 10
  step "torch_topk_$n" 120 "$python" "$here/torch_topk.py" "$n" 0.001 10
done
step memcheck "$sanitizer_timeout" compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin"
step racecheck "$sanitizer_timeout" compute-sanitizer --tool racecheck --error-exitcode 3 "$test_bin"
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
