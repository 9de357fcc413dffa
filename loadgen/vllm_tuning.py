"""``ragheat tune-vllm``: joint tuning of ``max_num_seqs`` x ``max_model_len`` (x block size).

For each cell a fresh vLLM server starts with those settings and is driven open-loop (Poisson arrivals
from ``loadgen.arrivals``, latency counted from each request's intended send time, so a saturated cell
shows its queueing instead of hiding it) at one fixed offered rate with the same workload: prompts of
``prompt_tokens`` random token ids (distinct, so the prefix cache cannot flatter a cell) and
``max_tokens`` output tokens with ``ignore_eos``. Each cell reports output tokens/s, TTFT P99 and
end-to-end P99, and meets the SLO when both P99s are within their limits and no request failed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import aiohttp
import numpy as np

from loadgen.arrivals import poisson_offsets
from loadgen.stats import percentiles_ms
from rag.childproc import free_port
from stack.vllm import VllmServer


@dataclass
class Cell:
    """One (max_num_seqs, max_model_len, block size) setting and what the sweep measured with it."""

    max_num_seqs: int
    max_model_len: int
    block_size: int | None
    requests: int = 0
    errors: int = 0
    tokens_per_s: float = 0.0
    ttft_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    meets_slo: bool = False
    failure: str | None = None  # the server did not start with these settings


@dataclass
class _Outcome:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0


async def _one(session: aiohttp.ClientSession, url: str, body: dict, intended: float) -> _Outcome:
    await asyncio.sleep(max(0.0, intended - time.perf_counter()))
    first = None
    tokens = 0
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                await response.read()
                return _Outcome(False)
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
                # The first token, not the first visible text: a byte-level token that is part of a UTF-8
                # character arrives with empty text (random weights can write nothing but such tokens).
                if first is None and chunk.get("choices"):
                    first = time.perf_counter()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        return _Outcome(False)
    done = time.perf_counter()
    return _Outcome(first is not None, (first or done) - intended, done - intended, tokens)


async def drive(url: str, model: str, *, rate: float, duration_s: float, prompt_tokens: int, max_tokens: int,
                vocab_size: int, seed: int = 0, timeout_s: float = 120.0) -> tuple[list[_Outcome], float]:
    """Open-loop load on ``url``'s ``/completions``; returns the outcomes and the wall time they took."""
    rng = np.random.default_rng(seed)
    offsets = poisson_offsets(rate, duration_s, rng)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter() + 0.05
        tasks = [_one(session, url + "/completions", {
            "model": model, "prompt": rng.integers(10, vocab_size, prompt_tokens).tolist(), "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}},
            start + float(offset)) for offset in offsets]
        outcomes = await asyncio.gather(*tasks)
        return list(outcomes), time.perf_counter() - start


def run_cell(model: Path | str, cell: Cell, *, rate: float, duration_s: float, prompt_tokens: int,
             max_tokens: int, vocab_size: int, load_format: str, slo_ttft_ms: float, slo_e2e_ms: float,
             python=None, cpu: bool = True, seed: int = 0, extra_args: Sequence[str] = (), served_name: str = "tune",
             work_dir: Path | None = None, keep: Callable[[Cell, VllmServer], bool] | None = None) -> Cell:
    """Start a vLLM server with ``cell``'s settings, drive it and fill in ``cell`` (``failure`` if it did not start).
    The server stops after the drive, unless ``keep(cell, server)`` takes it (returns True: the caller stops it)."""
    server = VllmServer(model, port=free_port(), python=python, served_name=served_name, cpu=cpu,
                        max_model_len=cell.max_model_len, max_num_seqs=cell.max_num_seqs, block_size=cell.block_size,
                        load_format=load_format, extra_args=extra_args, work_dir=work_dir)
    try:
        url = server.__enter__()
        outcomes, wall = asyncio.run(drive(url, served_name, rate=rate, duration_s=duration_s, seed=seed,
                                           prompt_tokens=prompt_tokens, max_tokens=max_tokens, vocab_size=vocab_size))
    except BaseException as exc:
        server.__exit__(None, None, None)
        if not isinstance(exc, (RuntimeError, TimeoutError)):
            raise
        cell.failure = str(exc).splitlines()[0]
        return cell
    kept = False
    try:
        good = [o for o in outcomes if o.ok]
        cell.requests, cell.errors = len(outcomes), len(outcomes) - len(good)
        cell.tokens_per_s = round(sum(o.tokens for o in good) / wall, 2) if wall > 0 else 0.0
        cell.ttft_p99_ms = percentiles_ms([o.ttft for o in good])["p99"]
        cell.e2e_p99_ms = percentiles_ms([o.e2e for o in good])["p99"]
        cell.meets_slo = (bool(good) and cell.errors == 0 and cell.ttft_p99_ms <= slo_ttft_ms
                          and cell.e2e_p99_ms <= slo_e2e_ms)
        kept = keep is not None and keep(cell, server)
    finally:
        if not kept:
            server.__exit__(None, None, None)
    return cell


def run_tuning(model: Path | str, *, max_num_seqs: Sequence[int], max_model_len: Sequence[int],
               block_sizes: Sequence[int | None], rate: float, duration_s: float, prompt_tokens: int,
               max_tokens: int, slo_ttft_ms: float, slo_e2e_ms: float, load_format: str = "auto",
               python=None, cpu: bool = True, on_cell: Callable[[Cell], None] | None = None,
               served_name: str = "tune", logs: Path | None = None,
               keep_last: Callable[[Cell, VllmServer], bool] | None = None) -> dict:
    """Every cell of the grid, one fresh server each, in the order given (block sizes, then lengths, then batch
    sizes); the results as ``results.json`` holds them. ``logs``: a folder each cell's server writes its log into
    (``cell-<seqs>x<len>``, kept); otherwise a temporary one. ``keep_last(cell, server)``: offered the last cell's
    server, still running, which it may take (``run_cell``'s ``keep``)."""
    vocab_size = json.loads((Path(model) / "config.json").read_text()).get("vocab_size", 32000)
    grid = [(block, length, seqs) for block in block_sizes for length in max_model_len for seqs in max_num_seqs]
    cells = []
    for i, (block, length, seqs) in enumerate(grid):
        folder = None if logs is None else logs / (f"cell-{seqs}x{length}" + ("" if block is None else f"-b{block}"))
        cell = run_cell(model, Cell(seqs, length, block), rate=rate, duration_s=duration_s,
                        prompt_tokens=prompt_tokens, max_tokens=max_tokens, vocab_size=vocab_size,
                        load_format=load_format, slo_ttft_ms=slo_ttft_ms, slo_e2e_ms=slo_e2e_ms,
                        python=python, cpu=cpu, served_name=served_name, work_dir=folder,
                        keep=keep_last if i == len(grid) - 1 else None)
        cells.append(cell)
        if on_cell is not None:
            on_cell(cell)
    return {"model": str(model), "rate": rate, "duration_s": duration_s, "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens, "slo": {"ttft_p99_ms": slo_ttft_ms, "e2e_p99_ms": slo_e2e_ms},
            "cells": [asdict(c) for c in cells]}


def _tokens_norm(grid: np.ndarray):
    """Colours from the slowest to the fastest cell that ran; cells that all ran at one rate take the middle
    colour, so an even grid reads as neither the worst nor the best."""
    from matplotlib.colors import Normalize

    ran = grid[~np.isnan(grid)]
    if ran.size == 0:
        return Normalize(0.0, 1.0)
    low, high = float(ran.min()), float(ran.max())
    if high == low:
        return Normalize(low - 1.0, high + 1.0)
    return Normalize(low, high)


def write_results(results: dict, out_dir: Path) -> list[Path]:
    """``results.json`` and one heatmap per block size (tokens/s, SLO cells outlined, P99s in the cells)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json"]
    paths[0].write_text(json.dumps(results, indent=2))
    cells = results["cells"]
    for block in dict.fromkeys(c["block_size"] for c in cells):
        subset = [c for c in cells if c["block_size"] == block]
        seqs = sorted({c["max_num_seqs"] for c in subset})
        lens = sorted({c["max_model_len"] for c in subset})
        grid = np.full((len(lens), len(seqs)), np.nan)
        fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(seqs), 1.4 + 0.9 * len(lens)))
        for c in subset:
            i, j = lens.index(c["max_model_len"]), seqs.index(c["max_num_seqs"])
            grid[i, j] = c["tokens_per_s"] if c["failure"] is None else np.nan
        image = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto", norm=_tokens_norm(grid))
        for c in subset:
            i, j = lens.index(c["max_model_len"]), seqs.index(c["max_num_seqs"])
            text = ("failed" if c["failure"] else
                    f"{c['tokens_per_s']:.0f} tok/s\nTTFT {c['ttft_p99_ms'] or 0:.0f}\nE2E {c['e2e_p99_ms'] or 0:.0f}")
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white")
            if c["meets_slo"]:
                ax.add_patch(plt.Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, ec="#ff4040", lw=2.5))
        ax.set_xticks(range(len(seqs)), [str(s) for s in seqs])
        ax.set_yticks(range(len(lens)), [str(v) for v in lens])
        ax.set_xlabel("max_num_seqs")
        ax.set_ylabel("max_model_len")
        slo = results["slo"]
        ax.set_title(f"block {block or 'default'}: tokens/s at {results['rate']:g} req/s (red = meets TTFT P99 "
                     f"{slo['ttft_p99_ms']:g} ms, E2E P99 {slo['e2e_p99_ms']:g} ms)", fontsize=8)
        fig.colorbar(image, ax=ax, label="output tokens/s")
        fig.tight_layout()
        path = out_dir / f"heatmap-block{block or 'default'}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
