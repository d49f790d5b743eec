"""``attnbench.measure(...)``: one model timed on one input shape from Python, as a sweep times it.

What a notebook user reaches for (pyperf's ``Runner.bench_func``, ``torch.utils.benchmark.Timer``), built from the
sweep's own parts rather than beside them: the arguments become a one-case config, checked by ``config`` (every
key, option and bound as a config file's) and planned by ``sweeps.runner.plan_sweep`` (the device, the thread
count, the checks against the device), and the case is measured by ``timing.TorchExecutor`` (its warm-up, the
adaptive stopping rule, memory, telemetry), in this process. The row comes back as the frozen ``Result`` a sweep
appends to results.jsonl; nothing is written to disk but the config's own file, for as long as it is read.

A model is a built-in (or installed plugin's) name with ``options``, or a factory: a module-level function that
takes an ``attnbench.plugin.ModelRequest`` and returns a module (``docs/how-to/your-own-model.md``), named in the
row by where it lives (``module:function``) as a config's ``factory:`` entry is.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnbench.core.errors import ConfigError
from attnbench.results.records import Result

SOURCE = "attnbench.measure"
_HINT = "the arguments are a config's keys for one case (docs/how-to/python.md); help(attnbench.measure) lists them"
_DEFAULT_HINT = ConfigError("").hint  # the config file's hint, which names a file this call does not have


def measure(
    model: str | Callable[..., Any],
    *,
    seq_len: int,
    batch: int = 1,
    d_model: int | None = None,
    heads: int | None = None,
    layers: int | None = None,
    causal: bool | None = None,
    mode: str = "forward",
    dtype: str = "float32",
    device: str = "auto",
    options: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
    kind: str | None = None,
    name: str | None = None,
    threads: int | None = None,
    seed: int | None = None,
) -> Result:
    """Time ``model`` on a (``batch``, ``seq_len``, ``d_model``) input in ``mode`` and return the row a sweep of the
    same case would store (``status``, ``median_s``, its samples and statistics, memory, FLOPs, telemetry).

    ``model``: a model's name (``attnbench models`` lists them) with its ``options``, or a factory function (then
    ``kind``, recurrent or attention, says which side it joins, and ``name`` names it in the row: the function's
    name by default). ``d_model``, ``heads``, ``layers``, ``causal``, ``threads`` and ``seed`` left out take a
    config's defaults; ``timing`` holds a config's ``timing:`` keys (the stopping rule: ``target_ci``,
    ``max_case_s``, …). ``device``: auto, cpu, cuda or cuda:N. The case runs in this process; torch's thread count
    is put back afterwards. A bad argument raises ``ConfigError`` whose ``key`` is the argument; a case that fails
    (out of memory, unsupported, an error in the model) is a row with its status and reason, as in a sweep.
    """
    factory = None if isinstance(model, str) else model
    if factory is not None and not callable(factory):
        raise ConfigError(f"must be a model's name or a factory function, got {type(model).__name__}", **_at("model"))
    for argument, value in (("kind", kind), ("name", name)):
        if factory is None and value is not None:
            raise ConfigError(f"applies to a factory; {model!r} is a model's name", **_at(argument))
    label = name if name is not None else (factory.__name__.lower() if factory is not None else str(model))
    config = _config(label, factory, kind, options, seq_len=seq_len, batch=batch, mode=mode, dtype=dtype)
    config |= _given(d_model=d_model, heads=heads, layers=layers, causal=causal, threads=threads, seed=seed)
    config |= {"device": device, "timing": dict(timing or {})}
    # measure times one case in this process: a key that spreads cases over processes or a sweep is refused
    for key, what, hint in (
        ("processes", "measure times in this process", "timing.processes for the spread between processes"),
        ("rounds", "measure times one case", "timing.rounds to spread its cases over the sweep"),
    ):
        if config["timing"].get(key, 1) != 1:
            raise ConfigError(
                f"{what}: timing.{key} must be 1", where=SOURCE, key=f"timing.{key}", hint=f"sweep a config with {hint}"
            )
    return _run(config, label)


def _at(argument: str) -> dict[str, str]:
    return {"where": SOURCE, "key": argument, "hint": _HINT}


def _given(**values: Any) -> dict[str, Any]:
    """The arguments given: the rest are left to the config's defaults."""
    return {key: value for key, value in values.items() if value is not None}


def _config(
    label: str,
    factory: Callable[..., Any] | None,
    kind: str | None,
    options: Mapping[str, Any] | None,
    **case: Any,
) -> dict[str, Any]:
    """The one-case config the arguments say, as a config file would say it."""
    chosen = dict(options or {})
    entry: Any = label
    extra: dict[str, Any] = {}
    if factory is not None:
        entry = {"name": label, "factory": _factory_path(factory), **_given(kind=kind), "options": chosen}
    elif chosen:
        extra["model_options"] = {label: chosen}
    return {
        "name": "measure",
        "models": [entry],
        "modes": [case["mode"]],
        "dtype": [case["dtype"]],
        "grid": {"batch": [case["batch"]], "seq_len": [case["seq_len"]]},
        **extra,
    }


def _factory_path(factory: Callable[..., Any]) -> str:
    """``module:qualified.name`` of a module-level function, checked to lead back to ``factory``: what the row
    records and the sweep's loader imports (a lambda or a function defined inside another has no such name)."""
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    target: Any = sys.modules.get(module or "")
    for part in (qualname or "<>").split("."):
        target = getattr(target, part, None)
    if not module or not qualname or "<" in qualname or target is not factory:
        raise ConfigError(
            f"the factory {qualname or factory!r} cannot be named as module:function",
            where=SOURCE,
            key="model",
            hint="define the factory at the top level of a module (or of the notebook): not a lambda, not inside "
            "another function",
        )
    return f"{module}:{qualname}"


def _run(config: dict[str, Any], label: str) -> Result:
    """Plan the one case as a sweep plans it and measure it with the sweep's executor, in this process."""
    from attnbench.config.experiment import resolved_text
    from attnbench.host.devices import threads_handed_back
    from attnbench.sweeps.runner import SweepRequest, plan_sweep
    from attnbench.timing.torch_executor import TorchExecutor

    with tempfile.TemporaryDirectory(prefix="attnbench-measure-") as folder:
        path = Path(folder) / "measure.yaml"
        path.write_text(resolved_text(config), encoding="utf-8")
        try:
            plan = plan_sweep(SweepRequest(path, None, Path(folder), isolate=False))
        except ConfigError as exc:
            raise _renamed(exc, label) from None
    if len(plan.cases) != 1:
        raise ConfigError(
            f"gives {len(plan.cases)} cases; measure times one (a list of values crosses them)",
            where=SOURCE,
            key="options",
            hint="give each option one value; sweep a config to cross them",
        )
    # As a sweep run in a caller's process: the case's thread count for the case, the caller's own afterwards.
    with threads_handed_back(plan.threads):
        return TorchExecutor(plan.settings).run(plan.cases[0])


def _renamed(exc: ConfigError, label: str) -> ConfigError:
    """The config's error about a key, told about the argument that gave it."""
    return ConfigError(
        exc.problem, where=SOURCE, key=_argument(exc.key, label), hint=_HINT if exc.hint == _DEFAULT_HINT else exc.hint
    )


def _argument(key: str, label: str) -> str:
    """The argument of ``measure`` behind a key path of its config: ``grid.seq_len[0]`` → ``seq_len``,
    ``model_options.<model>.window`` and ``models[0].options.window`` → ``options.window``."""
    key = re.sub(r"\[\d+\]", "", key)
    for prefix in (f"model_options.{label}", "models.options", "grid"):
        if key == prefix or key.startswith(prefix + "."):
            rest = key[len(prefix) + 1 :]
            return rest if prefix == "grid" else "options" + (f".{rest}" if rest else "")
    return {"models": "model", "models.factory": "model", "models.kind": "kind", "models.name": "name"}.get(
        key, {"modes": "mode"}.get(key, key)
    )
