"""YAML as people read it: keys in the order written, multi-line strings as ``|`` blocks, no line folding."""

from __future__ import annotations

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump(data, header: str = "") -> str:
    """``data`` as YAML, preceded by ``header`` as comment lines."""
    comments = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    return comments + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)
