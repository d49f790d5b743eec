"""What the numbers were measured on (the ``Environment`` value), and the keys that must match before two runs
may be compared (pyperf's idea). Torch-free: ``compare`` and ``report`` read it back from run.json; collecting it
from the machine is ``host.inventory``'s job.

Fields added after the first version are optional (``None`` when unknown), so an older run.json reads back:
``cudnn_compile``, the families' process settings (``settings``), ``gpu_l2_bytes`` and the GPU settings NVML reports
(``gpu_power_*``, ``gpu_*_clock_mhz``, ``gpu_persistence_mode``, ``gpu_ecc*``, ``gpu_mig*``, ``gpu_settings_note``).
None of them is in the fingerprint, so runs recorded before them stay comparable with runs recorded after.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from attnbench.results import fields

_COMMIT = re.compile(r"[0-9a-f]{7,64}")
# Keys of a stored environment that are neither fields nor a family's setting: computed, or an older field's name.
_NOT_SETTINGS = frozenset({"fingerprint", "flash_attn", "settings"})

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
    # The kernel packages installed (flash-attn, fla, mamba-ssm: each family names its own), with their versions: a
    # new kernel changes the numbers as a new torch does. Left out of the hash while none is installed, so runs
    # recorded before this key read back with the fingerprint they were stored with.
    "packages",
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
    # The cuDNN torch was built against ("9.13.0"): it, not the runtime's (``cudnn``), decides whether bf16
    # LSTM/GRU may run on cuDNN (9.13 and newer); each recurrent row says which path ran (``rnn_path``).
    cudnn_compile: str | None = None
    gpu_l2_bytes: int | None = None
    # What the GPU was set to (NVML; ``host.sensors.settings``): limits in W, clocks in MHz.
    gpu_power_limit_w: float | None = None  # enforced now: also tells an H200 NVL (600 W) from an SXM (700 W)
    gpu_power_default_limit_w: float | None = None
    gpu_power_max_limit_w: float | None = None
    gpu_max_sm_clock_mhz: int | None = None
    gpu_app_sm_clock_mhz: int | None = None
    gpu_app_mem_clock_mhz: int | None = None
    gpu_persistence_mode: bool | None = None
    gpu_ecc: bool | None = None
    gpu_ecc_pending: bool | None = None  # after the next reboot
    gpu_mig: bool | None = None  # True: the device is a MIG slice, not the whole GPU (no vendor peaks apply)
    gpu_mig_pending: bool | None = None
    gpu_settings_note: str = ""  # the settings that could not be read, and why
    # The variables set for torch's CPU thread pools ("OMP_WAIT_POLICY=ACTIVE", space-separated; empty: none set):
    # oneDNN's RNN syncs its threads every step, so how they wait and bind can change a CPU row's speed (PASSIVE made
    # a two-thread LSTM 8x slower on a 2-vCPU EPYC; results/README.md, issues 30 and 38). Recorded, not part of the
    # fingerprint: a user sets them on purpose.
    thread_env: str = ""
    # The kernel packages the families name that are installed here, distribution → version (``families.catalogue
    # .packages``: flash-attn, flash-linear-attention, mamba-ssm). Replaces the ``flash_attn`` field of earlier
    # run.json files, which read back into it.
    packages: Mapping[str, str] = field(default_factory=dict)
    # What every family's ``prepare_process`` sets in a process that times cases, asked (``families.registry
    # .process_settings``): setting → value, a family's own names (the attention family's SDPA math switch). Stored
    # flat beside the fields above, as run.json always had them; whatever else an environment holds reads back here.
    settings: Mapping[str, bool | str | None] = field(default_factory=dict)

    @property
    def driver_major(self) -> str | None:
        return self.driver.split(".", 1)[0] if self.driver else None

    def fingerprint_fields(self) -> dict[str, Any]:
        data = asdict(self)
        data["driver_major"] = self.driver_major
        return {key: data[key] for key in FINGERPRINT_KEYS}

    def fingerprint(self) -> str:
        hashed = self.fingerprint_fields()
        if not hashed["packages"]:
            del hashed["packages"]  # the hash runs stored before the key had
        blob = json.dumps(hashed, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        settings = data.pop("settings")
        data.update({k: v for k, v in settings.items() if k not in data and k not in _NOT_SETTINGS})
        data["fingerprint"] = self.fingerprint()
        return data

    def resume_fields(self) -> dict[str, Any]:
        """What must match to add rows to an existing run: the fingerprint, and the code doing the measuring."""
        return {
            **self.fingerprint_fields(),
            "attnbench": self.attnbench,
            "git_commit": self.git_commit,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Environment:
        """Raises TypeError when a required field is missing (a damaged run.json)."""
        known = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in known and k != "settings"}
        values["packages"] = packages_of(data)
        values["settings"] = {
            k: v
            for k, v in data.items()
            if k not in known and k not in _NOT_SETTINGS and isinstance(k, str) and isinstance(v, bool | str | None)
        }
        return cls(**values)


def packages_of(environment: Mapping[str, Any]) -> dict[str, str]:
    """A stored environment's kernel packages (distribution → version), text only, sorted; an earlier run.json's
    ``flash_attn`` field read as the flash-attn package."""
    stored = environment.get("packages")
    if isinstance(stored, Mapping):
        return {str(k): v for k, v in sorted(stored.items()) if isinstance(k, str) and isinstance(v, str)}
    legacy = environment.get("flash_attn")
    return {"flash-attn": legacy} if isinstance(legacy, str) and legacy else {}


@dataclass(frozen=True)
class CodeIdentity:
    """The git checkout a sweep was started in — the code being benchmarked — so that ``history`` and ``compare``
    can name what changed between runs. ``dirty``: tracked files differ from the commit (untracked files do not
    count: run folders and scratch files would make every checkout dirty)."""

    commit: str
    dirty: bool
    branch: str | None = None  # None: a detached HEAD, as CI checkouts of a pull request often are

    @property
    def short(self) -> str:
        return self.commit[:10] + ("+dirty" if self.dirty else "")

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "dirty": self.dirty, "branch": self.branch}

    @classmethod
    def from_dict(cls, data: object) -> CodeIdentity:
        d = fields.record(data, "", ("commit", "dirty"), ("branch",))
        commit = fields.text(d["commit"], "commit")
        if not _COMMIT.fullmatch(commit):
            raise fields.expected("commit", "a hex git commit id", commit)
        branch = d.get("branch")
        return cls(
            commit=commit,
            dirty=fields.flag(d["dirty"], "dirty"),
            branch=None if branch is None else fields.text(branch, "branch"),
        )
