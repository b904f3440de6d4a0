"""Can this runtime run the artifact, and does it reproduce the golden vectors?

For an ExecuTorch program this is also the build-time compatibility report an app team needs: the
operators outside the delegate and the delegates the program calls, against what the runtime at hand
has registered (what an app must link, with ``runtime.kernel_libraries`` naming the libraries).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .golden import check_golden
from .verify_types import Check

# torch's CPU capability names, least to most demanding, per architecture family
ISA_ORDER = (("DEFAULT", "AVX2", "AVX512"), ("DEFAULT", "SVE128", "SVE256"))


def isa_runs(built: str, here: str) -> bool:
    """A package compiled for ``built`` runs on a CPU whose best capability is ``here``."""
    if built == here or built == "DEFAULT":
        return True
    return any(built in o and here in o and o.index(here) >= o.index(built) for o in ISA_ORDER)


def pte_checks(path: Path, runtime: dict[str, Any]) -> list[Check]:
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime, Verification

    from backends.xnnpack.runtime import load_executorch_kernels

    load_executorch_kernels()
    ops = set(portable_lib._get_operator_names())
    missing = sorted(set(runtime.get("operators_outside_delegate", [])) - ops)
    backends = set(portable_lib._get_registered_backend_names())
    absent = sorted(set(runtime.get("delegates", [])) - backends)
    checks = [
        Check(
            "kernels",
            not missing,
            f"not registered here: {', '.join(missing)}"
            if missing
            else f"all {len(runtime.get('operators_outside_delegate', []))} operators outside the "
            "delegate are registered",
        ),
        Check(
            "delegates",
            not absent,
            f"not registered here: {', '.join(absent)}"
            if absent
            else "registered: " + ", ".join(runtime.get("delegates", [])),
        ),
    ]
    try:
        program = Runtime.get().load_program(path, verification=Verification.InternalConsistency)
        program.load_method("forward")
    except Exception as e:  # the runtime raises RuntimeError/ValueError carrying its error code
        checks.append(Check("program", False, f"does not load with InternalConsistency verification ({e})"))
    else:
        checks.append(Check("program", True, "loads with Verification.InternalConsistency"))
    return checks


def pt2_checks(runtime: dict[str, Any]) -> list[Check]:
    import torch

    built, here = runtime.get("torch_version"), torch.__version__
    isa, here_isa = runtime.get("cpu_isa", ""), torch.backends.cpu.get_cpu_capability()
    return [
        Check("torch", built == here, f"compiled with torch {built}, this environment has {here}"),
        Check("cpu isa", isa_runs(isa, here_isa), f"compiled on {isa}, this CPU offers {here_isa}"),
    ]


def runtime_checks(folder: Path, manifest: dict[str, Any]) -> list[Check]:
    from ..plumbing.native_logs import native_logs_captured

    runtime = manifest["runtime"]
    if runtime["format"] != "executorch-pte":
        return pt2_checks(runtime)
    with native_logs_captured():  # the runtime logs its CPU probing to fd 2
        return pte_checks(folder / manifest["artifact"]["file"], runtime)


def golden_check(folder: Path, manifest: dict[str, Any], golden: dict[str, Any]) -> Check:
    from ..plumbing.native_logs import native_logs_captured
    from .load import load_artifact

    with native_logs_captured():
        problems = check_golden(load_artifact(folder, manifest), golden)
    calls = sum(len(c["expected"]) for c in golden["cases"])
    atol = golden["logit_atol"]
    detail = "; ".join(problems[:5]) if problems else f"{calls} calls reproduced within {atol:.3g}"
    return Check("golden vectors", not problems, detail)
