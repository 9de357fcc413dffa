"""``ragheat calibrate-quality`` (in this process) over the SciFact subset's index: the calibration file it writes is
the one the service reads, its threshold is the flag rate's quantile of those questions' best similarity, and bad
arguments exit 2 with a sentence."""

from __future__ import annotations

import contextlib
from pathlib import Path

from typer.testing import CliRunner

from rag.pipeline import RagPipeline
from rag.quality.calibration import Calibration
from ragheat.cli import app


def run_cli(*args: str, cwd: Path):
    with contextlib.chdir(cwd):
        result = CliRunner(env={"COLUMNS": "1000", "NO_COLOR": "1"}).invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_calibration_of_a_corpus_own_questions_is_what_the_service_reads(scifact_subset, subset_index, settings,
                                                                        tmp_path):
    out = tmp_path / "calibration.json"
    result = run_cli("calibrate-quality", "--beir", str(scifact_subset), "--split", "train", "--index",
                     str(subset_index), "--flag-rate", "0.1", "--out", str(out), cwd=tmp_path)
    assert result.exit_code == 0, result.output
    calibration = Calibration.load(out)
    assert calibration.flag_rate == 0.1 and calibration.sources[0]["beir"] == scifact_subset.name
    assert calibration.reference["best_similarity"]["0.1"] == calibration.min_similarity
    assert calibration.sources[-1]["command"].startswith("ragheat calibrate-quality --beir")
    s = settings.model_copy(update={"quality": settings.quality.model_copy(update={"calibration": out})})
    pipeline = RagPipeline(s, subset_index)
    pipeline.warm_up()
    try:
        assert pipeline.quality.min_similarity == calibration.min_similarity
    finally:
        pipeline.close()


def test_folders_splits_and_indexes_that_do_not_pair_exit_2(scifact_subset, tmp_path):
    result = run_cli("calibrate-quality", "--beir", str(scifact_subset), "--split", "train,dev", cwd=tmp_path)
    assert result.exit_code == 2 and "one value per --beir folder" in result.output
