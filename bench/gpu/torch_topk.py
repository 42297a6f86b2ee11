"""The anchor for the GPU sparsifiers: torch.topk of |x| on the same device and size.

    python3 bench/gpu/torch_topk.py [N_FLOATS] [RATIO] [REPEATS]    (64M, 0.001, 10; median ms)
"""
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
ratio = float(sys.argv[2]) if len(sys.argv) > 2 else 0.001
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 10
x = torch.randn(n, device="cuda")
k = max(1, int(n * ratio))
times = []
for r in range(repeats + 1):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    values, idx = torch.topk(x.abs(), k, sorted=False)
    v, i = x[idx].cpu(), idx.cpu()  # to the host, as a payload would go
    torch.cuda.synchronize()
    if r:
        times.append(time.perf_counter() - t0)
times.sort()
print(f"torch {torch.__version__} topk of {n} floats, k={k}: {1e3 * times[len(times) // 2]:.3f} ms "
      f"(with the values and indices copied to the host)")
