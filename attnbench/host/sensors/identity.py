"""Which physical GPU a torch device is, in terms NVML understands (UUID, PCI bus id).

NVML numbers devices by PCI order over the whole machine, while CUDA numbers the devices it can see
(``CUDA_VISIBLE_DEVICES``, fastest-first ordering), so a torch index is never an NVML index. The UUID and the PCI
bus id are the same on both sides. torch is imported inside ``cuda_identity`` only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnbench.host.sensors.faults import TelemetryUnavailable

_HEX_UUID = re.compile(r"(GPU-|MIG-)?([0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})", re.IGNORECASE)


@dataclass(frozen=True)
class GpuIdentity:
    device: str  # the torch device, "cuda:0"
    uuid: str | None = None  # NVML's form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    pci_bus_id: str | None = None  # "00000000:3b:00.0" (domain:bus:device.function, hex)


def nvml_uuid(text: str) -> str | None:
    """NVML's form of a UUID as torch prints it (bare 8-4-4-4-12 hex: a whole GPU, "GPU-…"), or None if it is not
    one. A MIG slice's "MIG-…" keeps its prefix: NVML finds the slice by it, and "GPU-" with the slice's hex would
    name no device (or, worse, be taken for the parent GPU)."""
    match = _HEX_UUID.fullmatch(text.strip())
    if match is None:
        return None
    prefix = (match.group(1) or "GPU-").upper()
    return f"{prefix}{match.group(2).lower()}"


def pci_bus_id(domain: int, bus: int, device: int) -> str:
    # nvmlDeviceGetHandleByPciBusId accepts "%x:%x:%x.%x"; the function is always 0 for a GPU's compute device.
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def cuda_identity(device: str) -> GpuIdentity:
    """The UUID and PCI bus id of a CUDA device, from torch; ``TelemetryUnavailable`` when torch cannot tell."""
    try:
        import torch
    except ImportError as exc:
        raise TelemetryUnavailable(f"torch is not importable ({exc})") from None
    try:
        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
    # torch.cuda raises AssertionError ("Torch not compiled with CUDA enabled") or RuntimeError (no device, bad
    # index, driver trouble) and ValueError for a malformed device string.
    except (AssertionError, RuntimeError, ValueError) as exc:
        raise TelemetryUnavailable(f"cannot query {device} through torch: {exc}") from None
    raw_uuid = getattr(props, "uuid", None)  # torch ≥ 2.1; str() is bare hex
    bus, dom, dev_id = (getattr(props, name, None) for name in ("pci_bus_id", "pci_domain_id", "pci_device_id"))
    pci = pci_bus_id(dom or 0, bus, dev_id) if isinstance(bus, int) and isinstance(dev_id, int) else None
    return GpuIdentity(str(dev), None if raw_uuid is None else nvml_uuid(str(raw_uuid)), pci)
