"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", arXiv:2006.16236), three ways.

Softmax attention weights value s for query t by exp(q_t·k_s). Linear attention uses a kernel φ(q_t)·φ(k_s)
instead, and associativity turns the causal sum into a recurrence on a D × D state per key/value head
(paper eqs. 16–20):

    S_t = γ S_{t−1} + φ(k_t) v_tᵀ          S_0 = 0
    z_t = γ z_{t−1} + φ(k_t)               z_0 = 0
    y_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + ε)

γ = 1 is the paper. ``decay: retnet`` is RetNet's fixed decay (Sun et al. 2023, arXiv:2307.08621, eq. 1 and §2.2),
γ_j = 1 − 2^(−5−j) for key/value head j, so the state stays per key/value head under GQA. The normaliser decays
with the same γ, so y_t stays a weighted mean of past values. q is not scaled by 1/√D (the paper does not).

The three ``form``s compute the same function (a test holds them equal, values and gradients):

* ``recurrent``: the equations above, one dependent step per token: O(T·D²) work, T steps. The RNN view.
* ``parallel``: Y = (φ(Q)φ(K)ᵀ ⊙ M) V, divided row-wise by (φ(Q)φ(K)ᵀ ⊙ M) 1, M[t, s] = γ^(t−s) for s ≤ t, 0
  above (RetNet eq. 5): O(T²·D) work, no dependent steps, every one of the T² scores computed and then masked.
* ``chunked``: the training form of RetNet (eq. 7), GLA (Yang et al. 2023, arXiv:2312.06635, §2.3) and the fla
  kernels: the parallel form inside chunks of C tokens, the recurrence across chunk boundaries. O(T·C·D + T·D²)
  work, T/C dependent steps.

Grouped-query attention: K and V have H_kv heads; key/value head j serves query heads j·G…j·G+G−1 (G = H / H_kv),
as SDPA's ``enable_gqa``. Queries are handled as (B, H_kv, G, T, D) and keys and values as (B, H_kv, 1, T, D), so
nothing is repeated, and the state is (B, H_kv, D, D): G times smaller than per query head.

float16/bfloat16: φ, the state, the normaliser and the products run in float32 and the output is cast back. z_t
grows like t, and at bfloat16's 8-bit mantissa adding φ(k_t) ≈ 1 to z ≈ 256 rounds to nothing.

Decoding (``attnbench.families.states``): ``LinearState`` holds S and z per layer; a step computes
S_(n+1), z_(n+1) into buffers kept beside them and reads the token's output from those, leaving S_n, z_n as they
were (every timed call is the token after n, as for the other recurrences); ``advance`` copies them in. A prefill
continues from the state it is given (in chunks, with the chunked form whatever ``form`` is: the form is how the
whole sequence is computed, and the state after it is the same).

Adapted from the tested reference in the project's research notes (/work/scratch/linattn).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.cases import Case
from attnbench.families.attention.layers import SelfAttention, attention_network
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import ChunkedFormFamily
from attnbench.families.deltanet.layers import Packing, packing
from attnbench.families.linear.spec import FAMILY
from attnbench.families.states import ConstantState, checkpoint_rollback, checkpoint_verify, spans
from attnbench.families.torch_family import package_problem

Form = Literal["recurrent", "parallel", "chunked"]
Feature = Literal["elu", "relu"]
EPS = 1e-6  # the authors' fast-transformers value


def feature_map(x: Tensor, name: str) -> Tensor:
    """φ(x): ``elu`` is elu(x) + 1 (the paper's §3.2, eq. 7, strictly positive); ``relu`` is max(x, 0)."""
    if name == "elu":
        return F.elu(x) + 1.0
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"unknown feature map {name!r}; one of: elu, relu")


def retnet_decay(kv_heads: int, *, device: torch.device | str | None = None) -> Tensor:
    """RetNet's decay per key/value head, γ = 1 − 2^(−5 − j): 0.96875, 0.984375, … (H_kv,), float64."""
    return 1.0 - torch.pow(2.0, -5.0 - torch.arange(kv_heads, device=device, dtype=torch.float64))


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16 (see the module notes), the dtype itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _powers(log_gamma: Tensor, exponents: Tensor) -> Tensor:
    """γ^e for every head and exponent: (H_kv,) and (L,) -> (H_kv, L)."""
    return torch.exp(log_gamma[:, None] * exponents)


def _decay_matrix(log_gamma: Tensor | None, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """M[t, s] = γ^(t−s) for s ≤ t, 0 above: (T, T) without decay, (H_kv, 1, T, T) with. The exponent is clamped
    at 0 before exp: above the diagonal γ^(−n) overflows for long T, and 0 × inf would be nan."""
    index = torch.arange(size, device=device)
    distance = index[:, None] - index[None, :]
    causal = distance >= 0
    if log_gamma is None:
        return causal.to(dtype)
    powers = torch.exp(log_gamma[:, None, None] * distance.clamp(min=0).to(dtype)) * causal  # (H_kv, T, T)
    return powers[:, None]


# The forms, on grouped tensors q (B, H_kv, G, T, D), k and v (B, H_kv, 1, T, D) in the accumulation dtype, after
# φ. Each returns the numerator (B, H_kv, G, T, D), the denominator (B, H_kv, G, T, 1) and the final S
# (B, H_kv, 1, D, D) and z (B, H_kv, 1, D).
Parts = tuple[Tensor, Tensor, Tensor, Tensor]


def _recurrent(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor | None) -> Parts:
    batch, kv_heads, _, seq_len, d = q.shape
    gamma = None if log_gamma is None else log_gamma.exp()[:, None]  # (H_kv, 1)
    state = q.new_zeros(batch, kv_heads, 1, d, v.shape[-1])
    norm = q.new_zeros(batch, kv_heads, 1, d)
    nums, dens = [], []
    for t in range(seq_len):
        k_t, v_t = k[..., t, :], v[..., t, :]  # (B, H_kv, 1, D)
        if gamma is not None:
            state, norm = gamma[..., None, None] * state, gamma[..., None] * norm
        # Out of place: autograd needs every S_t it has used.
        state = state + k_t[..., :, None] * v_t[..., None, :]  # S_t = γ S_{t−1} + φ(k_t) v_tᵀ
        norm = norm + k_t  # z_t = γ z_{t−1} + φ(k_t)
        q_t = q[..., t, :]  # (B, H_kv, G, D)
        nums.append(q_t @ state[:, :, 0])  # (B, H_kv, G, D)
        dens.append(q_t @ norm[:, :, 0, :, None])  # (B, H_kv, G, 1)
    return torch.stack(nums, dim=3), torch.stack(dens, dim=3), state, norm


def _parallel(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor | None) -> Parts:
    seq_len = q.shape[-2]
    mask = _decay_matrix(log_gamma, seq_len, q.dtype, q.device)
    scores = (q @ k.transpose(-2, -1)) * mask  # (B, H_kv, G, T, T)
    num = scores @ v
    den = scores.sum(dim=-1, keepdim=True)  # Σ_s M[t,s] φ(q_t)·φ(k_s) = φ(q_t)ᵀ z_t
    # S_T = Σ_s γ^(T−1−s) φ(k_s) v_sᵀ in one product: the quadratic form never builds the state otherwise.
    if log_gamma is not None:
        age = torch.arange(seq_len - 1, -1, -1, device=q.device, dtype=q.dtype)
        k = k * _powers(log_gamma, age)[:, None, :, None]
    return num, den, k.transpose(-2, -1) @ v, k.sum(dim=-2)


def _chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_gamma: Tensor | None,
    chunk: int,
    initial: tuple[Tensor, Tensor] | None = None,
) -> Parts:
    """The chunked form, from the state ``initial`` (S, z) or zero."""
    seq_len = q.shape[-2]
    chunks = math.ceil(seq_len / chunk)
    pad = chunks * chunk - seq_len
    # Zero-padded at the front, after φ: zero keys and values add nothing to the state, so every real token keeps
    # its whole past and the final state is exact. (At the back the final state would be decayed by γ^pad.)
    q, k, v = (F.pad(x, (0, 0, pad, 0)).unflatten(-2, (chunks, chunk)) for x in (q, k, v))
    # q (B, H_kv, G, N, C, D), k and v (B, H_kv, 1, N, C, D)
    mask = _decay_matrix(log_gamma, chunk, q.dtype, q.device)
    if log_gamma is not None:
        mask = mask.unsqueeze(-3)  # (H_kv, 1, 1, C, C): broadcast over N
    scores = (q @ k.transpose(-2, -1)) * mask  # (B, H_kv, G, N, C, C)
    num = scores @ v
    den = scores.sum(dim=-1, keepdim=True)
    # What each chunk adds to the state by its end: ΔS_n = Σ_j γ^(C−1−j) φ(k_j) v_jᵀ.
    position = torch.arange(chunk, device=q.device, dtype=q.dtype)
    k_aged = k if log_gamma is None else k * _powers(log_gamma, chunk - 1 - position)[:, None, None, :, None]
    state_step = k_aged.transpose(-2, -1) @ v  # (B, H_kv, 1, N, D, D)
    norm_step = k_aged.sum(dim=-2)  # (B, H_kv, 1, N, D)
    decay = None if log_gamma is None else torch.exp(log_gamma * chunk)[:, None, None, None]  # (H_kv, 1, 1, 1)
    if initial is None:
        state, norm = q.new_zeros(state_step[:, :, :, 0].shape), q.new_zeros(norm_step[:, :, :, 0].shape)
    else:
        state, norm = initial
        if log_gamma is not None and pad:
            # The padding sits between the carried state and the first real token: undo the decay it would add.
            back = torch.exp(-log_gamma * pad)[:, None, None, None]
            state, norm = state * back, norm * back[..., 0]
    starts, norm_starts = [], []
    for n in range(chunks):  # the recurrence again, one step per chunk: S_(n+1) = γ^C S_n + ΔS_n
        starts.append(state)
        norm_starts.append(norm)
        if decay is not None:
            state, norm = decay * state, decay[..., 0] * norm
        state, norm = state + state_step[:, :, :, n], norm + norm_step[:, :, :, n]
    start = torch.stack(starts, dim=3)  # (B, H_kv, 1, N, D, D)
    norm_start = torch.stack(norm_starts, dim=3)[..., None]  # (B, H_kv, 1, N, D, 1)
    # Token i of a chunk reads the state its chunk started from, decayed by γ^(i+1).
    q_aged = q if log_gamma is None else q * _powers(log_gamma, position + 1)[:, None, None, :, None]
    num = num + q_aged @ start
    den = den + q_aged @ norm_start
    return num.flatten(3, 4)[..., pad:, :], den.flatten(3, 4)[..., pad:, :], state, norm


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    form: str = "chunked",
    feature: str = "elu",
    decay: Tensor | None = None,
    chunk: int = 64,
    initial: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """y (B, H, T, D) for q (B, H, T, D), k and v (B, H_kv, T, D); and the final S (B, H_kv, D, D), z (B, H_kv, D)
    in the accumulation dtype. ``decay`` is γ per key/value head (H_kv,); ``initial`` a carried (S, z) (chunked)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads {heads} are not a multiple of key/value heads {kv_heads}")
    acc = accumulation_dtype(q.dtype)
    q_g = feature_map(q.to(acc), feature).unflatten(1, (kv_heads, heads // kv_heads))  # (B, H_kv, G, T, D)
    k_g = feature_map(k.to(acc), feature).unsqueeze(2)  # (B, H_kv, 1, T, D)
    v_g = v.to(acc).unsqueeze(2)
    log_gamma = None if decay is None else decay.to(device=q.device, dtype=acc).log()
    carried = None if initial is None else (initial[0].unsqueeze(2), initial[1].unsqueeze(2))
    if q.shape[2] == 0:  # an empty context: no output, and the state it was given
        batch, _, _, d = q.shape
        s, z = carried or (q_g.new_zeros(batch, kv_heads, 1, d, v.shape[-1]), q_g.new_zeros(batch, kv_heads, 1, d))
        return q.new_zeros(q.shape), s.squeeze(2), z.squeeze(2)
    if form == "recurrent" and carried is None:
        num, den, state, norm = _recurrent(q_g, k_g, v_g, log_gamma)
    elif form == "parallel" and carried is None:
        num, den, state, norm = _parallel(q_g, k_g, v_g, log_gamma)
    elif form in ("chunked", "recurrent", "parallel"):
        num, den, state, norm = _chunked(q_g, k_g, v_g, log_gamma, chunk, carried)
    else:
        raise ValueError(f"unknown form {form!r}; one of: chunked, recurrent, parallel")
    y = num / (den + EPS)  # (B, H_kv, G, T, D)
    return y.flatten(1, 2).to(q.dtype), state.squeeze(2), norm.squeeze(2)


def fla_chunked() -> Any:
    """flash-linear-attention's ``chunk_linear_attn`` (ImportError where the package is missing)."""
    return importlib.import_module("fla.ops.linear_attn").chunk_linear_attn


class LinearCore(nn.Module):
    """The parameter-free core: (B, H, T, D) queries, (B, H_kv, T, D) keys and values in, (B, H, T, D) out.

    ``kernel="fla"`` computes the chunked form with flash-linear-attention's fused Triton kernel
    (``fla.ops.linear_attn.chunk_linear_attn``, Yang et al.): φ is applied here, q is not scaled (``scale=1``, as
    the paper), and its normaliser divides by φ(q)ᵀz_t + 1e-10 (fla's ``normalize_output``) where the torch forms
    add 1e-6 (the authors' fast-transformers value): with φ > 0 and z_t ≥ φ(k_1) both are far below the sum, so
    the two agree to rounding. It takes one head count, so GQA's keys and values are repeated for it; RetNet's decay
    is not a kernel option there and is refused. fla raises a ``DeprecationWarning`` (as an exception) when
    T < H, taking it for a head-first layout: that is an unsupported case, said as such.
    """

    def __init__(self, form: str, feature: str, decay: bool, chunk: int, kernel: str = "torch") -> None:
        super().__init__()
        self.form, self.feature, self.decay, self.chunk, self.kernel = form, feature, decay, chunk, kernel
        self._fla: Any = None
        if kernel == "fla":
            if decay:
                raise NotImplementedError("kernel fla: chunk_linear_attn has no decay; use kernel torch for retnet")
            self._fla = fla_chunked()
            params = inspect.signature(self._fla).parameters
            self._fla_layout = {"head_first": False} if "head_first" in params else {}

    def _fla_forward(self, q: Tensor, k: Tensor, v: Tensor, packed: Packing | None = None) -> Tensor:
        """``packed``: q, k, v (1, H, T, D) hold sequences end to end, each its own (their cu_seqlens)."""
        heads = q.shape[1]
        groups = heads // k.shape[1]
        k, v = (t.repeat_interleave(groups, dim=1) if groups > 1 else t for t in (k, v))
        phi_q, phi_k = feature_map(q, self.feature), feature_map(k, self.feature)
        # The package wants (B, T, H, D).
        try:
            out, _ = self._fla(
                phi_q.transpose(1, 2),
                phi_k.transpose(1, 2),
                v.transpose(1, 2),
                scale=1.0,
                normalize=True,
                **self._fla_layout,
                **({} if packed is None else packed.kernel_arguments(self._fla)),
            )
        except DeprecationWarning as exc:  # fla's guard against a head-first layout: it fires whenever T < H
            raise NotImplementedError(
                f"fla's chunk_linear_attn refuses seq_len {q.shape[-2]} < heads {heads} (it takes that for a "
                f"head-first layout): {exc}"
            ) from exc
        return out.transpose(1, 2)

    def varlen(self, q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int]) -> Tensor:
        """Packed sequences, q (1, H, T, D), k and v (1, H_kv, T, D), each attending to itself alone (the layer's
        ``packed`` calls this): ``kernel: fla`` in one call of fla's kernel with their cu_seqlens, else the core over
        each sequence alone, one after another."""
        if self._fla is not None:
            return self._fla_forward(q, k, v, packing(tuple(lengths), q.device))
        return torch.cat([self(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in spans(lengths)], dim=2)

    def gamma(self, kv_heads: int, device: torch.device) -> Tensor | None:
        return retnet_decay(kv_heads, device=device) if self.decay else None

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self._fla is not None:
            return self._fla_forward(q, k, v)
        y, _, _ = linear_attention(
            q, k, v, form=self.form, feature=self.feature, decay=self.gamma(k.shape[1], q.device), chunk=self.chunk
        )
        return y

    def extra_repr(self) -> str:
        return f"form={self.form}, feature={self.feature}, decay={self.decay}, chunk={self.chunk}, kernel={self.kernel}"


class LinearState(ConstantState):
    """S (B, H_kv, D, D) and z (B, H_kv, D) of one layer after n tokens, in the accumulation dtype, with the buffers
    a step writes S_(n+1), z_(n+1) into (kept beside, not counted: ``tensors`` is the state a decoder carries)."""

    def __init__(self, batch: int, kv_heads: int, head_dim: int, *, device: torch.device, dtype: torch.dtype) -> None:
        acc = accumulation_dtype(dtype)
        self.state = torch.zeros(batch, kv_heads, head_dim, head_dim, device=device, dtype=acc)
        self.norm = torch.zeros(batch, kv_heads, head_dim, device=device, dtype=acc)
        self.next_state = torch.empty_like(self.state)
        self.next_norm = torch.empty_like(self.norm)
        self.stepped = False

    def tensors(self) -> Iterator[Tensor]:
        yield self.state
        yield self.norm

    def advance(self) -> None:
        if not self.stepped:
            raise ValueError("advance() needs a step first")
        self.state.copy_(self.next_state)
        self.norm.copy_(self.next_norm)
        self.stepped = False

    def scratch(self) -> Iterator[Tensor]:
        yield self.next_state
        yield self.next_norm

    def drop_scratch(self) -> None:
        del self.next_state, self.next_norm  # a step after this has nowhere to write: the state is being measured


class LinearAttention(SelfAttention):
    """A linear-attention layer: the same fused projections as ``SelfAttention`` (so the same parameter count for
    the same heads and heads_kv) around a ``LinearCore``, and decoding as a recurrence with a constant-size state
    (a verify checkpoints it per draft token: ``attnbench.families.serving``; packed lengths run the core's
    ``varlen``: fla's kernel in one call with their cu_seqlens, else the core over each sequence alone)."""

    core: LinearCore
    rollback_method = "checkpoint"

    def verify(self, x: Tensor, state: LinearState) -> Tensor:  # type: ignore[override]
        return checkpoint_verify(self, x, state)

    def rollback(self, state: LinearState, accepted: int) -> None:  # type: ignore[override]
        checkpoint_rollback(state, accepted)

    def init_state(self, batch: int, capacity: int) -> LinearState:  # type: ignore[override]
        """S and z at zero; ``capacity`` does not matter: the state has the same size after any number of tokens."""
        weight = self.qkv.weight
        return LinearState(batch, self.heads_kv, self.head_dim, device=weight.device, dtype=weight.dtype)

    def prefill(self, x: Tensor, state: LinearState, *, output: bool = True) -> Tensor | None:  # type: ignore[override]
        """The context from the carried state (chunked form); S and z after its last token."""
        q, k, v = self._heads(x, 0)
        core = self.core
        y, s, z = linear_attention(
            q,
            k,
            v,
            form="chunked",
            feature=core.feature,
            decay=core.gamma(self.heads_kv, x.device),
            chunk=core.chunk,
            initial=(state.state, state.norm),
        )
        state.state.copy_(s)
        state.norm.copy_(z)
        return self._merge(y) if output else None

    def step(self, x: Tensor, state: LinearState) -> Tensor:  # type: ignore[override]
        """(B, 1, d_model) -> (B, 1, d_model): S_(n+1) = γ S_n + φ(k) vᵀ into the step's buffers, y = φ(q)ᵀS_(n+1) /
        (φ(q)ᵀz_(n+1) + ε); S_n and z_n stay as they were."""
        q, k, v = self._heads(x, 0)  # q (B, H, 1, D), k and v (B, H_kv, 1, D)
        acc = state.state.dtype
        core = self.core
        phi_q = feature_map(q.to(acc), core.feature).unflatten(1, (self.heads_kv, -1))  # (B, H_kv, G, 1, D)
        phi_k = feature_map(k.to(acc), core.feature)  # (B, H_kv, 1, D)
        v = v.to(acc)
        gamma = core.gamma(self.heads_kv, x.device)
        if gamma is None:
            state.next_state.copy_(state.state)
            state.next_norm.copy_(state.norm)
        else:
            gamma = gamma.to(acc)
            torch.mul(state.state, gamma[:, None, None], out=state.next_state)
            torch.mul(state.norm, gamma[:, None], out=state.next_norm)
        state.next_state.addcmul_(phi_k.transpose(-2, -1), v)  # + φ(k)ᵀ ⊗ v: (B, H_kv, D, 1) · (B, H_kv, 1, D)
        state.next_norm.add_(phi_k[:, :, 0])
        state.stepped = True
        num = phi_q[..., 0, :] @ state.next_state  # (B, H_kv, G, D)
        den = phi_q[..., 0, :] @ state.next_norm[..., None]  # (B, H_kv, G, 1)
        y = (num / (den + EPS)).flatten(1, 2).unsqueeze(2).to(x.dtype)  # (B, H, 1, D)
        return self._merge(y)


class LinearTorch(ChunkedFormFamily):
    def probe_seq_len(self, case: Case) -> int:
        """fla's kernel refuses T < H: its probe keeps at least as many tokens as heads."""
        length = super().probe_seq_len(case)
        return max(length, case.heads or 0) if FAMILY.option(case, "kernel") == "fla" else length

    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        def core() -> LinearCore:
            return LinearCore(
                str(FAMILY.option(case, "form")),
                str(FAMILY.option(case, "feature")),
                FAMILY.option(case, "decay") == "retnet",
                int(FAMILY.option(case, "chunk")),
                str(FAMILY.option(case, "kernel")),
            )

        return attention_network(case, LinearAttention, core, device, dtype)

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why the fused kernel (``kernel: fla``) cannot run here, found before building."""
        if FAMILY.option(case, "kernel") != "fla":
            return None
        if device_type != "cuda":
            return "linear-attn kernel fla: flash-linear-attention's kernels are Triton, CUDA only"
        if FAMILY.option(case, "decay") != "none":
            return "linear-attn kernel fla: chunk_linear_attn has no decay (use kernel torch for decay retnet)"
        return package_problem("linear-attn kernel fla", "fla.ops.linear_attn")

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        if case.heads is None or FAMILY.kv_heads(case) == case.heads:
            return {}
        # The torch forms keep queries grouped per key/value head (nothing copied); fla's kernel takes one head
        # count, so its keys and values are repeated for it first.
        fla = FAMILY.option(case, "kernel") == "fla" and case.mode != "decode"
        return {"gqa_path": "repeat" if fla else "grouped"}


TORCH = LinearTorch()
