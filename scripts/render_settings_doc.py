"""Render docs/settings.md from the settings module (rag/settings.py): every section, every field, its environment
variable, type, default and description, read from the pydantic models themselves.

    .venv/bin/python scripts/render_settings_doc.py            write docs/settings.md
    .venv/bin/python scripts/render_settings_doc.py --check    exit 1 with a diff if the doc differs from a fresh
                                                               rendering

The settings module is the only source: a field's help is its ``Field(description=...)``, a section's is its class
docstring. Edit those, then run this; tests/test_settings_doc.py fails while the committed doc is stale.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import sys
import types
import typing
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from pydantic import BaseModel, SecretStr  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from rag.settings import RagheatSettings  # noqa: E402

DOC = REPO / "docs" / "settings.md"
COMMAND = ".venv/bin/python scripts/render_settings_doc.py"

HEADER = f"""\
# Settings

<!-- Generated from rag/settings.py by scripts/render_settings_doc.py: do not edit by hand.
     Change the settings module, then run: {COMMAND} -->

ragheat has one settings object, `RagheatSettings` in [rag/settings.py](../rag/settings.py), with a section per
concern. Every field below can be set from the environment as `RAGHEAT_<SECTION>__<FIELD>`; a command-line flag
overrides the environment, which overrides a settings file (JSON, sections of fields, named by
`RAGHEAT_SETTINGS_FILE` or `ragheat serve --settings`; `ragheat tune` writes one: [docs/tuning.md](tuning.md)),
which overrides the default. Lists are given as JSON
(`RAGHEAT_RETRIEVAL__RETRIEVERS='["routed"]'`). An invalid value, or an invalid combination of values, stops the
program at start-up with a sentence naming the setting.

```bash
RAGHEAT_INDEX__KIND=flat RAGHEAT_RETRIEVAL__BM25_WEIGHT=1.0 ragheat serve --index data/index/wiki
```

Defaults that depend on the user are shown for a home folder `~` and no `XDG_CACHE_HOME`.
Which flag sets which field: [docs/cli.md](cli.md).
"""


@contextmanager
def _portable_environment():
    """Defaults that depend on the user (a cache under the home folder) render the same on every machine."""
    saved = {name: os.environ.get(name) for name in ("HOME", "XDG_CACHE_HOME")}
    os.environ["HOME"] = "~"
    os.environ.pop("XDG_CACHE_HOME", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _markdown(text: str) -> str:
    """Docstring prose (reStructuredText literals) as one Markdown paragraph per blank-line-separated block."""
    text = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(text))
    return "\n\n".join(" ".join(block.split()) for block in re.split(r"\n\s*\n", text) if block.strip())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        shown = " or ".join(_type(a) for a in rest)
        return f"{shown} or unset" if len(rest) < len(args) else shown
    if origin is list:
        return f"list of {_type(args[0])}" if args else "list"
    if isinstance(annotation, type):
        if issubclass(annotation, SecretStr):
            return "secret string"
        if issubclass(annotation, Path):
            return "path"
        if issubclass(annotation, Enum):
            return " | ".join(f"`{m.value}`" for m in annotation)
        return {bool: "bool", int: "int", float: "float", str: "string"}.get(annotation, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bounds(info: FieldInfo) -> str:
    """The field's constraints in words: "8 to 512", "> 0", "non-empty"."""
    found: dict[str, object] = {}
    for item in info.metadata:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(item, name, None) is not None:
                found[name] = getattr(item, name)
    low = ("ge", found["ge"]) if "ge" in found else ("gt", found["gt"]) if "gt" in found else None
    high = ("le", found["le"]) if "le" in found else ("lt", found["lt"]) if "lt" in found else None
    words = []
    if low and high and low[0] == "ge" and high[0] == "le":
        words.append(f"{_number(low[1])} to {_number(high[1])}")
    else:
        words += [f"{'≥' if low[0] == 'ge' else '>'} {_number(low[1])}"] if low else []
        words += [f"{'≤' if high[0] == 'le' else '<'} {_number(high[1])}"] if high else []
    if found.get("min_length") == 1:
        words.append("non-empty")
    elif "min_length" in found:
        words.append(f"at least {found['min_length']} characters")
    if "max_length" in found:
        words.append(f"at most {found['max_length']} characters")
    if "pattern" in found:
        words.append(f"matching `{found['pattern']}`")
    return ", ".join(words)


def _value(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return '`""`' if not value.get_secret_value() else "(set)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (int, float)):
        return f"`{_number(value)}`"
    if isinstance(value, list):
        return "`[" + ", ".join(_value(v).strip("`") for v in value) + "]`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value}`"


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        with _portable_environment():
            return _value(info.default_factory())
    if info.default is PydanticUndefined:
        return "(required)"
    return _value(info.default)


def render(root: type[BaseModel] = RagheatSettings) -> str:
    """The whole doc, from the settings classes alone."""
    prefix = root.model_config.get("env_prefix", "")
    delimiter = root.model_config.get("env_nested_delimiter", "__")
    sections = [(name, info.annotation) for name, info in root.model_fields.items()
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)]
    parts = [HEADER, "Sections: " + ", ".join(f"[`{name}`](#{name})" for name, _ in sections) + ".\n"]
    for name, model in sections:
        parts.append(f"## {name}\n")
        doc = model.__dict__.get("__doc__")
        if doc:
            parts.append(_markdown(doc) + "\n")
        rows = ["| field | environment variable | type | default | description |", "|---|---|---|---|---|"]
        for field, info in model.model_fields.items():
            kind = _type(info.annotation)
            bounds = _bounds(info)
            rows.append("| " + " | ".join([
                f"`{field}`",
                f"`{prefix}{name.upper()}{delimiter}{field.upper()}`",
                _cell(f"{kind}, {bounds}" if bounds else kind),
                _cell(_default(info)),
                _cell(_markdown(info.description)) if info.description else "",
            ]) + " |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=DOC, help="the doc to write or check (default docs/settings.md)")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
        return 0
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    if current != text:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                                   str(args.out), "rendered from rag/settings.py"))
        print(f"\n{args.out} differs from what rag/settings.py renders: run {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
