"""The torch half of a model family: what ``attnbench.families.<family>.layers`` defines as ``TORCH``.

The torch-free half (``attnbench.families.<family>``) says which names, options and formulas exist; this half
builds the module, says before building why a kernel cannot run here, shrinks a case for the probe, and adds what
the row records of the implementation that ran (its declared extras). The registry finds it by the family's name.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from attnbench.core.cases import DTYPES, Case, OptionValue
from attnbench.families.base import ExtraValue
from attnbench.families.catalogue import family_of

# The probe's input: large enough to take the real kernels' paths, small enough to cost nothing. The probe's model
# keeps the case's widths (the kernels depend on them) but one layer.
PROBE_BATCH, PROBE_SEQ_LEN = 1, 16
# The numerical check's input (``attnbench.timing.reference_check``): two sequences (a kernel that mixes the batch
# shows), 32 tokens unless a family needs more to take its path (a chunked form: several chunks).
CHECK_BATCH, CHECK_SEQ_LEN = 2, 32


_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a catalogue dtype name (``"bfloat16"`` → ``torch.bfloat16``)."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of: {', '.join(DTYPES)}") from None


def make_input(case: Case, device: str, dtype: torch.dtype) -> torch.Tensor:
    """The tensor one call of the case's model takes: activations (B, T, d_model) in the case's dtype, or, where the
    family takes tokens (scope model), int64 token ids (B, T), uniform over the vocabulary (they need, and get, no
    gradient). Packed lengths come end to end in one row: (1, Σ lengths, …)."""
    shape = (1, sum(case.packing)) if case.packing else (case.batch, case.seq_len)  # packed: end to end, one row
    if family_of(case).takes_tokens(case):
        return torch.randint(0, int(family_of(case).option(case, "vocab")), shape, device=device)
    return torch.randn(*shape, case.d_model, device=device, dtype=dtype)


def make_decode_inputs(case: Case, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode case's context (n tokens per sequence, as ``make_input``) and the one new token per sequence."""
    return make_input(case, device, dtype), make_input(replace(case, seq_len=1), device, dtype)


@contextlib.contextmanager
def rng_untouched(device: str) -> Iterator[None]:
    """Building a probe's model draws random weights; leave the caller's generator state as it was."""
    dev = torch.device(device)
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        yield


def with_options(case: Case, values: Mapping[str, OptionValue]) -> Case:
    """``case`` with the options of ``values`` that its model has set to those values (the others left out)."""
    family = family_of(case)
    merged = dict(case.options)
    merged.update({name: value for name, value in values.items() if family.has_option(case, name)})
    return replace(case, options=tuple(sorted(merged.items())))


def with_weights_of(twin: nn.Module, model: nn.Module) -> nn.Module:
    """``twin`` (a reference built in float64) holding ``model``'s parameters and buffers, by name, in float64, and
    in ``model``'s train or eval mode."""
    weights = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    twin.load_state_dict(weights)
    return twin.train(model.training)


class Unsupported(Exception):
    """The model cannot run this case here, said while building it (a user model without the decode protocol):
    the executor records an ``unsupported`` row with this reason."""


@dataclass(frozen=True)
class LaunchLimit:
    """The largest batch a case's kernels can launch whatever the memory (a grid axis's cap), and why."""

    batch: int
    reason: str


class TorchFamily:
    """Defaults for a family with nothing to say beyond building its modules."""

    # Whether what the family builds is known to map (B, T, d_model) to the same shape (False: a user's model, whose
    # first call the executor checks before timing).
    trusted: bool = True

    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        """The model for ``case`` on ``device`` in ``dtype``: (B, T, d_model) -> (B, T, d_model), or token ids
        (B, T) in at scope model. Weights come from torch's global generator."""
        raise NotImplementedError

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why ``case`` cannot run on ``device_type``, found without building anything (a missing package, a kernel
        that does not exist for this dtype), or None."""
        return None

    def probes(self, case: Case) -> bool:
        """Whether a shrunken copy of ``case`` is run first to find a missing kernel (False: the case's own first
        call is its probe, where a copy would cost as much or find nothing)."""
        return True

    def device_note(self, model: str) -> str | None:
        """Why ``model`` is missing on a device its spec leaves out, for the cheap check before any probing."""
        return None

    def probe_seq_len(self, case: Case) -> int:
        """The tokens of the probe's input (16: enough for the real kernels' paths)."""
        return PROBE_SEQ_LEN

    def tiny(self, case: Case) -> Case:
        """``case`` at the probe's size: batch 1, ``probe_seq_len`` tokens, one layer; its widths kept."""
        return replace(case, batch=PROBE_BATCH, seq_len=self.probe_seq_len(case), layers=1)

    def label(self, model: str) -> str:
        """How a probe's reason names the model (a forced SDPA backend by the backend's name)."""
        return model

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        """What the row records of the implementation ``case`` runs on (each key declared by the family's
        ``extras``), found outside any timed region."""
        return {}

    def compiled(self, case: Case) -> bool:
        """Whether the model is compiled by construction, whatever its ``compile`` option (flex)."""
        return False

    def launch_limit(self, case: Case, device_type: str) -> LaunchLimit | None:
        """The largest batch ``case``'s decode step can launch on ``device_type``, memory aside (a kernel that
        puts the batch on a capped grid axis fails past it with a launch error, not an OOM), or None: no such cap.
        A capacity search stops there and records the row as capped by the kernel."""
        return None

    def compile_option(self, case: Case) -> str:
        """The torch.compile mode ``case`` asks for (its ``compile`` option), or ``none``: eager."""
        family = family_of(case)
        return str(family.option(case, "compile")) if family.has_option(case, "compile") else "none"

    # ------------------------------------------------------------------------------------------ the numerical check
    def check_seq_len(self, case: Case) -> int:
        """The tokens the numerical check runs ``case``'s path over (32; a chunked form asks for several chunks)."""
        return CHECK_SEQ_LEN

    def check_case(self, case: Case) -> Case:
        """``case`` at the numerical check's size: the probe's model (one layer, its widths kept), at most
        ``CHECK_BATCH`` sequences of at most ``check_seq_len`` tokens; same kernel, dtype, options and mode."""
        n = min(case.seq_len, self.check_seq_len(case))
        return replace(self.tiny(case), batch=min(case.batch, CHECK_BATCH), seq_len=n)

    def reference_case(self, case: Case) -> Case:
        """The case whose model is the readable form of ``case``'s function, with the same weights: by default the
        case itself, eager (a compiled one's ``compile`` at none). A family with a faster form names its readable
        one (the recurrent form of a chunked or fused kernel, the explicit attention of a fused one)."""
        return with_options(case, {"compile": "none"})

    def reference(self, case: Case, model: nn.Module, device: str) -> nn.Module | None:
        """The float64 model ``case``'s ``model`` is held to: ``reference_case`` built in float64 with ``model``'s
        weights (its parameters and buffers, by name), or None where there is none (a user model without a
        ``reference`` method)."""
        with rng_untouched(device):
            twin = self.build(self.reference_case(case), device, torch.float64)
        return with_weights_of(twin, model)

    # ------------------------------------------------------------------------------------------ process and calls
    def prepare_process(self) -> None:
        """Process-wide settings the family's kernels need, made once in every process that times cases (an
        executor's start), before the first of them."""

    def process_settings(self) -> dict[str, bool | str | None]:
        """What run.json records of the settings ``prepare_process`` makes, asked without making them (each key a
        field of ``results.environment.Environment``)."""
        return {}

    def call_context(self, case: Case, model: nn.Module) -> contextlib.AbstractContextManager[object]:
        """Entered around every call the executor makes of ``model`` (the timed calls, the peak-memory call, the
        profile): what a call needs set once rather than per layer (a forced kernel backend). Nothing by default."""
        return contextlib.nullcontext()

    # ------------------------------------------------------- asked only of an untrusted family (a user's models)
    def check_output(self, case: Case, output: object, expected: tuple[int, ...], device: torch.device) -> None:
        """Raises unless one untimed call's ``output`` is a tensor of shape ``expected``, dtype and device right."""

    def disagrees(self, case: Case, message: str) -> Exception:
        """What a call raises that disagrees with what its own protocol promises (the row's reason)."""
        return ValueError(f"{case.model}: {message}")

    def exited(self, case: Case, exc: SystemExit) -> str | None:
        """The row's reason where the model raised ``SystemExit`` and that ends its row; None: it ends the sweep."""
        return None


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)")


def one_line(text: str, limit: int = 300) -> str:
    """An exception's or warning's text on one line, without torch's "(Triggered internally at …)", at most
    ``limit`` characters."""
    text = " ".join(_TRIGGERED.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def package_problem(what: str, module: str) -> str | None:
    """None if ``module`` imports, else why not: ``{what}: package … is not installed`` or does not import."""
    top = module.split(".")[0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == top:
            return f"{what}: package {top} is not installed"
        return f"{what}: package {top} does not import: {one_line(str(exc))}"
    return None
