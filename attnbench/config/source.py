"""Reading a config's source: the file or built-in text, YAML parsed safely, the line of every key path,
and ``--set`` overrides.

Stdlib, yaml and ``config.messages`` only. Every yaml or OS exception becomes a ``ConfigError`` here.
The YAML is parsed twice: ``yaml.compose`` for the nodes, whose marks give each key path its line and where
duplicate keys and alias bombs are refused, and ``yaml.safe_load`` for the values.
"""

from __future__ import annotations

import os
import re
import stat
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from attnbench.config.messages import OVERRIDE, Path_, describe, dotted
from attnbench.core.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
# Values in a document, counted with aliases expanded: stops `&a [*a, *a, …]` bombs and cyclic aliases.
MAX_NODES = 100_000
MAX_DEPTH = 32  # a config is four levels deep; a cyclic alias (`&a [*a]`) is infinitely deep

BUILTIN = {"cpu": "default-cpu", "cuda": "default-cuda"}

_OVERRIDE_KEY = re.compile(r"[A-Za-z0-9_-]+")


# ---------------------------------------------------------------------------------------------------- text
def builtin_config_text(device_type: str) -> str:
    """The text of the built-in default config for a device type ("cpu", "cuda"; "cuda:1" counts as cuda)."""
    stem = BUILTIN[_device_type(device_type)]
    return (resources.files("attnbench.config") / "builtin" / f"{stem}.yaml").read_text(encoding="utf-8")


def builtin_source(device_type: str) -> str:
    """How errors name the built-in config for a device type: ``builtin:default-cpu``."""
    return f"builtin:{BUILTIN[_device_type(device_type)]}"


def _device_type(device_type: str) -> str:
    kind = device_type.split(":", 1)[0]
    if kind not in BUILTIN:
        raise ValueError(f"no built-in config for device type {device_type!r}; known: {', '.join(BUILTIN)}")
    return kind


def read_file(path: Path, where: str) -> str:
    """The text of a config file, refusing directories, special files, huge files and non-UTF-8 bytes."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(
                "is a directory, not a YAML file",
                where=where,
                hint="name a file such as configs/default.yaml",
            )
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("is not a regular file", where=where)
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(
                f"is {info.st_size} bytes; configs over {MAX_FILE_BYTES} bytes are refused",
                where=where,
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            "no such file",
            where=where,
            hint="check the path; configs/ holds examples",
        ) from None
    except PermissionError:
        raise ConfigError("cannot be read: permission denied", where=where) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", where=where) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            where=where,
            hint="save the file as UTF-8",
        ) from None


# ---------------------------------------------------------------------------------------------------- yaml
def parse_yaml(text: str, source: str) -> tuple[Any, dict[Path_, int]]:
    """Parse with ``yaml.safe_load``; also index the line of every key path from the composed nodes."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines = _line_index(node, source) if node is not None else {}
        return yaml.safe_load(text), lines
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source, with_line=True) from None
    except (ValueError, TypeError, AttributeError) as exc:  # !!int abc, !!timestamp xyz: raised raw by PyYAML
        raise ConfigError(f"invalid YAML value: {exc}", where=source) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", where=source) from None


def _yaml_error(exc: yaml.YAMLError, where: str, *, with_line: bool, key: str = "") -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if with_line and mark is not None:
            where = f"{where}:{mark.line + 1}"
        problem = exc.problem or ""
        unknown_tag = "could not determine a constructor" in problem
        if isinstance(exc, yaml.constructor.ConstructorError) and unknown_tag:
            tag = problem.rsplit(" ", 1)[-1]
            return ConfigError(
                f"YAML tag {tag} is not allowed: tags that construct objects are not allowed",
                where=where,
                key=key,
                hint="write plain mappings, lists, strings, numbers and booleans",
            )
        context = f" ({exc.context})" if exc.context else ""
        return ConfigError(f"invalid YAML: {problem}{context}", where=where, key=key)
    return ConfigError(f"invalid YAML: {str(exc).splitlines()[0]}", where=where, key=key)


def _line_index(root: yaml.Node, source: str) -> dict[Path_, int]:
    """Line (1-based) of every key and list item; refuses duplicate keys and alias bombs on the way."""
    lines: dict[Path_, int] = {}
    stack: list[tuple[Path_, yaml.Node]] = [((), root)]
    visited = 0
    while stack:
        path, node = stack.pop()
        visited += 1
        if len(path) > MAX_DEPTH:
            raise ConfigError(
                f"the document nests deeper than {MAX_DEPTH} levels",
                where=source,
                key=dotted(path[:3]) + "…",
                hint="is an alias (*a) inside its own anchor (&a)?",
            )
        if visited > MAX_NODES:
            raise ConfigError(
                f"the document holds more than {MAX_NODES} values (counting aliases expanded)",
                where=source,
                hint="anchors and aliases (&a, *a) may not nest into a bomb",
            )
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: the constructor or the schema refuses it
                child = (*path, str(key_node.value))
                line = key_node.start_mark.line + 1
                if child in lines:
                    raise ConfigError(
                        f"key {key_node.value!r} appears twice (lines {lines[child]} and {line})",
                        where=f"{source}:{line}",
                        key=dotted(child),
                        hint="YAML would silently keep the last one; delete one of them",
                    )
                lines[child] = line
                stack.append((child, value_node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                stack.append(((*path, i), item))
    return lines


# ---------------------------------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[list[str], Any]:
    """``"grid.seq_len=[64,128]"`` → ``(["grid", "seq_len"], [64, 128])``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(
            f"expected key.path=value, got {text!r}",
            where=OVERRIDE,
            hint="e.g. --set grid.seq_len=[64,128] or --set timing.max_case_s=2",
        )
    keys = key.strip().split(".")
    if not all(_OVERRIDE_KEY.fullmatch(k) for k in keys):
        raise ConfigError(
            f"bad key path {key.strip()!r}: use dot-separated keys such as grid.seq_len",
            where=OVERRIDE,
            hint="e.g. --set timing.target_ci=0.02",
        )
    if len(raw) > 10_000:
        raise ConfigError(
            f"the value is {len(raw)} characters long; the cap is 10000",
            where=OVERRIDE,
            key=".".join(keys),
            hint="put large values in the config file",
        )
    try:
        value = yaml.safe_load(raw)
    except RecursionError:
        raise ConfigError("the value nests too deeply", where=OVERRIDE, key=".".join(keys)) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, OVERRIDE, with_line=False, key=".".join(keys)) from None
    except (ValueError, TypeError, AttributeError) as exc:  # an explicit !!int abc and its kin
        raise ConfigError(f"invalid value {raw!r}: {exc}", where=OVERRIDE, key=".".join(keys)) from None
    return keys, value


def apply_override(data: dict[Any, Any], keys: list[str], value: Any, touched: list[Path_]) -> None:
    """Set ``keys`` to ``value`` in ``data``, making missing mappings; record each path made or set in ``touched``."""
    node = data
    for i, key in enumerate(keys[:-1]):
        if key not in node:
            node[key] = {}
            touched.append(tuple(keys[: i + 1]))
        elif not isinstance(node[key], dict):
            raise ConfigError(
                f"cannot set {'.'.join(keys)}: {key!r} holds {describe(node[key])}, not a mapping",
                where=OVERRIDE,
                key=".".join(keys[: i + 1]),
            )
        node = node[key]
    node[keys[-1]] = value
    touched.append(tuple(keys))
