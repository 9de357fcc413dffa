"""What every ``ragheat`` command shares: the consoles, settings from flags, progress bars, one-sentence
failures, and the error guard."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

    from rag.settings import RagheatSettings

console = Console(stderr=True, soft_wrap=True)  # messages and progress; an error stays one line
out = Console()  # results


def fail(message: str, code: int = 2):
    """Print one red sentence and exit with ``code`` (2: the user's input or environment; 1: a check failed)."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def guard(interrupted: str = "interrupted; nothing was changed"):
    """Turn ragheat's own errors into one red sentence and exit code 2, not a traceback; Ctrl-C exits 130
    with ``interrupted``, which says what state the command left behind."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from rag.errors import RagheatError

            try:
                return fn(*args, **kwargs)
            except RagheatError as exc:
                fail(str(exc))
            except KeyboardInterrupt:
                fail(interrupted, code=130)
        return wrapper

    return decorate


def load_settings(**overrides: dict) -> RagheatSettings:
    """Environment settings with the given section overrides (flags; ``None`` = not given); a bad value exits
    with the setting's name."""
    from pydantic import ValidationError

    from rag.settings import RagheatSettings

    try:
        base = RagheatSettings()
        update = {}
        for section, values in overrides.items():
            values = {k: v for k, v in values.items() if v is not None}
            if values:
                update[section] = getattr(base, section).model_copy(update=values).model_dump()
        return RagheatSettings(**{**base.model_dump(), **update}) if update else base
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        fail(f"invalid setting {where}: {first['msg'].removeprefix('Value error, ')}")
    except ValueError as exc:  # the settings file (RAGHEAT_SETTINGS_FILE) is missing or not JSON
        fail(str(exc))


def beir_sets(beir: str, split: str, index: str | None) -> list[tuple[Path, str, Path]]:
    """(folder, split, index) per ``--beir`` folder (comma-separated): ``--split`` one per folder or one for all,
    ``--index`` one per folder (default ``data/index/<folder name>``); exits with a sentence when they do not pair."""
    folders = [Path(p) for p in beir.split(",") if p.strip()]
    splits = [s.strip() for s in split.split(",")]
    if len(splits) == 1:
        splits *= len(folders)
    indexes = [Path(p) for p in index.split(",")] if index else [Path("data/index") / f.resolve().name for f in folders]
    if len(splits) != len(folders) or len(indexes) != len(folders):
        fail(f"--split and --index take one value per --beir folder ({len(folders)}), or one --split for all")
    return list(zip(folders, splits, indexes))


def progress_bar() -> Progress:
    """The progress display of long commands (ingest, eval, bench), on stderr."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False)
