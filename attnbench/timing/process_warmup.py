"""The first case of a process reads slow: what it pays, and the process-level warm-up that pays it instead.

Three near-identical cases in one process read 0.66 vs 0.36 ms and 0.42 vs 0.27 ms, whichever came first, and a
forced-backend comparison swung from 1.0× to 2.5× with the order of the models (issue 17, item 8). A case's own
warm-up runs until a few calls agree — milliseconds for a small case — which settles what the case itself builds
(kernels, plans, its tensors' pages) but not what the *process* does once, on first use, and keeps doing
differently for a while after:

* the intra-op thread pool (OpenMP) is created at the first parallel region, and its threads then spin or sleep
  by their own heuristics, which settle only after many regions;
* the autograd engine starts its worker threads at the first backward;
* the cores ramp their clocks up only under sustained load: after seconds of single-threaded importing, the other
  cores start low;
* the allocator grows its arenas, and first-use library initialisation (oneDNN/MKL dispatch, cuBLAS handles and
  workspaces on a GPU) runs on the first call that needs it.

So before the first case, ``warm_process`` runs a mixed workload that touches all of it — matmuls, attention,
element-wise and normalisation ops, a small backward — for ``timing.process_warmup_s`` (0.5 s by default), on
the case's device, with the threads the cases will use. Later cases of the process need nothing more.
"""

from __future__ import annotations

import time

import torch


def warm_process(device: torch.device, seconds: float) -> float:
    """Run the warm-up workload on ``device`` for ``seconds`` (at least one round); the seconds it took."""
    start = time.perf_counter()
    if seconds <= 0:
        return 0.0
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(256, 256, generator=generator).to(device)
    q = torch.randn(1, 4, 64, 32, generator=generator).to(device)
    weight = torch.randn(256, 256, generator=generator).to(device).requires_grad_(True)
    out = torch.empty_like(a)
    while True:
        torch.mm(a, a, out=out)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.nn.functional.layer_norm(torch.nn.functional.gelu(out), (256,))
        loss = (a @ weight).softmax(-1).sum()
        loss.backward()
        weight.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if time.perf_counter() - start >= seconds:
            return time.perf_counter() - start
