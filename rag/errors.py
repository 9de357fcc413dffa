"""Errors that say which part of ragheat failed.

``api/errors.py`` is the one place that maps these to HTTP status codes.
"""

from __future__ import annotations


class RagheatError(Exception):
    """Base class for every error ragheat raises on purpose."""


class ConfigurationError(RagheatError):
    """A setting or a combination of settings is invalid; raised at start-up."""


class IndexLoadError(RagheatError):
    """An index directory is missing, incomplete or corrupt."""

    def __init__(self, path, reason: str) -> None:
        super().__init__(f"index at {path} cannot be loaded: {reason}")
        self.path = path
        self.reason = reason


class IngestError(RagheatError):
    """A source could not be read or turned into an index."""


class StageError(RagheatError):
    """A pipeline stage failed while serving a request; names the stage."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.cause = cause
        self.stages: list = []  # StageTimings of the request up to the failure, filled by the pipeline

    @classmethod
    def from_exception(cls, stage: str, exc: BaseException) -> "StageError":
        """``exc`` itself if it already names a stage, else a ``StageError`` for ``stage``."""
        return exc if isinstance(exc, StageError) else cls(stage, exc)
