"""Positional encodings against their formulas: the sinusoid table, RoPE's rotation and relative-position
property, the learned table's size; and the configs and probes that refuse what cannot be built."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.config.experiment import load_experiment_text
from attnbench.core.cases import Case
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import option_of
from attnbench.families.flops import count_parameters
from attnbench.families.positional import Learned, Rotary, Sinusoidal, rotary_angles, sinusoid_table
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from tests.support import mentions, tiny_case

F64 = torch.float64


def case(model: str = "vanilla", positional: str = "none", **options: object) -> Case:
    chosen = {"positional": positional, **options} if positional != "none" else dict(options)
    return tiny_case(model, mode="train", dtype="float64", seq_len=10, heads=4, **chosen)


# --- sinusoidal -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [8, 7, 64])
def test_sinusoid_table_is_the_formula(d_model: int) -> None:
    table = sinusoid_table(50, d_model)
    for pos in range(50):
        for i in range(d_model):
            angle = pos / 10000 ** ((i - i % 2) / d_model)  # PE(pos, 2i) = sin(pos / 10000^(2i/d)), 2i+1 = cos
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[pos, i].item() == pytest.approx(expected, abs=1e-12), (pos, i)


def test_sinusoidal_adds_the_table_and_owns_no_parameters() -> None:
    module = Sinusoidal(8, 6, device="cpu", dtype=F64)
    x = torch.randn(3, 6, 8, dtype=F64)
    torch.testing.assert_close(module(x) - x, sinusoid_table(6, 8).expand(3, 6, 8))
    assert list(module.parameters()) == []
    longer = torch.zeros(1, 9, 8, dtype=F64)  # longer than built for: a fresh table, not an error
    torch.testing.assert_close(module(longer)[0], sinusoid_table(9, 8))


# --- rotary -----------------------------------------------------------------------------------------------------
def explicit_rotation(x: torch.Tensor, position: int) -> torch.Tensor:
    """R_m x by 2×2 rotation matrices on the pairs (x_i, x_{i+D/2}), angle m·θ_i, θ_i = 10000^(−2i/D)."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for i in range(half):
        angle = position * 10000 ** (-2 * i / x.shape[-1])
        rotation = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=F64)
        out[..., [i, i + half]] = x[..., [i, i + half]] @ rotation.T
    return out


def rotated_at_every_position(module: Rotary, vector: torch.Tensor, length: int) -> torch.Tensor:
    """(length, D): R_t · vector for t = 0 … length−1, through the module's (B, H, T, D) interface."""
    return module(vector.expand(1, 1, length, -1))[0, 0]


def test_rope_is_the_rotation_by_position() -> None:
    module = Rotary(8, 12, device="cpu", dtype=F64)
    q = torch.randn(8, dtype=F64)
    rotated = rotated_at_every_position(module, q, 12)
    for m in range(12):
        torch.testing.assert_close(rotated[m], explicit_rotation(q, m), atol=1e-12, rtol=0)
    torch.testing.assert_close(rotated[0], q)  # R_0 = I
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm().expand(12))  # rotations keep lengths


@pytest.mark.parametrize("head_dim", [2, 8, 64])
@pytest.mark.slow
def test_rope_dot_product_depends_only_on_the_distance(head_dim: int) -> None:
    generator = torch.Generator().manual_seed(head_dim)
    q, k = torch.randn(2, head_dim, generator=generator, dtype=F64)
    length = 40
    module = Rotary(head_dim, length, device="cpu", dtype=F64)
    rq, rk = rotated_at_every_position(module, q, length), rotated_at_every_position(module, k, length)
    dots = rq @ rk.T  # dots[m, n] = ⟨R_m q, R_n k⟩
    for m in range(length):
        for n in range(length):
            shift = min(length - 1 - m, length - 1 - n, 7)
            assert dots[m, n].item() == pytest.approx(dots[m + shift, n + shift].item(), abs=1e-10), (m, n)
            # …and equals ⟨q, R_{n−m} k⟩: a function of n − m alone.
            assert dots[m, n].item() == pytest.approx((q @ explicit_rotation(k, n - m)).item(), abs=1e-10)
    assert not torch.allclose(dots[0, 1], dots[0, 2])  # while the distance itself does matter


def test_rope_needs_an_even_head_dim_and_extends_past_its_table() -> None:
    with pytest.raises(ValueError, match="even"):
        rotary_angles(4, 7)
    module = Rotary(4, 3, device="cpu", dtype=F64)
    x = torch.randn(1, 2, 6, 4, dtype=F64)
    torch.testing.assert_close(module(x), Rotary(4, 6, device="cpu", dtype=F64)(x))


# --- learned ----------------------------------------------------------------------------------------------------
def test_learned_table_is_sized_to_the_case() -> None:
    model = build_model(case("vanilla", "learned"), "cpu", F64)
    tables = [m for m in model.modules() if isinstance(m, Learned)]
    assert len(tables) == 1 and tables[0].weight.shape == (10, 16)  # max_len 0 = the case's seq_len
    explicit = build_model(case("vanilla", "learned", max_len=32), "cpu", F64)
    assert parameter_count(explicit) - parameter_count(build_model(case("vanilla"), "cpu", F64)) == 32 * 16
    with pytest.raises(ValueError, match="cover 10 tokens"):
        model(torch.randn(1, 11, 16, dtype=F64))


def test_learned_table_rows_past_the_input_get_no_gradient() -> None:
    module = Learned(4, 8, device="cpu", dtype=F64)
    module(torch.randn(2, 5, 4, dtype=F64)).sum().backward()
    assert module.weight.grad is not None
    assert module.weight.grad[:5].abs().min() > 0 and not module.weight.grad[5:].any()


# --- in the models ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("positional", ["none", "sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("scope", ["core", "block"])
def test_only_positional_encodings_break_permutation_equivariance(positional: str, scope: str) -> None:
    """Self-attention without positions permutes its output with its input; every encoding breaks that."""
    torch.manual_seed(0)
    model = build_model(case("vanilla", positional, scope=scope), "cpu", F64)
    x = torch.randn(1, 10, 16, dtype=F64)
    order = torch.randperm(10)
    equivariant = torch.allclose(model(x)[:, order], model(x[:, order]), atol=1e-10)
    assert equivariant == (positional == "none")


@pytest.mark.parametrize("model", ["lstm", "mingru"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_recurrent_models_take_input_positions(model: str, positional: str) -> None:
    with_positions, without = case(model, positional), case(model)
    torch.manual_seed(0)
    built = build_model(with_positions, "cpu", F64)
    assert parameter_count(built) == count_parameters(with_positions)
    x = make_input(with_positions, "cpu", F64)
    torch.manual_seed(0)
    plain = build_model(without, "cpu", F64)
    if positional == "sinusoidal":  # same weights, the table added first
        torch.testing.assert_close(built(x), plain(x + sinusoid_table(10, 16)))
    assert built(x).shape == (2, 10, 16)


def test_probe_explains_what_cannot_be_built() -> None:
    reason = probe(case("lstm", "rope"), "cpu")
    assert reason is not None and "rope" in reason and "sinusoidal or learned" in reason
    odd = Case("vanilla", "forward", "float32", "cpu", 1, 8, 12, 4, 1, False, (("positional", "rope"),))
    assert mentions(probe(odd, "cpu") or "", "head_dim", values=(12, 4, 3))  # d_model / heads, odd
    short = case("vanilla", "learned", max_len=4)
    assert mentions(probe(short, "cpu") or "", "max_len", "seq_len", values=(4, 10))

    assert probe(case("vanilla", "rope"), "cpu") is None
    with pytest.raises(ValueError, match="rope"):
        build_model(case("gru", "rope"), "cpu", F64)


# --- config -----------------------------------------------------------------------------------------------------
CONFIG = """\
name: test
models: [lstm, vanilla]
modes: [forward]
grid:
  batch: [2]
  seq_len: [8, 16]
d_model: 24
heads: 4
"""


@pytest.mark.parametrize(
    ("options", "message", "key", "hint"),
    [
        ("lstm: {positional: rope}", "rope rotates attention's queries and keys", "lstm.positional", "sinusoidal"),
        (
            "vanilla: {positional: [none, rope]}\nheads: 8",
            "head_dim = d_model / heads must be even; 24 / 8 = 3",
            "vanilla.positional",
            "even",
        ),
        (
            "vanilla: {positional: learned, max_len: 8}",
            "max_len 8 is below seq_len 16",
            "vanilla.max_len",
            "at least 16",
        ),
        ("vanilla: {max_len: 64}", "max_len has no effect on vanilla", "vanilla.max_len", "positional: learned"),
        (
            "vanilla: {positional: absolute}",
            "positional 'absolute' is not one of: none, sinusoidal, learned, rope",
            "vanilla.positional",
            "",
        ),
    ],
)
def test_config_refuses_positional_mistakes(options: str, message: str, key: str, hint: str) -> None:
    text = CONFIG.replace("heads: 4\n", "") if "heads:" in options else CONFIG
    body, _, extra = options.partition("\n")
    with pytest.raises(ConfigError) as info:
        load_experiment_text(text + (extra + "\n" if extra else "") + f"model_options:\n  {body}\n", "test.yaml")
    assert message in info.value.message
    assert info.value.key == f"model_options.{key}"
    assert hint in info.value.hint


def test_config_crosses_positional_variants() -> None:
    text = CONFIG + "model_options:\n  vanilla: {positional: [none, sinusoidal, learned, rope]}\n"
    cases = load_experiment_text(text, "test.yaml").cases("cpu")
    kinds = [option_of(c, "positional") for c in cases if c.model == "vanilla"]
    assert kinds == ["none", "none", "sinusoidal", "sinusoidal", "learned", "learned", "rope", "rope"]
    assert all("positional" not in c.key for c in cases if option_of(c, "positional") == "none")  # default: no key
