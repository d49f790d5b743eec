"""torch's process-wide settings, kept across a case: what one case's model sets is undone before the next.

A model the user brings runs in the sweep's process (or in an isolated worker that times case after case), and
torch keeps much of what a module may set for the whole process: its CPU threads, the default dtype and device,
whether oneDNN, cuDNN or an SDPA kernel may be used, TF32, deterministic algorithms, grad mode. One module that
calls ``torch.set_num_threads(1)`` would make every later row run on one thread while run.json says otherwise;
``torch.set_default_dtype(torch.float64)`` would turn a later model's rows into errors. ``KeptTorchState`` reads
each setting before the case and puts back any the case changed, and says which, so the row that changed them is
flagged (``extra["torch_state_changed"]``).

Only settings this torch has are read (a getter that is missing, or raises, is skipped), and only those that
changed are set again: a setting nobody touched is never written, so torch's legacy and new TF32 switches, which
it refuses to see mixed, are left as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

_MISSING = object()  # a setting this torch does not have, or cannot read now


@dataclass(frozen=True)
class _Setting:
    name: str
    get: Callable[[], object]
    set: Callable[[Any], None]


def _attribute(owner: object, path: str, name: str) -> _Setting:
    """A flag stored as an attribute (``torch.backends.cudnn.benchmark``), read and written through it."""
    parts = path.split(".")

    def target() -> object:
        place: object = owner
        for part in parts[:-1]:
            place = getattr(place, part)
        return place

    return _Setting(name, lambda: getattr(target(), parts[-1]), lambda value: setattr(target(), parts[-1], value))


def _default_device() -> object:
    # The device set with torch.set_default_device, or None: get_default_device answers "cpu" either way, and
    # setting "cpu" back would install a function mode that slows every later torch call.
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if holder is None:
        return _MISSING
    context = getattr(holder, "device_context", None)
    return None if context is None else str(context.device)


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _set_grad(on: bool) -> None:
    torch.set_grad_enabled(on)  # called, not entered: sets the mode at once


def _sdpa(kind: str) -> _Setting:
    cuda = torch.backends.cuda
    return _Setting(
        f"sdpa.{kind}",
        lambda: getattr(cuda, f"{kind}_sdp_enabled")(),
        lambda on: getattr(cuda, f"enable_{kind}_sdp")(on),
    )


def _settings() -> tuple[_Setting, ...]:
    backends = torch.backends
    settings = [
        _Setting("num_threads", torch.get_num_threads, torch.set_num_threads),
        _Setting("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        _Setting("default_device", _default_device, torch.set_default_device),
        _Setting("grad_enabled", torch.is_grad_enabled, _set_grad),
        _Setting("anomaly_detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        _Setting("deterministic_algorithms", _deterministic, _set_deterministic),
        *(
            _attribute(backends, path, path)
            for path in (
                "mkldnn.enabled",
                "mkldnn.deterministic",
                "cudnn.enabled",
                "cudnn.benchmark",
                "cudnn.benchmark_limit",
                "cudnn.deterministic",
                "cuda.matmul.allow_fp16_reduced_precision_reduction",
                "cuda.matmul.allow_bf16_reduced_precision_reduction",
                "cuda.matmul.allow_fp16_accumulation",
                "opt_einsum.enabled",
            )
        ),
        *(_sdpa(kind) for kind in ("flash", "mem_efficient", "math", "cudnn")),
        _Setting(
            "sdpa.fp16_bf16_reduction_math",
            lambda: backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
            lambda on: backends.cuda.allow_fp16_bf16_reduction_math_sdp(on),
        ),
    ]
    # The legacy matmul precision first: setting it sets TF32 leaves below, which then go back themselves.
    settings.append(
        _Setting("float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision)
    )
    if hasattr(backends, "fp32_precision"):
        # torch ≥ 2.9: TF32 is a tree of switches, each "none" inheriting its parent's; the legacy allow_tf32
        # getters read from it (and raise when its leaves disagree). Parents first, so a child read after its
        # parent went back sees what it inherits.
        tree: tuple[str, ...] = ("", "cuda.matmul.", "cudnn.", "cudnn.conv.", "cudnn.rnn.", "mkldnn.")
        tree += ("mkldnn.matmul.", "mkldnn.conv.", "mkldnn.rnn.")
        settings += [_attribute(backends, f"{node}fp32_precision", f"{node}fp32_precision") for node in tree]
    else:
        settings += [
            _attribute(backends, "cuda.matmul.allow_tf32", "cuda.matmul.allow_tf32"),
            _attribute(backends, "cudnn.allow_tf32", "cudnn.allow_tf32"),
        ]
    return tuple(settings)


def _read(setting: _Setting) -> object:
    try:
        return setting.get()
    except Exception:  # a switch this torch lacks (AttributeError) or cannot answer now (mixed TF32 APIs)
        return _MISSING


class KeptTorchState:
    """A context manager: torch's process-wide settings read on entry and, on exit, each one the block changed
    set back. ``changed`` then says what was changed, ``"name before → after"`` each (and ``not restored`` where
    torch refused to take the old value back); empty when nothing was."""

    def __init__(self) -> None:
        self._settings = _settings()
        self._saved: dict[str, object] = {}
        self.changed: tuple[str, ...] = ()

    def __enter__(self) -> KeptTorchState:
        self._saved = {s.name: _read(s) for s in self._settings}
        self.changed = ()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        # What the block left, all read before any is set back: putting one back can move another (the legacy
        # matmul precision sets TF32 leaves), and the row should name what the block itself changed.
        left = {s.name: _read(s) for s in self._settings}
        changes = {
            name: f"{name} {_show(before)} → {_show(left[name])}"
            for name, before in self._saved.items()
            if before is not _MISSING and left[name] != before
        }
        for setting in self._settings:
            before = self._saved[setting.name]
            if before is _MISSING or _read(setting) == before:  # untouched, or already back
                continue
            try:
                setting.set(before)
            except Exception as error:  # the row says so; the next case still starts from what could be restored
                changes[setting.name] = (
                    changes.get(setting.name, setting.name) + f" (not restored: {type(error).__name__})"
                )
        self.changed = tuple(changes.values())


def _show(value: object) -> str:
    if value is _MISSING:
        return "unreadable"
    if isinstance(value, tuple):
        return "/".join(_show(v) for v in value)
    text = str(value)
    return text.removeprefix("torch.")
