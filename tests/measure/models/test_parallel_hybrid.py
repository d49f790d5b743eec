"""Hybrid stacks whose members carry their own sizes and options (a published model's mixers), and blocks running
members side by side (``a+b``: Falcon-H1's attention beside its Mamba-2). Every count is the built module's, the
block is its formula written out, the stack decodes to its forward, a stored row reads back, and a config may ask
for one (issue 49)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from attnbench.config import options as config_options
from attnbench.config.experiment import load_experiment_text
from attnbench.core.cases import Case
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import HYBRID, PUBLISHED, cannot_build, family_of, published_layer
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.hybrid.layers import SideBySide
from attnbench.families.hybrid.spec import HybridMember, HybridModel, stack_of
from attnbench.families.registry import build_model, parameter_count, probe
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, prefill, tensor_bytes
from attnbench.results.records import Result

MEMBERS = (
    HybridMember("attention", "vanilla", 2, (("bias", False), ("head_dim", 12), ("heads_kv", 1))),
    HybridMember("ssm", "mamba2", None, (("d_state", 8), ("expand", 1), ("head_dim", 8))),
    HybridMember("gdn", "gated-deltanet", 4, (("head_dim", 8),)),
)
PATTERNS = {
    "side-by-side": HybridModel(("vanilla+mamba2",)),
    "members": HybridModel(("gdn", "attention"), members=MEMBERS),
    "both": HybridModel(("attention+ssm", "gdn"), members=MEMBERS),
}


def stack(name: str, *, mode: str = "forward", layers: int = 2, seq_len: int = 12) -> Case:
    return Case("stack", mode, "float64", "cpu", 2, seq_len, 32, 4, layers, True, (), PATTERNS[name].definition())  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(PATTERNS))
def test_the_counts_are_the_built_modules(name: str) -> None:
    case = stack(name, layers=4)
    assert cannot_build(case) is None and probe(case, "cpu") is None
    model = build_model(case, "cpu", torch.float64)
    assert parameter_count(model) == family_of(case).parameters(case)
    members = HYBRID.members(case)
    assert count_flops(case).flops >= sum(count_flops(m).flops for m in members)


def test_a_member_has_its_own_heads_and_options() -> None:
    attention, ssm = HYBRID.block(stack("both"), 0)
    assert (attention.model, attention.heads, dict(attention.options)["head_dim"]) == ("vanilla", 2, 12)
    assert ssm.heads is None and dict(ssm.options)["expand"] == 1 and "scope" not in dict(ssm.options)  # core
    (gdn,) = HYBRID.block(stack("both"), 1)
    assert gdn.heads == 4 and dict(gdn.options)["scope"] == "block"


def test_a_side_by_side_block_is_its_members_summed_in_one_pre_norm_block() -> None:
    case = stack("side-by-side", layers=1)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float64)
    (block,) = list(model.children())
    mixer = block.attention
    assert isinstance(mixer, SideBySide) and len(mixer.members) == 2
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    h = x + mixer.members[0](block.norm1(x)) + mixer.members[1](block.norm1(x))
    torch.testing.assert_close(model(x), h + block.ffn(block.norm2(h)), rtol=1e-12, atol=1e-12)
    # its FFN is counted once per side-by-side block, on top of the members' own (scope core) counts
    ffn = 2 * 2 * 4 * 32 * 32 * 2 * 12
    assert count_flops(case).flops == sum(count_flops(m).flops for m in HYBRID.members(case)) + ffn


@pytest.mark.parametrize("name", list(PATTERNS))
def test_a_step_after_a_prefill_is_the_whole_sequence(name: str) -> None:
    case = stack(name)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float64).eval()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        whole = model(x)
        for n in (1, 7, 11):
            state = prefill(model, x[:, :n], n + 1)
            step = decodable(model).step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], rtol=1e-9, atol=1e-9)
            assert tensor_bytes(state) == state_bytes(replace(case, mode="decode", seq_len=n))


def test_a_stored_row_of_a_stack_with_members_reads_back() -> None:
    case = stack("both")
    row = Result(case, "unsupported", reason="why")
    back = Result.from_dict(json.loads(json.dumps(row.to_dict())))
    assert back.case == case and stack_of(back.case).members == MEMBERS
    data = row.to_dict()
    data["case"]["hybrid"]["pattern"] = ["attention+nobody"]
    with pytest.raises(Exception, match="pattern"):
        Result.from_dict(data)


def test_a_config_asks_for_a_side_by_side_block_with_a_plus() -> None:
    text = (
        "name: p\nmodels: [{name: falconish, hybrid: [sdpa+mamba2]}]\ngrid: {batch: [1], seq_len: [8]}\n"
        "d_model: 32\nheads: 4\nlayers: 2\ncausal: true\n"
    )
    (case, *_) = load_experiment_text(text, "p.yaml").cases("cpu")
    assert stack_of(case) == HybridModel(("sdpa+mamba2",)) and len(HYBRID.block(case, 0)) == 2
    with pytest.raises(ConfigError) as refused:
        load_experiment_text(text.replace("sdpa+mamba2", "sdpa+mambo2"), "p.yaml")
    assert refused.value.key == "models[0].hybrid[0]"


def test_falcon_h1_at_scope_model_is_its_44_side_by_side_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted torch-free: 44 × (attention + Mamba-2 layers, two LayerNorms and the FFN) + the embedding and the
    final LayerNorm."""
    monkeypatch.setattr(config_options, "host_memory_bytes", lambda: 2**50)  # whatever the test machine has
    preset = PUBLISHED["falcon-h1-7b"]
    text = (
        "name: f\ndevice: cpu\nmodels: [lstm]\ncausal: true\ndtype: [bfloat16]\ngrid: {batch: [1], seq_len: [16]}\n"
        "d_model: 16\npresets: {names: [falcon-h1-7b], scope: model}\n"
    )
    cases = load_experiment_text(text, "f.yaml").cases("cpu")
    (case,) = [c for c in cases if c.definition is not None and c.mode == "forward"]
    layer = sum(count_parameters(published_layer(preset, label, "sdpa")) for label in ("attention", "mamba"))
    d = 3072
    block = layer + 4 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert case.layers == 44 and count_parameters(case) == 44 * block + 130048 * d + 2 * d


def test_a_side_by_side_stack_answers_the_serving_questions_through_its_members() -> None:
    """A chunked prefill, a verify with its rollback and packed lengths, each as the whole-sequence forward."""
    from attnbench.families.attention.layers import own_core
    from attnbench.families.states import packed, rollback, verify

    n = 21
    case = replace(stack("both", layers=4), seq_len=n + 5)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch.float64).eval()
    x = torch.randn(2, n + 5, 32, dtype=torch.float64)
    decoder = decodable(module)
    exact = {"atol": 1e-10, "rtol": 1e-10}
    with torch.inference_mode(), own_core():
        reference = module(x)
        state = decoder.init_state(2, n + 5)
        outputs = [decoder.prefill(x[:, s : min(s + 8, n)], state, output=True) for s in range(0, n, 8)]
        torch.testing.assert_close(torch.cat(outputs, dim=1), reference[:, :n], **exact)
        torch.testing.assert_close(verify(module, x[:, n : n + 4], state), reference[:, n : n + 4], **exact)
        rollback(module, state, 2)
        torch.testing.assert_close(decoder.step(x[:, n + 2 : n + 3], state), reference[:, n + 2 : n + 3], **exact)
        out = packed(module, x[:1, :20], (6, 14))
        torch.testing.assert_close(out[:, 6:], module(x[:1, 6:20]), **exact)
