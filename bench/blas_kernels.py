"""The OpenBLAS kernels the tern binary runs, for the benchmarks to give torch the same ones.

OpenBLAS picks its kernels by CPU model as it loads; on a CPU newer than Debian 12's OpenBLAS
(0.3.21) it falls back to generic x86-64 kernels 3-5x slower, and the tern binary then chooses
better ones itself (OPENBLAS_CORETYPE, core/workload/blas_core.h). torch loads the same library,
so a benchmark that sets the same OPENBLAS_CORETYPE for its torch side compares like with like.
"""
import subprocess


def tern_blas_core(tern):
    """The kernels `tern version` reports ("SkylakeX", "Haswell", ...), or "" if it says none."""
    out = subprocess.run([tern, "version"], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("OpenBLAS kernels: "):
            return line.split(": ", 1)[1].split(" ", 1)[0]
    return ""


def same_kernels_env(tern):
    """{"OPENBLAS_CORETYPE": core} for torch processes, so they run tern's kernels."""
    core = tern_blas_core(tern)
    return {"OPENBLAS_CORETYPE": core} if core else {}
