"""Turning a device request (auto | cpu | cuda | cuda:N) into a device this machine has.

``resolve_device`` asks torch (imported lazily), which takes seconds; ``guess_device`` answers the same question
without torch, from what the files say (torch's own ``version.py``, ``/proc/driver/nvidia``,
``CUDA_VISIBLE_DEVICES``), for a dry run that must not pay for importing torch, and says what it went by.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from attnbench.core.cases import DEVICE_REQUEST
from attnbench.core.errors import DeviceError

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver has bound


def _check_request(request: str) -> None:
    if not DEVICE_REQUEST.fullmatch(request):
        raise DeviceError(f"--device: {request!r} is not a device", hint="use auto, cpu, cuda or cuda:N")


def resolve_device(request: str) -> str:
    """ "auto" → "cuda:0" when CUDA works, else "cpu"; "cuda" → "cuda:0"; checks that the device exists."""
    _check_request(request)
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


# The variables a person sets to choose the thread count themselves; attnbench's default then stays out of the way.
THREAD_COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def resolve_threads(threads: int | None, device: str, *, cpus: int | None = None) -> int | None:
    """The CPU thread count cases run with: ``threads`` when the config or ``--threads`` gives one, else on a CPU
    every CPU this process may use but one, where torch would take them all (None: torch's default).

    Why one is left free: a thread on every CPU shares each of them with everything else that runs — the sweep's
    telemetry sampler, the OS, the hypervisor placing a VM's vCPUs — and an OpenMP kernel that meets a barrier every
    step (an LSTM's 256 steps) waits each time on its slowest thread. On a 2-vCPU VM a two-thread LSTM read at levels
    up to 2× apart from one fresh process to the next, and within one process from one 2 s window to the next, where
    one thread held 6.5–7.3 ms (results/lstm-levels-cpu.md); calibrate's floor and compare's A/A and power tables
    at both counts are in results/README.md. On a GPU the host threads only launch kernels, and torch's default
    stays. ``cpus`` stands in for the affinity count (tests)."""
    if threads is not None or not device.startswith("cpu"):
        return threads
    if any(os.environ.get(name) for name in THREAD_COUNT_VARIABLES):
        return None  # the person chose through the environment: torch reads it
    from attnbench.host.busy import logical_cores

    usable = logical_cores() if cpus is None else cpus
    import torch

    return usable - 1 if usable > 1 and torch.get_num_threads() >= usable else None


def use_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count (None: leave torch's default). Before collecting an environment, so that
    it records the count the measurements run with."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


@contextmanager
def threads_handed_back(threads: int | None) -> Iterator[None]:
    """``use_threads(threads)`` for the block, then the count it found. The count is the process's: a sweep run
    inside a caller's process (the CLI invoked in-process by a test or a notebook) must not leave its config's
    setting behind for the caller's own torch work, or for the next sweep's environment."""
    if threads is None:
        yield
        return
    import torch

    found = torch.get_num_threads()
    use_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(found)


@dataclass(frozen=True)
class DeviceGuess:
    """What ``resolve_device`` would most likely answer, told without importing torch."""

    device: str
    basis: str = ""  # for "auto": what the answer rests on, in words
    problem: str = ""  # for "cuda"/"cuda:N": why resolve_device would refuse it here, if it looks that way


def guess_device(request: str, *, gpus: Path = NVIDIA_GPUS) -> DeviceGuess:
    """``resolve_device`` without torch: CUDA works when torch is a CUDA build and the driver shows a GPU that
    ``CUDA_VISIBLE_DEVICES`` leaves visible. A driver too old for the build, or a GPU in use elsewhere, can still
    make torch say no: the basis says it is a guess."""
    _check_request(request)
    if request == "cpu":
        return DeviceGuess("cpu")
    build = _torch_cuda_build()
    visible = _visible_gpus(gpus)
    facts = f"{build or 'a torch build without CUDA'}, {visible} NVIDIA GPU{'s' if visible != 1 else ''} visible"
    works = build is not None and visible > 0
    if request == "auto":
        return DeviceGuess("cuda:0" if works else "cpu", basis=f"{facts}; told without importing torch")
    index = int(request.split(":")[1]) if ":" in request else 0
    problem = ""
    if not works:
        problem = f"CUDA does not look available here ({facts}): the sweep itself would refuse {request!r}"
    elif index >= visible:
        problem = f"device {request!r} does not look present ({facts}): the sweep itself would refuse it"
    return DeviceGuess(f"cuda:{index}", problem=problem)


def _torch_cuda_build() -> str | None:
    """ "CUDA 12.8" for a CUDA build of torch, read from torch/version.py without importing torch; None for a CPU
    build or when torch cannot be found."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        build = cuda_build_in(Path(folder) / "version.py")
        if build is not None:
            return build
    return None


def cuda_build_in(version_file: Path) -> str | None:
    """The ``cuda = '12.8'`` that torch's generated version.py holds, as "CUDA 12.8"; None for ``cuda = None``,
    or a file that is missing or unreadable."""
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            targets: list[ast.expr] = [node.target]
            value = node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets) and isinstance(value, ast.Constant):
            return f"CUDA {value.value}" if isinstance(value.value, str) else None
    return None


def _visible_gpus(gpus: Path) -> int:
    """NVIDIA GPUs the driver shows, less those ``CUDA_VISIBLE_DEVICES`` hides (CUDA stops reading the list at
    the first entry that names no device)."""
    try:
        present = sum(1 for _ in gpus.iterdir())
    except OSError:
        return 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return present
    count = 0
    for entry in (e.strip() for e in listed.split(",")):
        if (entry.isdigit() and int(entry) < present) or entry.startswith(("GPU-", "MIG-")):
            count += 1
        else:
            break
    return min(count, present)
