"""Every key a row's ``extra`` may hold, with its type, unit and meaning: pyperf's METADATA table, for attnbench.

The executor's own keys are declared here; a model family declares the keys only it writes (``Family.extras``:
``rnn_path``, ``sdpa_kernel``, …), and ``declared()`` joins the two. Readers check a declared key's type
(``results.records``); a key no release declares is kept as it was stored, so a newer writer's rows still read.
A test holds every key a sweep writes to a declaration here.
"""

from __future__ import annotations

from attnbench.families.base import ExtraSpec
from attnbench.families.catalogue import FAMILIES

__all__ = ["EXTRAS", "ExtraSpec", "declared", "family_columns"]

EXTRAS: tuple[ExtraSpec, ...] = (
    # Work per call.
    ExtraSpec("flops", int, "flop", "FLOPs one call does, useful work (a causal core credited the pairs it keeps)"),
    ExtraSpec("flops_formula", str, "", "the formula that gave flops (attention-block-v1, …; counted-v1: counted)"),
    ExtraSpec("executed_flops", int, "flop", "FLOPs one call executes (the full n² of a core that masks after)"),
    ExtraSpec(
        "flops_uncounted",
        str,
        "",
        "why a counted model's row stores no FLOPs: ops without a FLOP formula ran in its call (a cuDNN RNN, a "
        "package's kernel), so a count would leave their work out",
    ),
    ExtraSpec(
        "bytes_moved", int, "bytes", "the bytes one call must read and write (compulsory traffic, families.traffic)"
    ),
    ExtraSpec("bytes_formula", str, "", "the count that gave bytes_moved (bytes-compulsory-v2, …)"),
    # How the process and the timing ran.
    ExtraSpec("torch_threads", int, "", "torch's CPU threads while the case ran"),
    ExtraSpec(
        "torch_state_changed",
        str,
        "",
        "process-wide torch settings the case's model changed, 'name before → after' each (threads, default dtype, "
        "backends…); set back before the next case",
    ),
    ExtraSpec("process_warmup_s", float, "s", "the process warm-up that ran just before this case (its first)"),
    ExtraSpec("replicates", int, "", "fresh worker processes the case ran in (timing.processes)"),
    ExtraSpec("rounds", int, "", "the rounds over cases whose blocks the row merges (timing.rounds)"),
    ExtraSpec(
        "budget_decided",
        bool,
        "",
        "another run timed the case ok (sweep --budget-from): it took timing.min_samples even past timing.max_case_s",
    ),
    ExtraSpec("telemetry_from", str, "", "which replicate's (or round's) telemetry the row keeps"),
    ExtraSpec("telemetry_error", str, "", "why the telemetry failed (the timing stands)"),
    ExtraSpec("skipped", bool, "", "an oom row recorded without running: a shorter length already ran out of memory"),
    ExtraSpec("cuda_graph", bool, "", "the timed calls replayed a captured CUDA graph"),
    ExtraSpec(
        "cache",
        str,
        "",
        "the cache state the calls were timed in: cold (the last-level cache flushed before each, untimed) or warm",
    ),
    # torch.compile.
    ExtraSpec("compile_s", float, "s", "torch.compile's first, compiling call (untimed)"),
    ExtraSpec("compile_mode", str, "", "torch.compile's mode"),
    ExtraSpec(
        "peak_mem_from",
        str,
        "",
        "which call a compiled row's peak memory is of: compiled (the timed call) or eager (the eager model, where "
        "CUDA graphs' private pool hides the compiled call's: reduce-overhead and max-autotune on CUDA)",
    ),
    ExtraSpec("compile_graphs", int, "", "graphs dynamo compiled on the first call"),
    ExtraSpec("graph_breaks", int, "", "graph breaks on the first call"),
    ExtraSpec("recompiles", int, "", "graphs compiled during the timing: nonzero means the timing saw a recompilation"),
    ExtraSpec(
        "cudagraph_skips",
        int,
        "",
        "graphs inductor ran without CUDA graphs though the compile mode records them (reduce-overhead, "
        "max-autotune): nonzero means the row is not of the mode it is labelled",
    ),
    # The profiled call (CUDA).
    ExtraSpec("kernels_per_call", int, "", "GPU kernels one call launched (one profiled call)"),
    ExtraSpec("kernel_busy_s", float, "s", "GPU time the kernels of one call kept the device busy"),
    ExtraSpec("launch_bound", bool, "", "the GPU sat idle between kernels most of a call: launch overhead dominates"),
    ExtraSpec("profile_skipped", str, "", "why no call was profiled"),
    ExtraSpec("profile_error", str, "", "why the profiled call failed (the timing stands)"),
    # For external profilers (sweep --profile, --nvtx).
    ExtraSpec("trace", str, "", "the case's Chrome trace, relative to its run folder (traces/…json)"),
    ExtraSpec("trace_skipped", str, "", "why the case has no trace"),
    ExtraSpec("trace_error", str, "", "why writing the trace failed (the timing stands)"),
    ExtraSpec("nvtx", bool, "", "each timed call ran inside an NVTX range named by the case key"),
    ExtraSpec("nvtx_error", str, "", "why no NVTX range could be made (the timing ran without)"),
    # Decode.
    ExtraSpec("state_bytes", int, "bytes", "the KV cache or recurrent state a decode step reads (computed)"),
    ExtraSpec("state_mem_bytes", int, "bytes", "the same, measured (state_mem_method says how)"),
    ExtraSpec("state_mem_method", str, "", "how state_mem_bytes was measured: cuda-allocator, resident-pages"),
    ExtraSpec("prefill_s", float, "s", "the decode set-up's prefill of the context (untimed)"),
    # The serving questions (issue 41).
    ExtraSpec(
        "capacity_batch",
        int,
        "",
        "mode capacity: the largest batch whose decode step fits the memory budget",
        minimum=1,
    ),
    ExtraSpec("bytes_per_sequence", int, "bytes", "mode capacity: the memory one more sequence adds, measured"),
    ExtraSpec(
        "memory_budget_bytes", int, "bytes", "mode capacity: the budget held to (a GPU's default where none given)"
    ),
    ExtraSpec("weight_bytes", int, "bytes", "mode capacity: the model's parameters and buffers, inside the budget"),
    ExtraSpec("capacity_method", str, "", "how the capacity was found: rss-fit (CPU), cuda-oom-search (GPU)"),
    ExtraSpec("capacity_capped", bool, "", "mode capacity: the search stopped at its largest batch; more would fit"),
    ExtraSpec(
        "capacity_capped_by",
        str,
        "",
        "mode capacity: what bounded the batch: memory, kernel-grid (a launch limit), search",
    ),
    ExtraSpec(
        "capacity_excluded_bytes", int, "bytes", "mode capacity: held by the sweep (the cold flush), outside the budget"
    ),
    ExtraSpec(
        "capacity_unsettled",
        str,
        "",
        "mode capacity: why the search did not settle (resident memory too noisy to confirm a batch); capacity_batch "
        "is then the largest batch a try held within the budget, a lower bound",
    ),
    ExtraSpec("prefill_chunks", int, "", "mode prefill: the pieces the prompt was fed in"),
    ExtraSpec("kept_error_max", float, "", "kv_dtype/state_dtype: largest |output − full precision's|, 256 steps"),
    ExtraSpec("kept_error_mean", float, "", "kv_dtype/state_dtype: mean |output − full precision's|, 256 steps"),
    ExtraSpec("verify_s", float, "s", "mode verify: the verify call alone, median"),
    ExtraSpec("rollback_s", float, "s", "mode verify: the rollback alone, median"),
    ExtraSpec("rollback_method", str, "", "mode verify: how the layers roll back: truncate, checkpoint, replay"),
    ExtraSpec("prefix_reused", int, "", "mode prefix: prefix positions each request reused (R ≤ P), not computed"),
    ExtraSpec("prefix_checkpoints", int, "", "mode prefix: recurrent-state checkpoints held, one per checkpoint_every"),
    ExtraSpec("independent_s", float, "s", "mode prefix: the M prompts prefilled independently, one call, median"),
    ExtraSpec(
        "prefix_held_bytes", int, "bytes", "mode prefix: bytes the shared strategy's states and checkpoints hold"
    ),
    ExtraSpec("independent_held_bytes", int, "bytes", "mode prefix: bytes the M independent prefills' states hold"),
    ExtraSpec("prefix_bytes_formula", int, "bytes", "mode prefix: prefix_held_bytes by the family's formula"),
    ExtraSpec("independent_bytes_formula", int, "bytes", "mode prefix: independent_held_bytes by the formula"),
    ExtraSpec("prefix_error", float, "", "mode prefix: largest |first token shared − each request's own prefill|"),
    ExtraSpec("padded_s", float, "s", "packed lengths: the same sequences padded to the longest, one call, median"),
    ExtraSpec("padded_tokens_per_s", float, "", "packed lengths: useful tokens per second of the padded call"),
)


def declared() -> dict[str, ExtraSpec]:
    """Every declared key: the executor's and every family's."""
    found = {spec.name: spec for spec in EXTRAS}
    for family in FAMILIES:
        for spec in family.extras:
            found.setdefault(spec.name, spec)
    return found


def family_columns() -> tuple[tuple[ExtraSpec, bool], ...]:
    """The columns of summary.csv that families declare, after the ones every row has, in family order: each
    family's case columns (``Family.case_columns``: key/value heads, a window), then the extras it marks as columns
    (``ExtraSpec.column``: which RNN path ran, which SDPA kernel dispatch chose). With each, whether its value is the
    case's (True) or read from the row's ``extra`` (False)."""
    found: dict[str, tuple[ExtraSpec, bool]] = {}
    for family in FAMILIES:
        for spec in family.case_columns:
            found.setdefault(spec.name, (spec, True))
    for family in FAMILIES:
        for spec in family.extras:
            if spec.column:
                found.setdefault(spec.name, (spec, False))
    return tuple(found.values())
