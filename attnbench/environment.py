"""What the numbers were measured on (DESIGN §3 ``Environment``).

Layer 2. torch, psutil and pynvml are imported lazily inside functions and their absence is tolerated, so
``report`` and ``compare`` can read an environment without any of them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Keys that must match before two runs may be compared (pyperf's idea): different hardware or software stacks
# make a timing difference meaningless as a regression signal.
FINGERPRINT_KEYS: tuple[str, ...] = (
    "device_type",
    "cpu_model",
    "gpu_name",
    "driver_major",
    "torch",
    "torch_cuda",
    "cudnn",
    "torch_threads",
)


@dataclass(frozen=True)
class Environment:
    attnbench: str
    python: str
    platform: str
    hostname: str
    cpu_model: str
    cpu_logical: int | None
    cpu_physical: int | None
    memory_bytes: int | None
    torch: str | None
    torch_cuda: str | None
    cudnn: str | None
    flash_attn: str | None
    torch_threads: int | None
    device: str
    device_type: str
    gpu_name: str | None = None
    gpu_capability: str | None = None
    gpu_sm_count: int | None = None
    gpu_memory_bytes: int | None = None
    driver: str | None = None
    nvml: str = "not checked"
    git_commit: str | None = None

    @property
    def driver_major(self) -> str | None:
        return self.driver.split(".", 1)[0] if self.driver else None

    def fingerprint_fields(self) -> dict[str, Any]:
        data = asdict(self)
        data["driver_major"] = self.driver_major
        return {key: data[key] for key in FINGERPRINT_KEYS}

    def fingerprint(self) -> str:
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprint"] = self.fingerprint()
        return data

    def resume_fields(self) -> dict[str, Any]:
        """What must match to add rows to an existing run: the fingerprint, and the code doing the measuring."""
        return {
            **self.fingerprint_fields(),
            "attnbench": self.attnbench,
            "git_commit": self.git_commit,
            "flash_attn": self.flash_attn,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Environment:
        """Raises TypeError when a required field is missing (a damaged run.json)."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


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


def nvml_status() -> tuple[str, str | None]:
    """("available", driver) or ("unavailable: why", None). Lazily imports pynvml (nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return "unavailable: the nvidia-ml-py package (module pynvml) is not installed", None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"unavailable: {exc}", None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return "available", driver if isinstance(driver, str) else driver.decode()
    except pynvml.NVMLError as exc:
        return f"available (driver version unknown: {exc})", None
    finally:
        pynvml.nvmlShutdown()


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

        torch_version = torch.__version__
        torch_cuda = torch.version.cuda
        cudnn_v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cudnn = None if cudnn_v is None else str(cudnn_v)
        threads = torch.get_num_threads()
        if device.startswith("cuda") and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.device(device))
            gpu = {
                "gpu_name": props.name,
                "gpu_capability": f"{props.major}.{props.minor}",
                "gpu_sm_count": props.multi_processor_count,
                "gpu_memory_bytes": props.total_memory,
            }
    except ImportError:
        pass
    nvml, driver = nvml_status() if device.startswith("cuda") else ("not used on CPU runs", None)
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
        flash_attn=_version("flash-attn") or _version("flash_attn"),
        torch_threads=threads,
        device=device,
        device_type=device.split(":", 1)[0],
        driver=driver,
        nvml=nvml,
        git_commit=_git_commit(),
        **gpu,
    )
