"""minGRU and minLSTM: the paper's equations, the parallel (log-space) scan equal to the sequential one,
gradients, shapes, causality, parameter counts, and the reduced-precision path."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.cases import Case, Mode
from attnbench.families.flops import count_parameters
from attnbench.families.minrnn.layers import MinRNN, g, log_g, parallel_scan_log, sequential_scan
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from tests.support import tiny_case

F64, F32 = torch.float64, torch.float32
CELLS = ("mingru", "minlstm")


def pair(cell: str, inputs: int, hidden: int, dtype: torch.dtype) -> tuple[MinRNN, MinRNN]:
    """The parallel and the sequential layer on the same weights."""
    torch.manual_seed(0)
    parallel = MinRNN(cell, inputs, hidden, scan="parallel", device="cpu", dtype=dtype)  # type: ignore[arg-type]
    sequential = MinRNN(cell, inputs, hidden, scan="sequential", device="cpu", dtype=dtype)  # type: ignore[arg-type]
    sequential.load_state_dict(parallel.state_dict())
    return parallel, sequential


def output_and_grads(layer: MinRNN, x: torch.Tensor, grad_out: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)
    assert x.grad is not None and layer.gates.weight.grad is not None and layer.gates.bias.grad is not None
    return [out.detach(), x.grad, layer.gates.weight.grad, layer.gates.bias.grad]


def case(model: str, scan: str = "parallel", *, mode: Mode = "train", layers: int = 2, **options: object) -> Case:
    chosen = {"scan": scan, **options} if scan != "parallel" else dict(options)
    return tiny_case(model, mode=mode, dtype="float64", seq_len=9, layers=layers, **chosen)


# --- the equations ----------------------------------------------------------------------------------------------
def paper_min_gru(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Feng et al. 2024, log-space minGRU in plain steps: z = σ(W_z x), h̃ = g(W_h x), h = (1−z)h + z·h̃."""
    k, h_pre = (x @ weight.T + bias).chunk(2, dim=-1)
    h = torch.zeros(x.shape[0], k.shape[-1], dtype=x.dtype)
    out = []
    for t in range(x.shape[1]):
        z = torch.sigmoid(k[:, t])
        h_tilde = torch.where(h_pre[:, t] >= 0, h_pre[:, t] + 0.5, torch.sigmoid(h_pre[:, t]))
        h = (1 - z) * h + z * h_tilde
        out.append(h)
    return torch.stack(out, dim=1)


def paper_min_lstm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """minLSTM: f, i = σ(·), normalised f' = f/(f+i), i' = i/(f+i); h = f'·h + i'·g(W_h x)."""
    f_pre, i_pre, h_pre = (x @ weight.T + bias).chunk(3, dim=-1)
    h = torch.zeros(x.shape[0], f_pre.shape[-1], dtype=x.dtype)
    out = []
    for t in range(x.shape[1]):
        f, i = torch.sigmoid(f_pre[:, t]), torch.sigmoid(i_pre[:, t])
        h_tilde = torch.where(h_pre[:, t] >= 0, h_pre[:, t] + 0.5, torch.sigmoid(h_pre[:, t]))
        h = f / (f + i) * h + i / (f + i) * h_tilde
        out.append(h)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("scan", ["parallel", "sequential"])
@pytest.mark.parametrize("cell", CELLS)
def test_layer_is_the_papers_recurrence(cell: str, scan: str) -> None:
    torch.manual_seed(1)
    layer = MinRNN(cell, 6, 5, scan=scan, device="cpu", dtype=F64)  # type: ignore[arg-type]
    x = torch.randn(3, 11, 6, dtype=F64)
    reference = (paper_min_gru if cell == "mingru" else paper_min_lstm)(x, layer.gates.weight, layer.gates.bias)
    torch.testing.assert_close(layer(x), reference, atol=1e-12, rtol=1e-12)


def test_g_and_log_g() -> None:
    x = torch.cat([torch.linspace(-60, 60, 1001, dtype=F64), torch.tensor([0.0, -1e-9, 1e-9], dtype=F64)])
    torch.testing.assert_close(log_g(x), g(x).log(), atol=1e-12, rtol=1e-12)
    assert g(torch.tensor(0.0)).item() == 0.5 and (g(x) > 0).all()  # continuous at 0, positive everywhere
    assert torch.isfinite(log_g(torch.tensor([-200.0, 200.0], dtype=F64))).all()  # no log(0) where σ underflows


def test_heinsen_scan_is_the_recurrence() -> None:
    generator = torch.Generator().manual_seed(2)
    a = torch.rand(2, 17, 3, generator=generator, dtype=F64) * 0.9 + 0.05
    b = torch.rand(2, 17, 3, generator=generator, dtype=F64) + 0.01
    h = sequential_scan(a, b)
    expected = torch.zeros(2, 3, dtype=F64)
    for t in range(17):
        expected = a[:, t] * expected + b[:, t]
        torch.testing.assert_close(h[:, t], expected)
    torch.testing.assert_close(parallel_scan_log(a.log(), b.log()).exp(), h, atol=1e-12, rtol=1e-12)


# --- the two modes are one function -----------------------------------------------------------------------------
@pytest.mark.parametrize("seq_len", [1, 7, 300])
@pytest.mark.parametrize("cell", CELLS)
def test_parallel_equals_sequential_float64(cell: str, seq_len: int) -> None:
    parallel, sequential = pair(cell, 12, 20, F64)
    generator = torch.Generator().manual_seed(seq_len)
    x = torch.randn(3, seq_len, 12, generator=generator, dtype=F64)
    grad_out = torch.randn(3, seq_len, 20, generator=generator, dtype=F64)
    for got, want in zip(
        output_and_grads(parallel, x, grad_out), output_and_grads(sequential, x, grad_out), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# The log-space scan forms a*_t + log Σ exp(log b − a*), two terms that grow like t·|log a| and cancel, so its
# float32 error grows with the length, where the sequential loop's stays at round-off. Worst over 8 seeds on
# CPU, as a fraction of the tensor's largest entry: output 8e-7 / 2e-5 and gradients 3e-6 / 9e-4 (the gate
# biases, whose gradient sums every step) at 16 / 300 steps. The bounds leave about 3× of that.
FLOAT32 = {16: (3e-6, 1e-5), 300: (1e-4, 3e-3)}


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> None:
    assert (got - want).abs().max() <= tolerance * want.abs().max()


@pytest.mark.parametrize("seq_len", sorted(FLOAT32))
@pytest.mark.parametrize("cell", CELLS)
def test_parallel_equals_sequential_float32(cell: str, seq_len: int) -> None:
    parallel, sequential = pair(cell, 12, 20, F32)
    generator = torch.Generator().manual_seed(seq_len)
    x = torch.randn(3, seq_len, 12, generator=generator)
    grad_out = torch.randn(3, seq_len, 20, generator=generator)
    forward, backward = FLOAT32[seq_len]
    got, want = output_and_grads(parallel, x, grad_out), output_and_grads(sequential, x, grad_out)
    assert_close_to_scale(got[0], want[0], forward)
    for g_got, g_want in zip(got[1:], want[1:], strict=True):
        assert_close_to_scale(g_got, g_want, backward)


@pytest.mark.parametrize("cell", CELLS)
def test_reduced_precision_scans_in_float32(cell: str) -> None:
    """A bfloat16 scan would lose log h entirely by a few hundred steps; ours is off by output rounding only."""
    parallel, _ = pair(cell, 12, 20, torch.bfloat16)
    x = torch.randn(2, 512, 12).to(torch.bfloat16)
    reference = parallel.float()(x.float()).to(torch.bfloat16)
    parallel.bfloat16()
    out = parallel(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cell", CELLS)
def test_long_sequences_stay_finite(cell: str) -> None:
    parallel, _ = pair(cell, 8, 8, F32)
    with torch.inference_mode():
        out = parallel(torch.randn(1, 8192, 8) * 3)
    assert torch.isfinite(out).all() and (out > 0).all()  # h is a convex mix of positive h̃ (and h₀ = 0)


# --- as registry models -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scope", ["core", "block", "model"])
@pytest.mark.parametrize("scan", ["parallel", "sequential"])
@pytest.mark.parametrize("model", CELLS)
def test_shapes_and_gradients(model: str, scan: str, scope: str) -> None:
    this = case(model, scan, scope=scope, **({"vocab": 50} if scope == "model" else {}))
    torch.manual_seed(0)
    module = build_model(this, "cpu", F64)
    x = make_input(this, "cpu", F64)
    assert x.dtype == (torch.int64 if scope == "model" else F64)
    out = module(x)
    assert out.shape == (2, 9, 16) and out.dtype == F64
    out.square().mean().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert probe(this, "cpu") is None


@pytest.mark.parametrize("scope", ["core", "block"])
@pytest.mark.parametrize("model", CELLS)
def test_registry_modes_agree(model: str, scope: str) -> None:
    outs = []
    x = torch.randn(2, 9, 16, dtype=F64)
    for scan in ("parallel", "sequential"):
        torch.manual_seed(0)
        outs.append(build_model(case(model, scan, scope=scope), "cpu", F64)(x))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("model", CELLS)
def test_output_ignores_the_future(model: str) -> None:
    torch.manual_seed(0)
    module = build_model(case(model, layers=2), "cpu", F64)
    x = torch.randn(1, 9, 16, dtype=F64)
    changed = x.clone()
    changed[:, 5:] += 1.0
    torch.testing.assert_close(module(x)[:, :5], module(changed)[:, :5])


@pytest.mark.parametrize(("model", "gates"), [("mingru", 2), ("minlstm", 3)])
def test_parameter_counts(model: str, gates: int) -> None:
    # Core: per layer one Linear(d, gates·d) with bias, and no hidden-to-hidden weights at all.
    core = case(model, layers=3)
    assert parameter_count(build_model(core, "cpu", F64)) == count_parameters(core) == 3 * gates * (16 * 16 + 16)
    matched = case(model, layers=1, scope="block", match="params")
    block = Case("vanilla", "train", "float64", "cpu", 2, 9, 16, 4, 1, False, (("scope", "block"),))
    ours, attention = parameter_count(build_model(matched, "cpu", F64)), parameter_count(build_model(block, "cpu", F64))
    assert ours == count_parameters(matched)
    assert abs(ours - attention) <= 0.01 * attention


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cell", CELLS)
def test_cuda_scan_equals_the_cpu_one(cell: str, dtype: torch.dtype) -> None:
    parallel, sequential = pair(cell, 12, 20, F64)
    x = torch.randn(2, 256, 12, dtype=F64)
    expected = sequential(x)
    for layer in (parallel, sequential):
        got = layer.to("cuda", dtype)(x.to("cuda", dtype)).double().cpu()
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
