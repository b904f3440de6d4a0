"""Golden vectors: inputs and expected outputs of the built program, stored in the artifact as
``golden.json`` so an app team can run the same check on the device, and ``exporter verify`` re-runs it.

Why not ExecuTorch's BundledProgram: it checks one method call per test case against fixed outputs,
starting from the program's initial state; our programs keep the KV cache inside, so a decode step
is only meaningful after the prefill that filled the cache. A golden case here is a sequence of calls
on one loaded program: one prefill of ``prompt`` at position 0, then greedy decode steps, each
feeding the previous step's expected token at the next position.

Per call it stores the expected greedy token and the ``top_k`` largest logits with their ids. A
runtime passes when every stored logit is within ``logit_atol`` and every greedy token matches,
except where the expected top-2 margin is below ``2 * logit_atol`` (a tie that other kernels may
break the other way; the check then feeds the expected token and goes on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

GOLDEN = "golden.json"
FORMAT = "exporter-golden/1"
# How far another runtime or CPU may put a golden logit, relative to the largest |logit|. Float
# programs differ by summation order only: 1e-3. Programs that quantize activations at run time
# (8da*) round each activation to int8 in the CPU's own kernel, and one flipped int8 moves a whole
# row: measured on pycode-4m's android-arm64 .pte, aarch64 (qemu, neoverse-n1) vs x86 differed by
# 5.6e-3 on one prompt, with the same greedy tokens. 2e-2 leaves room for other ARM cores.
FLOAT_RTOL = 1e-3
DYNAMIC_QUANT_RTOL = 2e-2

# step(tokens int64[1, T], input_pos int64[1]) -> logits [1, V]
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _calls(prompt: Sequence[int], tokens: Sequence[int]) -> list[tuple[list[int], int]]:
    """(input tokens, position) of each call: the prefill, then one call per fed-back token."""
    return [(list(prompt), 0)] + [([t], len(prompt) + i) for i, t in enumerate(tokens)]


def _run(step: Step, ids: list[int], pos: int) -> torch.Tensor:
    return step(torch.tensor([ids], dtype=torch.long), torch.tensor([pos], dtype=torch.long))[0].float()


def make_golden(
    step: Step,
    prompts: Sequence[Sequence[int]],
    decode_steps: int,
    top_k: int = 8,
    rtol: float = FLOAT_RTOL,
) -> dict[str, Any]:
    """Record the program's own outputs on ``prompts`` (prefill + ``decode_steps`` greedy steps)."""
    cases = []
    scale = 1.0
    for prompt in prompts:
        expected: list[dict[str, Any]] = []
        tokens: list[int] = []
        ids, pos = list(prompt), 0
        for _ in range(decode_steps + 1):
            logits = _run(step, ids, pos)
            values, indices = logits.topk(top_k)
            scale = max(scale, float(logits.abs().max()))
            token = int(indices[0])
            expected.append({"token": token, "top_ids": indices.tolist(), "top_logits": values.tolist()})
            tokens.append(token)
            ids, pos = [token], pos + len(ids)
        cases.append({"prompt": list(prompt), "expected": expected})
    return {
        "format": FORMAT,
        "method": "forward",
        "calling_convention": "forward(tokens int64[1, T], input_pos int64[1]) -> logits float32[1, V]; "
        "call 0 is the prompt at position 0, call i feeds expected[i-1].token at position "
        "len(prompt) + i - 1, on one loaded program per case",
        # relative to the largest |logit| seen, so the tolerance means the same on any model
        "relative_tolerance": rtol,
        "logit_atol": round(rtol * scale, 6),
        "cases": cases,
    }


def check_golden(step: Step, golden: dict[str, Any]) -> list[str]:
    """Re-run the golden cases; one line per mismatch (empty when the runtime reproduces them)."""
    atol = float(golden["logit_atol"])
    problems: list[str] = []
    for n, case in enumerate(golden["cases"]):
        tokens = [e["token"] for e in case["expected"][:-1]]
        calls = zip(_calls(case["prompt"], tokens), case["expected"], strict=True)
        for i, ((ids, pos), want) in enumerate(calls):
            logits = _run(step, ids, pos)
            got = logits[torch.tensor(want["top_ids"])]
            error = float((got - torch.tensor(want["top_logits"])).abs().max())
            if error > atol:
                problems.append(f"case {n} call {i}: logits differ by {error:.3g} > {atol:.3g}")
            top = want["top_logits"]
            tie = len(top) > 1 and top[0] - top[1] < 2 * atol
            token = int(logits.argmax())
            if token != want["token"] and not tie:
                problems.append(f"case {n} call {i}: greedy token {token}, expected {want['token']}")
    return problems
