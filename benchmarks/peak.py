"""The hardware's limit: the matmul peak that MFU is measured against.

    from benchmarks.peak import gemm_peak
    gemm_peak(torch.bfloat16, 2048, 5, torch.device("cpu"))   # {"flops_per_s": ..., "layout": "A@B", ...}

`python -m benchmarks.bench` times it before, between and after its runs (`--gemm-size`,
`--gemm-reps`) and divides by the best: on a shared machine the best is the hardware's limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

# The dtype of the peak for each of Accelerate's mixed-precision settings.
PEAK_DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU): a timer around GPU work needs it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(dtype: torch.dtype, size: int, reps: int, device: torch.device, budget_s: float = 20.0) -> dict:
    """FLOP/s of the best of `reps` square GEMMs, in the fastest layout a training step uses.

    A linear layer's forward is x @ W^T, its backward dX = dY @ W and dW = dY^T @ X: three layouts,
    which BLAS libraries may serve at very different speeds (CPUs without native bf16 do: torch
    falls back to its own loops, fast only where it can use a vectorised dot product; with AMX,
    oneDNN ran 2048^3 bf16 A@B at 2.3 TFLOP/s and A^T@B at 1.0). Each layout is timed at `size`
    (all recorded) and the best is the peak; a layout slow enough to blow `budget_s` stops after
    one repetition. (Choosing the layout by a probe at 512 picked A^T@B on some runs and halved
    the peak.)
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    layouts: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "A@B": lambda a, b: a @ b,
        "A@B^T": lambda a, b: a @ b.t(),
        "A^T@B": lambda a, b: a.t() @ b,
    }

    def best_rate(fn, n: int, k: int) -> float:
        a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        best, spent = math.inf, 0.0
        for i in range(k + 1):  # the first call is a warm-up
            synchronize(device)
            t = time.perf_counter()
            fn(a, b)
            synchronize(device)
            dt = time.perf_counter() - t
            spent += dt
            if i > 0 or k == 0:
                best = min(best, dt)
            if spent > budget_s and best < math.inf:
                break
        return 2 * n**3 / best

    rates = {name: best_rate(fn, size, reps) for name, fn in layouts.items()}
    layout = max(rates, key=rates.get)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "size": size,
        "layout": layout,
        "flops_per_s": rates[layout],
        "layouts_flops_per_s": rates,
    }
