"""Turning a device request (auto | cpu | cuda | cuda:N) into a device this machine has (imports torch lazily)."""

from __future__ import annotations

from attnbench.core.catalogue import DEVICE_REQUEST
from attnbench.core.errors import DeviceError


def resolve_device(request: str) -> str:
    """ "auto" → "cuda:0" when CUDA works, else "cpu"; "cuda" → "cuda:0"; checks that the device exists."""
    if not DEVICE_REQUEST.fullmatch(request):
        raise DeviceError(f"--device: {request!r} is not a device", hint="use auto, cpu, cuda or cuda:N")
    if request == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if request == "auto":
        return "cuda:0" if available else "cpu"
    if not available:
        raise DeviceError(
            f"device {request!r} was asked for but CUDA is not available here "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})",
            hint="use --device cpu, or install a CUDA build of torch on a machine with a GPU",
        )
    index = int(request.split(":")[1]) if ":" in request else 0
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"device {request!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible",
            hint="check CUDA_VISIBLE_DEVICES or pick a lower index",
        )
    return f"cuda:{index}"


def device_slug(device: str) -> str:
    return device.replace(":", "")


def use_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count (None: leave torch's default). Before collecting an environment, so that
    it records the count the measurements run with."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
