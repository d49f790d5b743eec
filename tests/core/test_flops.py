"""The analytic FLOP formulas: hand-computed numbers, the causal pair count, and torch's FlopCounterMode.

FlopCounterMode counts matmul-like aten ops only, at 2 FLOPs per multiply-add, with each matmul's backward
2× its forward. What it sees on CPU (torch 2.13), and so what these tests can hold equal:

* vanilla, sdpa-math: the projections as ``addmm`` and the core as two ``bmm`` (the MATH backend decomposes
  into aten ops) — forward matches the formula exactly. A causal mask is applied to the full S×S scores, so
  the counter reports the unmasked 4·B·d·S² core where the formula counts the S(S+1)/2 pairs kept.
* train (vanilla): backward projections match (2×); the core backward is 2 bmm-backwards, i.e. 2× forward,
  where the formula follows FlashAttention's 2.5× (which counts the recomputation of QKᵀ).
* sdpa-flash (and sdpa, which dispatches to it): the CPU flash kernel is one op the counter has no rule for,
  so it counts 0 for the core; only the projections appear.
* lstm: with oneDNN on (the default) the whole LSTM is one ``mkldnn_rnn_layer`` op the counter misses: 0.
  With oneDNN off it decomposes into addmm/bmm and matches the formula exactly.
* gru (no oneDNN path): forward exact. Both recurrent backwards come out a hair under 2× forward: autograd
  skips the gradient for the zero initial state h₀, one step's hidden matmuls per layer and direction.
* mingru, minlstm: their only matmul is the gate Linear (``addmm``); both scans are element-wise. Forward and
  train exact, parallel and sequential alike (no h₀ matmul to skip).
* block and model scope: the FFN's Linears are ``addmm`` like the projections; LayerNorm, GELU, the embedding
  lookup (and its backward) and the positional encodings are not counted, nor are they in the formula.
* decode: one step of the decoder, as the executor times it. vanilla and sdpa-math: the projections of one token
  (``addmm``) and the query against the n + 1 cached keys (two ``bmm``) — exact; lstm/gru: one ``lstm_cell``/
  ``gru_cell`` per layer, decomposed into ``mm``/``addmm`` — exact; mingru/minlstm: the gate Linear — exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode, Options
from attnbench.families.catalogue import family_of, option_of
from attnbench.families.flops import FlopCount, causal_pairs, count_flops, executed_flops, formula_id
from attnbench.families.minrnn.spec import FAMILY as MINRNN
from attnbench.families.recurrent import RecurrentFamily
from attnbench.families.registry import build_model, make_decode_inputs, make_input
from attnbench.families.rnn.spec import FAMILY as RNN
from attnbench.families.state_bytes import state_bytes, state_dtype
from attnbench.families.states import decodable, prefill

BIDIRECTIONAL = (("bidirectional", True),)


def matched_hidden(model: str, d_model: int, directions: int, ffn_mult: int) -> int:
    family = RNN if model in ("lstm", "gru") else MINRNN
    return family.matched_hidden(model, d_model, directions, ffn_mult)


def recurrent_hidden(case: Case) -> int:
    family = family_of(case)
    assert isinstance(family, RecurrentFamily)
    return family.hidden(case)


def attention(
    model: str = "vanilla",
    mode: Mode = "forward",
    *,
    batch: int = 2,
    seq_len: int = 4,
    d_model: int = 8,
    heads: int = 2,
    layers: int = 1,
    causal: bool = False,
    options: Options = (),
) -> Case:
    return Case(model, mode, "float32", "cpu", batch, seq_len, d_model, heads, layers, causal, options)


def recurrent(
    model: str,
    mode: Mode = "forward",
    *,
    batch: int = 2,
    seq_len: int = 3,
    d_model: int = 4,
    layers: int = 1,
    bidirectional: bool = False,
    options: Options = (),
) -> Case:
    options = tuple(sorted((*options, *(BIDIRECTIONAL if bidirectional else ()))))
    return Case(model, mode, "float32", "cpu", batch, seq_len, d_model, None, layers, not bidirectional, options)


BLOCK: Options = (("scope", "block"),)
MODEL: Options = (("scope", "model"), ("vocab", 50))
MATCHED: Options = (("match", "params"), ("scope", "block"))


# --- hand-computed numbers --------------------------------------------------------------------------------------
# attention, B=2 S=4 d=8 H=2: projections 2·2·4·8²·4 = 4096; core 4·2·8·16 = 1024 (causal: 10 pairs → 640)
# lstm, B=2 T=3 d=4: 8·2·3·4·(4+4) = 1536; bidirectional H=2: 2 directions × 8·2·3·2·(4+2) = 1152 per layer
# gru: 6/8 of the lstm numbers: 1152; bidirectional 864 per layer
HAND: list[tuple[Case, int, dict[str, int]]] = [
    (attention(), 5120, {"projections": 4096, "core": 1024}),
    (attention(causal=True), 4736, {"projections": 4096, "core": 640}),
    (
        attention(mode="train"),
        15872,
        {"projections": 4096, "core": 1024, "projections_backward": 8192, "core_backward": 2560},
    ),
    (
        attention(mode="train", layers=2, causal=True),
        29056,
        {"projections": 8192, "core": 1280, "projections_backward": 16384, "core_backward": 3200},
    ),
    (attention("sdpa-flash", heads=4), 5120, {"projections": 4096, "core": 1024}),  # heads do not change H·D
    (recurrent("lstm"), 1536, {"gates": 1536}),
    (recurrent("lstm", "train"), 4608, {"gates": 1536, "gates_backward": 3072}),
    (recurrent("lstm", layers=2, bidirectional=True), 2304, {"gates": 2304}),
    (recurrent("lstm", "train", layers=2, bidirectional=True), 6912, {"gates": 2304, "gates_backward": 4608}),
    (recurrent("gru"), 1152, {"gates": 1152}),
    (recurrent("gru", "train", layers=2), 6912, {"gates": 2304, "gates_backward": 4608}),
    (recurrent("gru", bidirectional=True), 864, {"gates": 864}),
    (recurrent("gru", "train", layers=2, bidirectional=True), 5184, {"gates": 1728, "gates_backward": 3456}),
    # block: + FFN 2·B·S·2·m·d² = 2·2·4·2·4·64 = 8192 per layer; the model scope adds no matmul
    (attention(options=BLOCK), 13312, {"projections": 4096, "core": 1024, "ffn": 8192}),
    (attention(options=MODEL), 13312, {"projections": 4096, "core": 1024, "ffn": 8192}),
    (
        attention(mode="train", options=BLOCK),
        40448,
        {"projections": 4096, "core": 1024, "ffn": 8192}
        | {"projections_backward": 8192, "core_backward": 2560}
        | {"ffn_backward": 16384},
    ),
    (
        attention(layers=2, causal=True, options=(("ffn_mult", 2), ("scope", "block"))),
        17664,
        {"projections": 8192, "core": 1280, "ffn": 8192},
    ),
    # minGRU: 2 gates × 2·B·T·d·H = 2·2·6·4·4 = 384 per layer; minLSTM 3 gates: 576
    (recurrent("mingru"), 384, {"gates": 384}),
    (recurrent("mingru", "train", layers=2), 2304, {"gates": 768, "gates_backward": 1536}),
    (recurrent("minlstm"), 576, {"gates": 576}),
    (recurrent("minlstm", options=(("scan", "sequential"),)), 576, {"gates": 576}),  # the scan is not a matmul
    # decode at n = 4, B=2 d=8 H=2: projections of one token 2·2·1·8²·4 = 1024; core over n + 1 = 5 keys
    # 4·2·8·5 = 320; the block's FFN on one token 2·2·1·2·4·64 = 2048. Recurrent: the forward of T = 1.
    (attention(mode="decode", causal=True), 1344, {"projections": 1024, "core": 320}),
    (
        attention(mode="decode", causal=True, layers=2, options=BLOCK),
        6784,
        {"projections": 2048, "core": 640, "ffn": 4096},
    ),
    (recurrent("lstm", "decode"), 512, {"gates": 512}),
    (recurrent("gru", "decode", layers=2), 768, {"gates": 768}),
    (recurrent("mingru", "decode"), 128, {"gates": 128}),
    # lstm block, hidden = d: as one core layer; layers stack with input d each time (H = d, so the same)
    (recurrent("lstm", layers=2, options=BLOCK), 3072, {"gates": 3072}),
    # lstm block matched at d = 64 (H = 78: 4H² + 328H + 192 = 50112 vs the attention block's 49984):
    # gates 2·4·B·T·78·(64+78) = 177216 at B=1, T=2; projection back to 64: 2·B·T·78·64 = 19968
    (
        recurrent("lstm", batch=1, seq_len=2, d_model=64, options=MATCHED),
        197184,
        {"gates": 177216, "projection": 19968},
    ),
]


@pytest.mark.parametrize(("case", "flops", "detail"), HAND, ids=[case.key for case, _, _ in HAND])
def test_hand_computed(case: Case, flops: int, detail: dict[str, int]) -> None:
    count = count_flops(case)
    assert count.flops == flops
    assert dict(count.detail) == detail
    assert count.flops == sum(count.detail.values())


def test_formula_ids_are_stable() -> None:
    assert count_flops(attention()).formula == "attention-v1"
    assert count_flops(attention(mode="train", causal=True)).formula == "attention-v1"
    assert count_flops(recurrent("lstm", bidirectional=True)).formula == "lstm-v1"
    assert count_flops(recurrent("gru", "train")).formula == "gru-v1"
    assert count_flops(recurrent("mingru")).formula == "mingru-v1"
    assert count_flops(recurrent("minlstm")).formula == "minlstm-v1"
    assert count_flops(attention(options=BLOCK)).formula == "attention-block-v1"
    assert count_flops(attention(options=MODEL)).formula == "transformer-model-v1"
    assert count_flops(recurrent("lstm", options=BLOCK)).formula == "lstm-block-v1"
    assert count_flops(recurrent("lstm", options=(("scope", "model"),))).formula == "lstm-model-v1"
    assert count_flops(recurrent("mingru", options=(("scope", "model"),))).formula == "mingru-model-v1"
    assert count_flops(attention(mode="decode", causal=True)).formula == "attention-decode-v1"
    assert count_flops(attention(mode="decode", causal=True, options=BLOCK)).formula == "attention-block-decode-v1"
    assert count_flops(attention(mode="decode", causal=True, options=MODEL)).formula == "transformer-model-decode-v1"
    assert count_flops(recurrent("lstm", "decode")).formula == "lstm-decode-v1"
    assert count_flops(recurrent("gru", "decode", options=BLOCK)).formula == "gru-block-decode-v1"


def test_a_decode_step_costs_the_same_for_a_recurrence_and_grows_with_n_for_attention() -> None:
    short, long = (attention(mode="decode", causal=True, seq_len=n) for n in (100, 10_000))
    assert count_flops(long).detail["core"] == 4 * 2 * 8 * 10_001  # 4·B·H·(n + 1)·D, H·D = d
    assert count_flops(long).detail["projections"] == count_flops(short).detail["projections"]
    lstm = [count_flops(recurrent("lstm", "decode", seq_len=n)).flops for n in (10, 10_000)]
    assert lstm[0] == lstm[1] == count_flops(recurrent("lstm", seq_len=1)).flops


def test_a_verify_counts_its_k_drafts_after_n() -> None:
    """Attention: the k queries over n + 1…n + k keys and k tokens' projections; a recurrence: k tokens' steps."""
    n, k, drafts = 99, 4, (("accept", 2), ("draft", 4))
    kv = replace(attention("sdpa", causal=True, seq_len=n), mode="verify", serving=drafts)
    k_tokens = replace(kv, mode="forward", serving=(), seq_len=k)
    assert count_flops(kv).detail["core"] == 4 * 2 * 8 * (k * n + k * (k + 1) // 2)  # 4·B·H·D per pair, H·D = d
    assert count_flops(kv).detail["projections"] == count_flops(k_tokens).detail["projections"]
    assert count_flops(kv).formula == formula_id(kv) == "attention-verify-v1"
    rnn = replace(recurrent("lstm", seq_len=n), mode="verify", serving=drafts)
    assert count_flops(rnn).flops == count_flops(replace(rnn, mode="forward", serving=(), seq_len=k)).flops
    assert count_flops(rnn).formula == formula_id(rnn) == "lstm-verify-v1"


def test_matched_hidden_by_hand() -> None:
    # d = 64: 78 is 0.26 % off; the multiples of 8 beside it (72, 80) are 11 % and 4 % off, so 78 it is.
    assert matched_hidden("lstm", 64, 1, 4) == 78
    # d = 768: 934 is closest (0.03 %), but 936 is a multiple of 8 (tensor-core friendly) and 0.29 % off.
    assert matched_hidden("lstm", 768, 1, 4) == 936
    assert matched_hidden("mingru", 768, 1, 4) == 3072
    assert recurrent_hidden(recurrent("lstm", d_model=64, options=MATCHED)) == 78
    assert recurrent_hidden(recurrent("lstm", d_model=64, options=BLOCK)) == 64
    assert recurrent_hidden(recurrent("lstm", d_model=64, bidirectional=True)) == 32
    with pytest.raises(ValueError, match="within 1%"):
        recurrent_hidden(recurrent("lstm", d_model=4, options=MATCHED))


def test_count_is_frozen() -> None:
    count = count_flops(attention())
    with pytest.raises(TypeError):
        count.detail["core"] = 0  # type: ignore[index]
    assert isinstance(count, FlopCount)


def test_train_is_forward_plus_backward() -> None:
    for forward in (attention(causal=True, layers=3), recurrent("lstm", layers=2), recurrent("gru")):
        train = replace(forward, mode="train")
        fwd, both = count_flops(forward), count_flops(train)
        assert {k: v for k, v in both.detail.items() if not k.endswith("_backward")} == dict(fwd.detail)
    assert count_flops(recurrent("lstm", "train")).flops == 3 * count_flops(recurrent("lstm")).flops


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="heads"):
        count_flops(attention(d_model=10, heads=4))
    with pytest.raises(ValueError, match="even d_model"):
        count_flops(recurrent("lstm", d_model=5, bidirectional=True))


# --- causal pairs -----------------------------------------------------------------------------------------------
def brute_pairs(q_len: int, k_len: int) -> int:
    """Count the kept entries of torch's is_causal mask (top-left aligned: tril of a q_len × k_len ones)."""
    return sum(1 for i in range(q_len) for j in range(k_len) if j <= i)


@pytest.mark.parametrize(("q_len", "k_len", "pairs"), [(5, 5, 15), (3, 5, 6), (5, 3, 12), (1, 1, 1), (0, 4, 0)])
def test_causal_pairs_known(q_len: int, k_len: int, pairs: int) -> None:
    assert causal_pairs(q_len, k_len) == pairs == brute_pairs(q_len, k_len)


def test_causal_pairs_brute_force() -> None:
    for q_len in range(12):
        for k_len in range(12):
            assert causal_pairs(q_len, k_len) == brute_pairs(q_len, k_len), (q_len, k_len)
    ones = torch.ones(7, 4, dtype=torch.bool)
    assert causal_pairs(7, 4) == int(ones.tril().sum())  # the mask F.scaled_dot_product_attention builds
    with pytest.raises(ValueError):
        causal_pairs(-1, 3)


# --- against torch.utils.flop_counter.FlopCounterMode ------------------------------------------------------------
class _OpsRun(TorchDispatchMode):
    """Records the name of every aten op dispatched inside it (which kernel really ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def counted(case: Case, ran: set[str] | None = None) -> dict[str, int]:
    """FLOPs FlopCounterMode sees for one call of ``case`` as the executor times it, by aten op name; ``ran``
    collects the name of every aten op the call dispatched."""
    recorder = _OpsRun()
    try:
        with recorder:
            return _counted(case)
    finally:
        if ran is not None:
            ran |= recorder.names


def _counted(case: Case) -> dict[str, int]:
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float32)
    x = make_input(case, "cpu", torch.float32)
    counter = FlopCounterMode(display=False)
    if case.mode == "decode":  # one step, against a state filled outside the count
        context, token = make_decode_inputs(case, "cpu", torch.float32)
        with torch.inference_mode():
            state = prefill(model.eval(), context, case.span)
            with counter:
                decodable(model).step(token, state)
    elif case.mode == "forward":
        model.eval()
        with counter, torch.inference_mode():
            model(x)
    else:
        if x.is_floating_point():  # as the executor: backward computes dX too (token ids take none)
            x.requires_grad_(True)
        grad_out = torch.randn(case.batch, case.seq_len, case.d_model)
        with counter:
            model(x).backward(grad_out)
    by_op = counter.get_flop_counts().get("Global", {})
    return {str(op): int(flops) for op, flops in by_op.items()}


@pytest.fixture
def no_onednn() -> Iterator[None]:
    with warnings.catch_warnings():
        # Toggling the flags also sets oneDNN's TF32 switch, which warns on builds without Intel GPU support.
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def sized(
    model: str, mode: Mode = "forward", *, causal: bool = False, bidirectional: bool = False, options: Options = ()
) -> Case:
    """A case big enough that every part is visible to the counter: B=2, S=8, d=32, H=4, 2 layers."""
    if model in ("lstm", "gru", "mingru", "minlstm"):
        return recurrent(
            model, mode, batch=2, seq_len=8, d_model=32, layers=2, bidirectional=bidirectional, options=options
        )
    return attention(model, mode, batch=2, seq_len=8, d_model=32, heads=4, layers=2, causal=causal, options=options)


@pytest.mark.parametrize("model", ["vanilla", "sdpa-math"])
@pytest.mark.slow
def test_counter_attention_forward_exact(model: str) -> None:
    case = sized(model)
    ops, ours = counted(case), count_flops(case)
    assert ops == {"aten.addmm": ours.detail["projections"], "aten.bmm": ours.detail["core"]}
    assert sum(ops.values()) == ours.flops


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vanilla", "sdpa-math"])
def test_counter_causal_is_not_discounted(model: str) -> None:
    """The mask is applied to full S×S scores, so the counter reports the unmasked core; we count kept pairs."""
    case = sized(model, causal=True)
    full = count_flops(sized(model))
    ops, ours = counted(case), count_flops(case)
    assert ops["aten.addmm"] == ours.detail["projections"]
    assert ops["aten.bmm"] == full.detail["core"] > ours.detail["core"]
    assert ours.detail["core"] * 64 == full.detail["core"] * causal_pairs(8, 8)


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("model", ["vanilla", "sdpa-math"])
def test_executed_flops_count_the_full_scores_a_masking_core_computes(model: str, mode: Mode) -> None:
    """Useful FLOPs credit a causal core the pairs its mask keeps; executed FLOPs are what it ran: the full S×S
    (forward: exactly what the counter sees)."""
    case = sized(model, mode, causal=True)
    assert executed_flops(case) == count_flops(sized(model, mode)).flops > count_flops(case).flops
    if mode == "forward":
        assert executed_flops(case) == sum(counted(case).values())


def test_executed_equals_useful_where_nothing_is_computed_to_be_masked() -> None:
    for case in (
        sized("sdpa-flash", causal=True),  # fused kernels skip masked tiles
        sized("flash-attn", causal=True),
        sized("vanilla"),  # no mask
        sized("lstm", "train"),
    ):
        assert executed_flops(case) == count_flops(case).flops, case.model
    dispatch = sized("sdpa", causal=True)
    assert executed_flops(dispatch, {"sdpa_kernel": "FLASH_ATTENTION"}) == count_flops(dispatch).flops
    assert (
        executed_flops(dispatch, {"sdpa_kernel": "MATH"}) == count_flops(sized("sdpa")).flops
    )  # dispatch fell back to math


def test_counter_vanilla_train() -> None:
    """Projections match forward and backward; the counter's core backward is 2× (bmm rule), ours 2.5×."""
    case = sized("vanilla", "train")
    ops, ours = counted(case), count_flops(case)
    assert ops["aten.addmm"] + ops["aten.mm"] == ours.detail["projections"] + ours.detail["projections_backward"]
    assert ops["aten.bmm"] == 3 * ours.detail["core"]
    assert ours.detail["core_backward"] * 2 == 5 * ours.detail["core"]


@pytest.mark.parametrize("model", ["sdpa-flash", "sdpa"])
@pytest.mark.parametrize("mode", ["forward", "train"])
def test_counter_misses_cpu_flash_core(model: str, mode: Mode) -> None:
    """The CPU flash kernel is one op FlopCounterMode has no formula for: only the projections are counted. The
    test proves the flash kernel ran, and that this torch's counter has no rule for it (when torch learns to count
    it, this test says so and the executor's counted FLOPs for such models change)."""
    case = sized(model, mode)
    ran: set[str] = set()
    ops, ours = counted(case, ran), count_flops(case)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in ran
    from torch.utils.flop_counter import flop_registry

    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in flop_registry
    projections = ours.detail["projections"] + ours.detail.get("projections_backward", 0)
    assert sum(ops.values()) == projections


@pytest.mark.parametrize("bidirectional", [False, True])
def test_counter_lstm_with_onednn_counts_nothing(bidirectional: bool) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    case = sized("lstm", bidirectional=bidirectional)
    ran: set[str] = set()
    ops = counted(case, ran)
    assert "aten.mkldnn_rnn_layer" in ran  # oneDNN's fused layer ran: one op the counter has no rule for
    assert sum(ops.values()) == 0


def h0_correction(case: Case) -> int:
    """FLOPs autograd skips at the first step: no gradient for h₀ = 0, per layer and direction."""
    directions = 2 if option_of(case, "bidirectional") else 1
    hidden = recurrent_hidden(case)
    gates = {"lstm": 4, "gru": 3}[case.model]
    return case.layers * directions * 2 * case.batch * gates * hidden * hidden


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.usefixtures("no_onednn")
def test_counter_recurrent_decomposed(cell: str, bidirectional: bool) -> None:
    forward = sized(cell, bidirectional=bidirectional)
    train = sized(cell, "train", bidirectional=bidirectional)
    assert sum(counted(forward).values()) == count_flops(forward).flops
    # Backward ≈ 2× forward; exactly, short by the skipped dh₀ (a 1/T-sized difference).
    assert sum(counted(train).values()) == count_flops(train).flops - h0_correction(train)


@pytest.mark.parametrize(
    "options", [BLOCK, MODEL, (("positional", "rope"), ("scope", "block"))], ids=["block", "model", "rope"]
)
@pytest.mark.parametrize("model", ["vanilla", "sdpa-math"])
def test_counter_attention_blocks_forward_exact(model: str, options: Options) -> None:
    """The FFN joins the projections as addmm; LayerNorm, GELU, embedding and RoPE are not matmuls."""
    case = sized(model, options=options)
    ops, ours = counted(case), count_flops(case)
    assert ops == {"aten.addmm": ours.detail["projections"] + ours.detail["ffn"], "aten.bmm": ours.detail["core"]}


@pytest.mark.parametrize("options", [BLOCK, MODEL], ids=["block", "model"])
def test_counter_attention_block_train(options: Options) -> None:
    case = sized("vanilla", "train", options=options)
    ops, ours = counted(case), count_flops(case)
    linear = ours.detail["projections"] + ours.detail["ffn"]
    assert ops["aten.addmm"] + ops["aten.mm"] == 3 * linear  # forward + dX + dW
    assert ops["aten.bmm"] == 3 * ours.detail["core"]  # the counter's 2× bmm backward; ours is 2.5×


@pytest.mark.parametrize("scan", ["parallel", "sequential"])
@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("model", ["mingru", "minlstm"])
def test_counter_min_rnn_exact(model: str, mode: Mode, scan: str) -> None:
    options: Options = () if scan == "parallel" else (("scan", scan),)
    for case in (sized(model, mode, options=options), sized(model, mode, options=(*options, ("scope", "block")))):
        assert sum(counted(case).values()) == count_flops(case).flops, case.key


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize(
    "options",
    [BLOCK, MATCHED, (("match", "params"), ("scope", "model"), ("vocab", 50))],
    ids=["block", "matched", "model"],
)
@pytest.mark.slow
@pytest.mark.usefixtures("no_onednn")
def test_counter_recurrent_blocks(cell: str, options: Options) -> None:
    forward, train = sized(cell, options=options), sized(cell, "train", options=options)
    assert sum(counted(forward).values()) == count_flops(forward).flops
    assert sum(counted(train).values()) == count_flops(train).flops - h0_correction(train)


@pytest.mark.parametrize("model", ["vanilla", "sdpa-math", "lstm", "gru", "mingru", "minlstm"])
@pytest.mark.parametrize("options", [(), BLOCK], ids=["core", "block"])
def test_counter_decode_step_exact(model: str, options: Options) -> None:
    case = replace(sized(model, options=options), mode="decode", causal=True)
    ops, ours = counted(case), count_flops(case)
    assert sum(ops.values()) == ours.flops, ops


# --- decode state -----------------------------------------------------------------------------------------------
def test_state_bytes_by_hand() -> None:
    decode = {"mode": "decode", "causal": True}
    # K and V × layers × B × (n + 1) × d × 4 bytes
    assert state_bytes(attention(**decode, layers=3, seq_len=9)) == 2 * 3 * 2 * 10 * 8 * 4  # type: ignore[arg-type]
    assert state_bytes(recurrent("lstm", "decode", layers=2)) == 2 * 2 * 2 * 4 * 4  # h and c
    assert state_bytes(recurrent("gru", "decode", seq_len=10**6)) == 2 * 4 * 4
    bf16 = replace(recurrent("mingru", "decode"), dtype="bfloat16")
    assert state_dtype(bf16) == "float32" and state_bytes(bf16) == 2 * 4 * 4  # the scan's dtype
    assert state_bytes(replace(attention(**decode), dtype="bfloat16")) == 2 * 2 * 5 * 8 * 2  # type: ignore[arg-type]
    assert state_bytes(recurrent("lstm", "decode", d_model=64, options=MATCHED)) == 2 * 2 * 78 * 4
