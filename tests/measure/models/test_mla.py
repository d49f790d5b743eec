"""Multi-head latent attention: the naive and absorbed forms equal the per-head formula of DeepSeek-V2 §2.1 written
out here (float64, values and gradients, causal or not, with and without a query bottleneck); a decode step (the
absorbed form, as deployed) after a prefill equals the whole sequence; the cache is the latent's, its bytes per token
the formula; the parameter and FLOP formulas are what the built module has and torch's counter sees."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import cannot_build
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.mla.layers import MLA, LatentCache, rms_norm
from attnbench.families.mla.spec import FAMILY
from attnbench.families.registry import build_model, make_decode_inputs, make_input, parameter_count
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, prefill, rollback, tensor_bytes, verify

F64 = torch.float64
EXACT: dict[str, Any] = {"atol": 1e-10, "rtol": 1e-10}
B, D, H, N = 2, 32, 4, 13
DIMS = {"kv_lora_rank": 12, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}  # all different


def rope(x: Tensor, position: int) -> Tensor:
    """Rotate-half RoPE of x (…, d_R) at ``position``, θ_i = 10000^{−2i/d_R}, written out."""
    half = x.shape[-1] // 2
    theta = 10000.0 ** (-torch.arange(half, dtype=F64) * 2 / x.shape[-1])
    cos, sin = torch.cos(position * theta), torch.sin(position * theta)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def reference(layer: MLA, x: Tensor, *, causal: bool) -> Tensor:
    """y_t = W_O [o_{t,h}]_h, o_{t,h} = Σ_s softmax(q_{t,h}·k_{s,h}/√(d_n + d_R)) v_{s,h}, every head and pair by hand
    (DeepSeek-V2 eqs. 9–19), from the layer's weights."""
    d_c, d_n, d_r, d_v = layer.d_c, layer.d_n, layer.d_r, layer.d_v
    w_uk_uv = layer.kv_up.weight.view(layer.heads, d_n + d_v, d_c)
    out = []
    for t in range(x.shape[1]):
        heads = []
        for h in range(layer.heads):
            qt = layer.q_up(rms_norm(layer.q_down(x[:, t]), layer.q_norm)) if layer.d_q else layer.q_proj(x[:, t])
            qt = qt.view(-1, layer.heads, d_n + d_r)[:, h]
            q = torch.cat([qt[:, :d_n], rope(qt[:, d_n:], t)], dim=-1)  # (B, d_n + d_R)
            logits, values = [], []
            for s in range(x.shape[1]):
                if causal and s > t:
                    continue
                latent = layer.kv_down(x[:, s])
                c = rms_norm(latent[:, :d_c], layer.kv_norm)
                k = torch.cat([c @ w_uk_uv[h, :d_n].T, rope(latent[:, d_c:], s)], dim=-1)
                logits.append((q * k).sum(-1) / (d_n + d_r) ** 0.5)
                values.append(c @ w_uk_uv[h, d_n:].T)
            weights = torch.stack(logits, dim=-1).softmax(-1)  # (B, S)
            heads.append((weights[..., None] * torch.stack(values, dim=1)).sum(1))  # (B, d_v)
        out.append(layer.out(torch.cat(heads, dim=-1)))
    return torch.stack(out, dim=1)


def layer(form: str = "deployed", *, q_lora_rank: int = 0, causal: bool = True) -> MLA:
    torch.manual_seed(0)
    made = MLA(D, H, q_lora_rank=q_lora_rank, form=form, causal=causal, max_len=32, dtype=F64, **DIMS)
    with torch.no_grad():  # norms away from 1, so that a missing norm shows
        made.kv_norm.uniform_(0.5, 1.5)
        if q_lora_rank:
            made.q_norm.uniform_(0.5, 1.5)
    return made


def inputs(length: int = N, seed: int = 1) -> Tensor:
    return torch.randn(B, length, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("q_lora_rank", [0, 10])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_both_forms_equal_the_per_head_formula_values_and_gradients(form: str, causal: bool, q_lora_rank: int) -> None:
    made = layer(form, q_lora_rank=q_lora_rank, causal=causal)
    x = inputs().requires_grad_()
    got, want = made(x), reference(made, x, causal=causal)
    torch.testing.assert_close(got, want, **EXACT)
    params = [x, *made.parameters()]
    for g, w in zip(
        torch.autograd.grad(got.square().sum(), params), torch.autograd.grad(want.square().sum(), params), strict=True
    ):
        torch.testing.assert_close(g, w, **EXACT)


@pytest.mark.parametrize("form", ["deployed", "naive", "absorbed"])
def test_a_step_after_a_prefill_is_the_whole_sequence_at_every_position(form: str) -> None:
    made, x = layer(form), inputs()
    with torch.no_grad():
        whole = made(x)
        for n in range(N):
            state = made.init_state(B, N + 1)
            if n:
                torch.testing.assert_close(made.prefill(x[:, :n], state), whole[:, :n], **EXACT)
            step = made.step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], **EXACT)
            assert state.length == n  # the step left the cache at n
        state = made.init_state(B, N)  # a prompt in chunks of 4 (the last of 1)
        outputs = [made.prefill(x[:, a : a + 4], state) for a in range(0, N, 4)]
        torch.testing.assert_close(torch.cat(outputs, dim=1), whole, **EXACT)  # type: ignore[arg-type]


def test_a_verify_rolls_back_to_what_decoding_the_accepted_tokens_leaves() -> None:
    made, x = layer(), inputs()
    with torch.no_grad():
        whole = made(x)
        state = made.init_state(B, N)
        made.prefill(x[:, :8], state)
        torch.testing.assert_close(verify(made, x[:, 8:12], state), whole[:, 8:12], **EXACT)
        rollback(made, state, 2)
        assert state.length == 10
        torch.testing.assert_close(made.step(x[:, 10:11], state), whole[:, 10:11], **EXACT)


# ----------------------------------------------------------------------------------------------- the network
def case(
    mode: Mode = "forward",
    seq_len: int = N,
    *,
    dtype: str = "float32",
    layers: int = 2,
    causal: bool = True,
    **options: Any,
) -> Case:
    return Case("mla", mode, dtype, "cpu", B, seq_len, D, H, layers, causal, tuple(sorted({**DIMS, **options}.items())))


@pytest.mark.parametrize("scope", ["core", "block", "model"])
@pytest.mark.parametrize("form", ["deployed", "naive"])
def test_decoding_equals_the_whole_sequence_forward(scope: str, form: str) -> None:
    c = case("decode", 11, dtype="float64", scope=scope, form=form, **({"vocab": 50} if scope == "model" else {}))
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64).eval()
    context, token = make_decode_inputs(c, "cpu", F64)
    with torch.inference_mode():
        full = net(torch.cat([context, token, token], dim=1))
        state = prefill(net, context, c.span + 1)
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -2], **EXACT)
        state.advance()
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -1], **EXACT)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cache_is_the_latent_and_its_bytes_per_token_are_the_formula(dtype: str) -> None:
    per_token = []
    for n in (1, 5, 40):
        c = case("decode", n, dtype=dtype, scope="block")
        net = build_model(c, "cpu", getattr(torch, dtype))
        context, _ = make_decode_inputs(c, "cpu", getattr(torch, dtype))
        with torch.inference_mode():
            state = prefill(net, context, c.span)
        assert all(isinstance(s, LatentCache) for s in state.layers)
        assert tensor_bytes(state) == state_bytes(c)
        per_token.append(state_bytes(c) / c.span)
    width = DIMS["kv_lora_rank"] + DIMS["qk_rope_head_dim"]  # d_c + d_R, whatever the heads
    assert per_token == [2 * B * width * (2 if dtype == "bfloat16" else 4)] * 3


def test_the_cache_per_token_against_multi_head_attention_by_hand() -> None:
    """DeepSeek-V3's shapes: 512 + 64 = 576 elements per token and layer, against 2 × 128 heads × 128 for MHA."""
    v3 = Case(
        "mla",
        "decode",
        "bfloat16",
        "cpu",
        1,
        1023,
        7168,
        128,
        1,
        True,
        tuple(
            sorted(
                {
                    "kv_lora_rank": 512,
                    "q_lora_rank": 1536,
                    "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64,
                    "v_head_dim": 128,
                }.items()
            )
        ),
    )
    assert state_bytes(v3) == 1024 * 576 * 2


@pytest.mark.parametrize(
    "options", [{}, {"q_lora_rank": 10}, {"scope": "block"}, {"scope": "model", "vocab": 97, "q_lora_rank": 7}]
)
def test_the_parameter_count_is_the_formula(options: dict[str, Any]) -> None:
    c = case(**options)
    assert parameter_count(build_model(c, "cpu", torch.float32)) == count_parameters(c)


def test_defaults_follow_deepseek_v3s_ratios() -> None:
    c = Case("mla", "forward", "float32", "cpu", 1, 8, 64, 4, 1, True)
    net = build_model(c, "cpu", torch.float32)
    made = next(m for m in net.modules() if isinstance(m, MLA))
    assert (made.d_c, made.d_q, made.d_n, made.d_r, made.d_v) == (64, 0, 16, 8, 16)  # 4·d_h, none, d_h, d_h/2, d_h


def padding(c: Case) -> int:
    """The products the SDPA call adds by zero-padding the narrower of its q·k and v widths to the wider: none of the
    model's, so not the formula's."""
    d_c, _, d_n, d_r, d_v = FAMILY.dims(c)
    qk, v = (d_n + d_r, d_v) if FAMILY.form(c) == "naive" else (d_c + d_r, d_c)
    wide = max(qk, v)
    return 2 * c.layers * c.batch * H * FAMILY.pairs(c)[1] * (2 * wide - qk - v)


def counted(c: Case) -> int:
    """torch's count of one call, SDPA on its math backend (the count has no rule for the fused CPU kernel), less the
    padding's products."""
    torch.manual_seed(0)
    net = build_model(c, "cpu", torch.float32)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH):
        return _counted(c, net, counter) - padding(c)


def _counted(c: Case, net: torch.nn.Module, counter: FlopCounterMode) -> int:
    if c.mode == "decode":
        context, token = make_decode_inputs(c, "cpu", torch.float32)
        with torch.inference_mode():
            state = prefill(net.eval(), context, c.span)
            with counter:
                decodable(net).step(token, state)
    else:
        with counter, torch.inference_mode():
            net(make_input(c, "cpu", torch.float32))
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("forward", {"form": "naive"}),
        ("forward", {"form": "absorbed"}),
        ("forward", {"form": "absorbed", "q_lora_rank": 10, "scope": "block"}),
        ("decode", {}),
        ("decode", {"form": "naive"}),
        ("decode", {"scope": "block"}),
    ],
)
def test_the_flop_formula_is_what_the_counter_sees(mode: Mode, options: dict[str, Any]) -> None:
    """Non-causal for whole sequences: SDPA's count is of every pair, which the formula's is then too."""
    c = case(mode, causal=mode == "decode", **options)
    assert counted(c) == count_flops(c).flops


@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_the_train_formula_is_within_its_bound_of_the_counter(form: str) -> None:
    """Matmuls backward twice, the core 5/2 of its forward (attention's convention): torch's count of a train call
    (non-causal, where SDPA's count is every pair's) within 10 % of the formula."""
    c = case("train", 16, causal=False, form=form)
    torch.manual_seed(0)
    net = build_model(c, "cpu", torch.float32)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        net(make_input(c, "cpu", torch.float32).requires_grad_()).sum().backward()
    assert abs((counter.get_total_flops() - 3 * padding(c)) / count_flops(c).flops - 1) <= 0.10


def test_the_formula_ids_and_the_forms_costs() -> None:
    assert count_flops(case()).formula == "mla-naive-v1"
    assert count_flops(case("decode")).formula == "mla-absorbed-decode-v1"
    assert count_flops(case("decode", form="naive", scope="block")).formula == "mla-naive-block-decode-v1"
    # A naive step expands the whole cache through kv_b: grows with n; the absorbed step's up-projections do not.
    naive = [count_flops(case("decode", n, form="naive")).detail["up"] for n in (100, 1000)]
    absorbed = [count_flops(case("decode", n)).detail["up"] for n in (100, 1000)]
    assert naive[1] > 9 * naive[0] and absorbed[0] == absorbed[1]
    assert count_flops(case("train")).flops > 2 * count_flops(case()).flops


def test_cases_that_describe_no_model_say_which_option() -> None:
    odd = cannot_build(Case("mla", "forward", "float32", "cpu", 1, 8, 30, 4, 1, True))
    assert odd is not None and odd.option == "kv_lora_rank"
    rope = cannot_build(case(qk_rope_head_dim=3))
    assert rope is not None and rope.option == "qk_rope_head_dim"


class OpSpy(TorchDispatchMode):
    """Every ATen op a call runs, and the largest tensor any of them returns (elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("form", ["naive", "absorbed"])
@pytest.mark.parametrize("mode", ["forward", "decode"])
def test_attention_runs_in_sdpas_fused_kernel_and_never_holds_the_scores(form: str, mode: Mode) -> None:
    """Key, query and value widths all differ (DeepSeek-V3's 192 and 128 naive, 576 and 512 absorbed): SDPA's fused
    CPU kernel ran, and no op returned a tensor the size of the scores (what the math fallback holds: 34 GB for
    DeepSeek-V3 at n = 8192); an absorbed step none larger than the cache's entries (no per-head copy of them)."""
    n = 200
    c = case(mode, n, layers=1, form=form, causal=True)
    torch.manual_seed(0)
    net = build_model(c, "cpu", torch.float32)
    spy = OpSpy()
    with torch.no_grad():  # inference mode would hide what SDPA dispatches to
        if mode == "decode":
            context, token = make_decode_inputs(c, "cpu", torch.float32)
            state = prefill(net.eval(), context, c.span)
            with spy:
                decodable(net).step(token, state)
            scores = B * (n + 1) * (DIMS["kv_lora_rank"] + DIMS["qk_rope_head_dim"]) + 1 if form == "absorbed" else 0
        else:
            x = make_input(c, "cpu", torch.float32)
            with spy:
                net(x)
            scores = B * H * n * n
    assert "_scaled_dot_product_flash_attention_for_cpu" in spy.ops
    assert "_softmax" not in spy.ops and (not scores or spy.largest < scores)
