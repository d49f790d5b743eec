"""Reading the machine and software stack into an ``Environment`` (the value lives in ``results.environment``).

torch, psutil and pynvml are imported inside the functions and their absence is tolerated.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnbench.families.catalogue import packages
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.identity import cuda_identity
from attnbench.host.sensors.nvml import load_nvml, nvml_handle_for
from attnbench.host.sensors.session import IdentityLookup, NvmlLoader
from attnbench.host.sensors.settings import read_settings
from attnbench.results.environment import CodeIdentity, Environment


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """The commit of the attnbench checkout doing the measuring, when it runs from one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    # Only our own checkout counts: a venv inside some other repository would report that repository's HEAD.
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != here.parent:
        return None
    return lines[1]


def code_identity(folder: Path | None = None) -> CodeIdentity | None:
    """The git checkout ``folder`` (default: the working directory) belongs to — the code a sweep started there
    benchmarks — or None outside a checkout or without git."""
    where = str(folder or Path.cwd())

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--verify", "-q", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    branch = git("symbolic-ref", "--short", "-q", "HEAD")
    return CodeIdentity(
        commit=head.stdout.strip(),
        dirty=status is None or status.returncode != 0 or bool(status.stdout.strip()),
        branch=branch.stdout.strip() or None if branch is not None and branch.returncode == 0 else None,
    )


def nvml_environment(
    device: str, nvml: NvmlLoader = load_nvml, identity: IdentityLookup = cuda_identity
) -> dict[str, Any]:
    """The NVML part of an ``Environment`` for ``device``: ``nvml`` (available or why not), ``driver`` and, on a
    CUDA device NVML can find, the GPU's settings (``host.sensors.settings``). ``nvml`` and ``identity`` are
    the telemetry package's seams (a fake pynvml in tests)."""
    try:
        bindings = nvml()
    except TelemetryUnavailable as exc:
        return {"nvml": f"unavailable: {exc}"}
    try:
        bindings.nvmlInit()
    except bindings.NVMLError as exc:
        return {"nvml": f"unavailable: {exc}"}
    found: dict[str, Any] = {"nvml": "available"}
    try:
        try:
            driver = bindings.nvmlSystemGetDriverVersion()
            found["driver"] = driver if isinstance(driver, str) else driver.decode()
        except bindings.NVMLError as exc:
            found["nvml"] = f"available (driver version unknown: {exc})"
        if not device.startswith("cuda"):
            return found
        try:
            ident = identity(device)
            handle = nvml_handle_for(ident.uuid, ident.pci_bus_id, bindings)
        except TelemetryUnavailable as exc:
            found["gpu_settings_note"] = f"GPU settings not read: {exc}"
            return found
        settings = read_settings(bindings, handle)
        found.update(settings.values)
        found["gpu_settings_note"] = settings.note
        return found
    finally:
        with contextlib.suppress(bindings.NVMLError):
            bindings.nvmlShutdown()


def _cudnn_compile(torch: Any) -> str | None:
    """The cuDNN version torch was built against, "9.13.0"; None without cuDNN."""
    cudnn = getattr(torch._C, "_cudnn", None)
    if cudnn is None:
        return None
    try:
        return ".".join(str(part) for part in cudnn.getCompileVersion())
    except (AttributeError, RuntimeError):
        return None


# Prefixes of the variables that steer the CPU thread pools torch uses (OpenMP, Intel's and LLVM's runtimes, MKL,
# oneDNN): ``Environment.thread_env``.
THREAD_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "DNNL_", "ONEDNN_")


def thread_env(environ: Mapping[str, str] | None = None) -> str:
    """The thread-pool variables set in ``environ`` (this process's by default), sorted, as ``KEY=value`` words."""
    found = os.environ if environ is None else environ
    return " ".join(f"{k}={v}" for k, v in sorted(found.items()) if k.startswith(THREAD_ENV_PREFIXES))


def installed_packages() -> dict[str, str]:
    """The kernel packages the families name (``catalogue.packages``) that are installed, with their versions."""
    found = {}
    for package in packages():
        version = _version(package.distribution) or _version(package.module)
        if version is not None:
            found[package.distribution] = version
    return dict(sorted(found.items()))


def collect_environment(device: str = "cpu") -> Environment:
    """Read the machine and software stack. ``device`` is a resolved device string ("cpu", "cuda:0")."""
    try:
        import psutil

        logical, physical = psutil.cpu_count(logical=True), psutil.cpu_count(logical=False)
        memory = int(psutil.virtual_memory().total)
    except ImportError:
        logical, physical, memory = os.cpu_count(), None, None
    torch_version = torch_cuda = cudnn = None
    threads = None
    gpu: dict[str, Any] = {}
    try:
        import torch

        from attnbench.families.registry import process_settings

        # What every executor runs with (TorchExecutor makes the settings in its process; this one only asks).
        gpu["settings"] = process_settings()
        torch_version = torch.__version__
        torch_cuda = torch.version.cuda
        cudnn_v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cudnn = None if cudnn_v is None else str(cudnn_v)
        gpu["cudnn_compile"] = _cudnn_compile(torch)
        threads = torch.get_num_threads()
        if device.startswith("cuda") and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.device(device))
            gpu.update(
                gpu_name=props.name,
                gpu_capability=f"{props.major}.{props.minor}",
                gpu_sm_count=props.multi_processor_count,
                gpu_memory_bytes=props.total_memory,
                gpu_l2_bytes=getattr(props, "L2_cache_size", None),
            )
    except ImportError:
        pass
    if device.startswith("cuda"):
        gpu.update(nvml_environment(device))
    else:
        gpu["nvml"] = "not used on CPU runs"
    return Environment(
        attnbench=_version("attnbench") or "unknown",
        python=sys.version.split()[0],
        platform=platform.platform(),
        hostname=platform.node(),
        cpu_model=_cpu_model(),
        cpu_logical=logical,
        cpu_physical=physical,
        memory_bytes=memory,
        torch=torch_version,
        torch_cuda=torch_cuda,
        cudnn=cudnn,
        packages=installed_packages(),
        torch_threads=threads,
        device=device,
        device_type=device.split(":", 1)[0],
        git_commit=_git_commit(),
        thread_env=thread_env(),
        **gpu,
    )
