"""Greedy traces of ``.pte`` programs: the same code runs on x86 (in process) and inside the emulated
aarch64 Python (``python -m tools.arm64.runner JOB.json``), so the two sides differ only
in the CPU and the native libraries under them."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from backends.xnnpack.runtime import load_pte
from exporter.gate.steppers import greedy
from exporter.plumbing.native_logs import native_logs_captured


def trace_program(pte: Path, prompts: Sequence[Sequence[int]], steps: int) -> dict[str, torch.Tensor]:
    """Per prompt: greedy tokens [steps] and logits [steps, V], each prompt on a freshly loaded program
    (the KV cache lives inside it). ``seconds`` is the wall time of loads and calls, imports excluded."""
    start = time.perf_counter()
    out: dict[str, torch.Tensor] = {}
    with native_logs_captured():
        for i, prompt in enumerate(prompts):
            trace = greedy(load_pte(pte), prompt, steps)
            out[f"tokens{i}"] = torch.tensor(trace.tokens)
            out[f"logits{i}"] = trace.logits
    out["seconds"] = torch.tensor(time.perf_counter() - start)
    return out


def main(job_file: str) -> None:
    """JOB.json: {"steps": n, "programs": [{"pte": path, "prompts": [[ids]], "out": path.pt}]}."""
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    for program in job["programs"]:
        traces = trace_program(Path(program["pte"]), program["prompts"], job["steps"])
        torch.save(traces, program["out"])
        print(f"traced {program['pte']} in {float(traces['seconds']):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
