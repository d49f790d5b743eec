"""The numerical check: before a case is timed, is what it runs the right function?

A fused kernel on the user's GPU (flash-attn, fla, mamba_ssm, cuDNN), a compiled graph, a user's model or a precision
setting can return wrong numbers fast, and a benchmark that times it publishes them as ``ok`` (fla issue 640: a
Gated DeltaNet precision bug on one Triton version and GPU). So every case's path — the same family, kernel, dtype,
options, mode and compile mode — runs once on a small input (``TorchFamily.check_case``: one layer, two sequences,
32 tokens or a few chunks) and its output is held to the family's reference (``TorchFamily.reference``: the readable
form in float64 with the same weights; a user model's own ``reference`` method), as flashinfer-bench gives every row
a status and vLLM's ``benchmark_gdn_chunk.py`` an error against float64:

- forward: the output; train and backward: the output and the input's gradient for one fixed output gradient;
- decode: the step's output after a prefill against the reference's whole-sequence output at that position, and the
  state after the step (committed) against the reference's state after the same prefill and step.

The serving questions (capacity, prefill, verify, prefix, packed lengths) are ``skipped`` with the reason. A check that
cannot run (the reference does not fit, the model does not exist at the check's size) is ``skipped`` too, with why:
the row is timed as it would be without the check. The verdict (``results.numerics``) is the row's ``check``; a
``failed`` one makes the row ``incorrect``, never timed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import SERVING_PARAMS, Case
from attnbench.families.catalogue import family_of
from attnbench.families.registry import build_model, call_context, make_input, torch_dtype, torch_family
from attnbench.families.states import Decodable, decodable
from attnbench.families.torch_family import rng_untouched
from attnbench.results.numerics import NumericCheck, bounded, tolerance
from attnbench.timing.compiled import compile_mode, wrap
from attnbench.timing.failures import describe

Pairs = list[tuple[torch.Tensor, torch.Tensor]]  # (what the case's path computed, what the reference did)


def skipped(reason: str) -> NumericCheck:
    return NumericCheck("skipped", reason=reason)


def check_size(case: Case) -> Case:
    """The case the check runs: ``case`` at the family's check size (its key: one check per model, options, dtype
    and mode serves every length at or above the check's)."""
    return torch_family(case).check_case(case)


def run_check(case: Case, device: torch.device, seed: int) -> NumericCheck:
    """Run ``case``'s path once at the check's size and hold it to its family's reference (the module notes)."""
    if case.packing or case.mode in SERVING_PARAMS:
        what = "packed lengths" if case.packing else f"mode {case.mode}"
        return skipped(
            f"{what} is not checked yet: its calls reuse the forward and decode paths that forward and decode cases of "
            "the same model check"
        )
    family = torch_family(case)
    small = family.check_case(case)
    dtype = torch_dtype(case.dtype)
    tol = tolerance(case.dtype)
    try:
        with rng_untouched(str(device)):
            torch.manual_seed(seed)
            model = build_model(small, str(device), dtype)
            reference = family.reference(small, model, str(device))
            if reference is None:
                return NumericCheck(
                    "unchecked",
                    seq_len=small.seq_len,
                    reason=f"{case.model} has no reference method to be held to (attnbench.plugin.Referenced)",
                )
            pairs = _pairs(small, model, reference, device)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # the check is an aid: when it cannot run, the row says why and is timed as before
        return skipped(f"the check could not run at n={small.seq_len}: {describe(exc)}")
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the float64 twin's blocks go back before the case allocates its own
    label = _reference_label(case, small, reference)
    max_abs, rel, problem = errors(pairs)
    if problem is not None:
        return NumericCheck("failed", tol=tol, seq_len=small.seq_len, reference=label, reason=problem)
    if rel <= tol:
        return NumericCheck("passed", bounded(max_abs), bounded(rel), tol, small.seq_len, label)
    reason = f"relative error {rel:.3g} above the {case.dtype} tolerance {tol:g}"
    return NumericCheck("failed", bounded(max_abs), bounded(rel), tol, small.seq_len, label, reason)


def errors(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float, str | None]:
    """(max |fast − reference| over every pair, the largest of each pair's max |fast − reference| ÷ max |reference|,
    None), or (inf, inf, what was wrong) where a pair cannot be compared: a shape off the reference's, or a value
    that is not finite where the reference's are."""
    max_abs = rel = 0.0
    for index, (fast, ref) in enumerate(pairs):
        f, r = fast.detach().to(torch.float64), _aligned(fast, ref.detach().to(torch.float64))
        if f.shape != r.shape:
            return math.inf, math.inf, f"tensor {index}: shape {tuple(f.shape)}, the reference's {tuple(r.shape)}"
        if not bool(torch.isfinite(f).all()) and bool(torch.isfinite(r).all()):
            return math.inf, math.inf, f"tensor {index}: non-finite values where the reference has none"
        if f.numel() == 0:
            continue
        diff = float((f - r).abs().max())
        scale = float(r.abs().max())
        max_abs = max(max_abs, diff)
        rel = max(rel, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return max_abs, rel, None


def _aligned(fast: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``ref`` in ``fast``'s layout: a KV cache kept (batch, positions, heads, head_dim) by one core and (batch,
    heads, positions, head_dim) by the reference's (``families.states.Layout``) holds the same values."""
    if ref.shape != fast.shape and ref.dim() == 4 and ref.transpose(1, 2).shape == fast.shape:
        return ref.transpose(1, 2)
    return ref


def _reference_label(case: Case, small: Case, reference: nn.Module) -> str:
    """What the case was held to, in words: the reference case's model and options where they differ, float64."""
    family = torch_family(case)
    ref_case = family.reference_case(small)
    if not family.trusted:  # a user's model is held to its own reference method
        return "its reference method, float64"
    parts = [] if ref_case.model == small.model else [ref_case.model]
    fam = family_of(small)
    for name, _ in (*small.options, *ref_case.options):
        if fam.has_option(ref_case, name) and family_of(ref_case).option(ref_case, name) != fam.option(small, name):
            parts.append(f"{name}={family_of(ref_case).option(ref_case, name)}")
    return ", ".join(dict.fromkeys([*parts, "float64"]))


def _pairs(small: Case, model: nn.Module, reference: nn.Module, device: torch.device) -> Pairs:
    """Run the case's path and the reference on the same input; the tensors to compare, pairwise."""
    family = torch_family(small)
    mode = compile_mode(family.compile_option(small))
    dtype = torch_dtype(small.dtype)
    ref_context = call_context(family.reference_case(small), reference)
    if small.mode == "decode":
        return _decode_pairs(small, model, reference, ref_context, device, dtype, mode)
    x = make_input(small, str(device), dtype)
    run: Callable[[torch.Tensor], Any] = model if mode is None else wrap(model, mode)
    if small.mode == "forward":
        model.eval()
        reference.eval()
        with torch.inference_mode(), call_context(small, model):
            out = run(x)
        with torch.no_grad(), ref_context:
            expected = reference(_wide(x))
        return [(out, expected)]
    # train and backward: the forward's output, and the input's gradient for one fixed output gradient
    model.train()
    reference.train()
    floating = x.is_floating_point()
    x_fast = x.detach().clone().requires_grad_(floating)
    x_ref = _wide(x).detach().clone().requires_grad_(floating)
    with call_context(small, model):
        out = run(x_fast)
        grad = torch.randn_like(out)
        out.backward(grad)
    with ref_context:
        expected = reference(x_ref)
        expected.backward(_wide(grad))
    pairs: Pairs = [(out, expected)]
    if floating:
        assert x_fast.grad is not None and x_ref.grad is not None
        pairs.append((x_fast.grad, x_ref.grad))
    return pairs


def _decode_pairs(
    small: Case,
    model: nn.Module,
    reference: nn.Module,
    ref_context: contextlib.AbstractContextManager[object],
    device: torch.device,
    dtype: torch.dtype,
    mode: str | None,
) -> Pairs:
    """The step after a prefill of n tokens, and the state after it, against the reference (module notes)."""
    model.eval()
    reference.eval()
    context = make_input(small, str(device), dtype)
    token = make_input(replace(small, seq_len=1), str(device), dtype)
    decoder = decodable(model)
    step = decoder.step if mode is None else wrap(decoder.step, mode)
    with torch.inference_mode(), call_context(small, model):
        state = decoder.init_state(small.batch, small.span)
        decoder.prefill(context, state, output=False)
        out = step(token, state)
        state.advance()
        held = [t.clone() for t in state.tensors()]
    with torch.no_grad(), ref_context:
        whole = reference(_wide(torch.cat([context, token], dim=1)))
        pairs: Pairs = [(out, whole[:, -1:])]
        if isinstance(reference, Decodable):  # a built-in's twin decodes too: its state is the reference state
            ref_state = reference.init_state(small.batch, small.span)
            reference.prefill(_wide(context), ref_state, output=False)
            reference.step(_wide(token), ref_state)
            ref_state.advance()
            pairs += list(zip(held, list(ref_state.tensors()), strict=True))
    return pairs


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the float64 reference takes it (token ids stay ids)."""
    return x.to(torch.float64) if x.is_floating_point() else x
