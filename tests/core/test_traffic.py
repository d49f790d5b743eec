"""Compulsory traffic, counted by hand: what a roofline's x axis and a row's GB/s divide by."""

from __future__ import annotations

from dataclasses import replace

from attnbench.core.cases import Case
from attnbench.families.flops import count_parameters
from attnbench.families.state_bytes import state_bytes
from attnbench.families.traffic import bytes_moved
from tests.support import tiny_case


def test_whole_sequence_modes_count_weights_inputs_and_outputs() -> None:
    case = tiny_case("sdpa-flash", batch=2, seq_len=16, d_model=32, heads=4)
    params = count_parameters(case)
    assert params is not None
    w, x = 4 * params, 2 * 16 * 32 * 4  # float32 weights; input (and output) activations
    assert bytes_moved(case, params) == (w + x + x, "bytes-compulsory-v1")
    # train: weights read twice and their gradients written; the input read twice, its gradient written; the
    # output written and its gradient read
    assert bytes_moved(replace(case, mode="train"), params) == (3 * w + 3 * x + 2 * x, "bytes-compulsory-train-v1")
    assert bytes_moved(replace(case, mode="backward"), params) == (2 * w + x + 2 * x, "bytes-compulsory-backward-v1")


def test_token_ids_are_int64_and_take_no_gradient() -> None:
    case = tiny_case("lstm", mode="train", batch=2, seq_len=8, d_model=16, scope="model", vocab=50)
    params = count_parameters(case)
    assert params is not None
    ids, y = 2 * 8 * 8, 2 * 8 * 16 * 4
    assert bytes_moved(case, params) == (3 * 4 * params + 2 * ids + 2 * y, "bytes-compulsory-train-v1")


def test_a_decode_step_reads_its_state_and_writes_one_slot_or_the_whole_state() -> None:
    kv = tiny_case("sdpa", mode="decode", batch=2, seq_len=99, d_model=32, heads=4, causal=True)
    params, state = count_parameters(kv), state_bytes(kv)
    assert params is not None and state is not None
    token = 2 * 32 * 4
    slot = state // 100  # n + 1 = 100 positions held: a step writes the new token's K and V
    assert bytes_moved(kv, params, state) == (4 * params + 2 * token + state + slot, "bytes-compulsory-decode-v1")
    rnn = tiny_case("lstm", mode="decode", batch=2, seq_len=99, d_model=32)
    params, state = count_parameters(rnn), state_bytes(rnn)
    assert params is not None and state is not None
    assert bytes_moved(rnn, params, state) == (4 * params + 2 * token + 2 * state, "bytes-compulsory-decode-v1")
    assert bytes_moved(rnn, params, None) is None  # a decode row without its state has no count
    assert bytes_moved(Case("lstm", "forward", "float32", "cpu", 1, 8, 16, None, 1, True), None) is None
