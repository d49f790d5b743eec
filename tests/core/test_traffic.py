"""Compulsory traffic, counted by hand: what a roofline's x axis and a row's GB/s divide by."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.flops import count_parameters
from attnbench.families.state_bytes import state_bytes
from attnbench.families.traffic import bytes_moved
from tests.support import tiny_case


def test_whole_sequence_modes_count_weights_inputs_outputs_and_the_layers_round_trips() -> None:
    case = tiny_case("sdpa-flash", batch=2, seq_len=16, d_model=32, heads=4)
    params = count_parameters(case)
    assert params is not None
    w, x = 4 * params, 2 * 16 * 32 * 4  # float32 weights; input (and output) activations
    # Q, K, V (3·d per token) and the core's output (d) cross memory between the layer's three kernels: 4·x of
    # intermediates, each written and read back (the 8·B·T·d·bytes).
    between = 4 * x
    assert bytes_moved(case, params) == (w + x + x + 2 * between, "bytes-compulsory-v2")
    # backward: weights read and their gradients written; the output's gradient read; the input read, its gradient
    # written; the intermediates the forward saved read back, and their gradients written and read
    backward = 2 * w + x + 2 * x + 3 * between
    assert bytes_moved(replace(case, mode="backward"), params) == (backward, "bytes-compulsory-backward-v2")
    train = w + 2 * x + 2 * between + backward
    assert bytes_moved(replace(case, mode="train"), params) == (train, "bytes-compulsory-train-v2")
    assert train == 3 * w + 3 * x + 2 * x + 5 * between


def test_grouped_query_attention_writes_narrower_keys_and_values() -> None:
    mha = tiny_case("sdpa-flash", batch=2, seq_len=16, d_model=32, heads=4)
    gqa = tiny_case("sdpa-flash", batch=2, seq_len=16, d_model=32, heads=4, heads_kv=1)
    # Q and O are d wide, K and V H_kv·D = 8 each: 2·32 + 2·8 per token
    assert family_of(gqa).intermediate_elements(gqa) == 32 * (2 * 32 + 2 * 8)
    assert family_of(mha).intermediate_elements(mha) == 32 * 4 * 32


def test_a_block_and_a_stack_add_their_norms_ffn_and_the_hand_over_between_layers() -> None:
    block = tiny_case("sdpa", batch=1, seq_len=8, d_model=16, heads=2, layers=3, scope="block", ffn_mult=4)
    # per block and token: Q, K, V, O (4·d), two LayerNorm outputs, h, the FFN's hidden (3·d + 4·d); and 2 blocks
    # hand their output to the next
    assert family_of(block).intermediate_elements(block) == 3 * 8 * (4 * 16 + 7 * 16) + 2 * 8 * 16


@pytest.mark.parametrize(
    ("model", "per_layer"),
    [
        ("lstm", 4 * 16),  # the input side of 4 gates for every token, before the recurrence
        ("gru", 3 * 16),
        ("mingru", 2 * 16),  # the one Linear's 2 gates, which the scan reads
        ("minlstm", 3 * 16),
    ],
)
def test_recurrent_layers_write_the_input_side_of_their_gates(model: str, per_layer: int) -> None:
    case = tiny_case(model, batch=2, seq_len=8, d_model=16, layers=2)
    assert family_of(case).intermediate_elements(case) == 2 * 16 * per_layer + 16 * 16  # + one hand-over


def test_mamba2_writes_in_proj_conv_scan_and_norm_outputs() -> None:
    case = tiny_case("mamba2", batch=1, seq_len=8, d_model=16, d_state=4, head_dim=8, expand=2, groups=1)
    inner, heads = 32, 4
    in_proj = 2 * inner + 2 * 4 + heads
    conv = inner + 2 * 4
    assert family_of(case).intermediate_elements(case) == 8 * (in_proj + conv + 2 * inner)


def test_the_embedding_is_read_at_the_gathered_rows_and_its_gradient_written_whole() -> None:
    vocab, d = 30522, 16
    case = tiny_case("lstm", mode="train", batch=2, seq_len=8, d_model=d, scope="model", vocab=vocab)
    params = count_parameters(case)
    assert params is not None
    table, body = vocab * d, params - vocab * d
    ids, y = 2 * 8 * 8, 2 * 8 * d * 4
    between = 4 * family_of(case).intermediate_elements(case)
    forward = 4 * (body + 16 * d) + ids + y + 2 * between  # 16 tokens: 16 rows of the table
    backward = 4 * body + 4 * params + y + ids + 3 * between  # no dX for ids: the table is not read
    assert bytes_moved(case, params) == (forward + backward, "bytes-compulsory-train-v2")
    # A decode step gathers one row per sequence: the table's other rows are not read (v1 counted all of them).
    step = replace(case, mode="decode", seq_len=99)
    state = state_bytes(step)
    assert state is not None
    moved, formula = bytes_moved(step, params, state) or (0, "")
    assert formula == "bytes-compulsory-decode-v2"
    assert moved == 4 * (body + 2 * d) + 2 * 8 + 2 * d * 4 + 2 * state
    v1 = 4 * params + 2 * 8 + 2 * d * 4 + 2 * state
    assert v1 - moved == 4 * (table - 2 * d)  # what v1 over-counted: all but two rows of the table


def test_a_table_smaller_than_the_tokens_is_read_once() -> None:
    case = tiny_case("sdpa", batch=4, seq_len=64, d_model=16, heads=2, scope="model", vocab=50)
    params = count_parameters(case)
    assert params is not None
    between = 4 * family_of(case).intermediate_elements(case)
    assert bytes_moved(case, params) == (4 * params + 256 * 8 + 256 * 16 * 4 + 2 * between, "bytes-compulsory-v2")


def test_a_decode_step_reads_its_state_and_writes_one_slot_or_the_whole_state() -> None:
    kv = tiny_case("sdpa", mode="decode", batch=2, seq_len=99, d_model=32, heads=4, causal=True)
    params, state = count_parameters(kv), state_bytes(kv)
    assert params is not None and state is not None
    token = 2 * 32 * 4
    slot = state // 100  # n + 1 = 100 positions held: a step writes the new token's K and V
    assert bytes_moved(kv, params, state) == (4 * params + 2 * token + state + slot, "bytes-compulsory-decode-v2")
    rnn = tiny_case("lstm", mode="decode", batch=2, seq_len=99, d_model=32)
    params, state = count_parameters(rnn), state_bytes(rnn)
    assert params is not None and state is not None
    assert bytes_moved(rnn, params, state) == (4 * params + 2 * token + 2 * state, "bytes-compulsory-decode-v2")
    assert bytes_moved(rnn, params, None) is None  # a decode row without its state has no count
    assert bytes_moved(Case("lstm", "forward", "float32", "cpu", 1, 8, 16, None, 1, True), None) is None


def test_a_verify_reads_the_state_of_n_and_writes_k_slots_or_a_fixed_state_once() -> None:
    drafts = (("accept", 2), ("draft", 4))
    for model, grows in (("sdpa", True), ("lstm", False)):
        case = replace(tiny_case(model, batch=2, seq_len=99, d_model=32, heads=4, causal=True), mode="verify")
        case = replace(case, serving=drafts)
        params, at_n = count_parameters(case), state_bytes(replace(case, mode="decode", serving=(), seq_len=98))
        assert params is not None and at_n is not None
        written = 4 * (at_n // 99) if grows else at_n  # four K/V slots of n = 99 held, or the state once
        k_tokens = replace(case, mode="forward", serving=(), seq_len=4)
        between = 4 * family_of(case).intermediate_elements(k_tokens)
        tokens = 2 * 4 * 32 * 4  # B·k tokens of d_model in float32, in and out
        want = 4 * params + 2 * tokens + 2 * between + at_n + written
        assert bytes_moved(case, params) == (want, "bytes-compulsory-verify-v2")


def test_a_user_model_hands_activations_between_the_layers_it_was_asked_for() -> None:
    from attnbench.families.user.spec import UserModel

    user = UserModel("pkg.mod:build", "attention", "config")
    case = Case("mine", "forward", "float32", "cpu", 2, 8, 16, 2, 3, True, definition=user.definition())
    assert family_of(case).intermediate_elements(case) == 2 * 2 * 8 * 16
    assert bytes_moved(case, 100) == (400 + 2 * 2 * 8 * 16 * 4 + 2 * 4 * 2 * 2 * 8 * 16, "bytes-compulsory-v2")
