"""AOTInductor backend on tiny seeded models: int4 is really packed, the package matches eager from
Python and from the C++ consumer, and a package that cannot load gets a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends import get_backend
from exporter.build.pipeline import export_program, prepare_module, weight_bytes
from exporter.errors import ArtifactError
from exporter.gate.steppers import eager_stepper, follow, greedy
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.recipe import load_recipe

AOTI_DIR = Path(__file__).resolve().parents[2] / "backends" / "aoti"
PROMPT = [0, 17, 99, 1024, 5]


@pytest.fixture(scope="module", params=["server-x86-int4", "server-x86-fp32"])
def compiled(request: pytest.FixtureRequest, tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    recipe = load_recipe(request.param, ("export.max_seq_len=64",))
    model = load_model(open_checkpoint(tiny_checkpoint), 64)
    module = prepare_module(recipe, model)
    program = export_program(module, 64)
    out = tmp_path_factory.mktemp("pt2") / "model.pt2"
    result = get_backend("aoti").lower(program, {"get_max_seq_len": 64}, out)
    return recipe, module, program, result


@pytest.fixture(scope="session")
def cpp_runner() -> Path:
    subprocess.run(["make", "-C", str(AOTI_DIR), f"PYTHON={sys.executable}"], check=True, capture_output=True)
    return AOTI_DIR / "build" / "aoti_runner"


def test_int4_weights_are_packed_half_a_byte(compiled) -> None:  # type: ignore[no-untyped-def]
    recipe, module, program, _ = compiled
    linear_params = sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))
    embed = module.model.tok_embeddings.weight
    linear_bytes = (
        weight_bytes(program)
        - embed.numel() * embed.element_size()
        - sum(m.weight.nbytes for m in module.modules() if type(m).__name__ == "RMSNorm")
    )
    per_param = linear_bytes / linear_params
    if recipe.quantization.linear is None:
        assert per_param == pytest.approx(4.0, rel=0.01)  # fp32
    else:
        # 4-bit codes + bf16 scale and zero per group of 32: 0.5 + 4/32 bytes
        assert per_param == pytest.approx(0.625, rel=0.02)
        assert type(module.model.layers[0].attention.wq.weight).__name__ == "Int4OpaqueTensor"


def test_package_records_what_a_server_needs(compiled) -> None:  # type: ignore[no-untyped-def]
    _, _, _, result = compiled
    rt = result.runtime
    assert rt["format"] == "aoti-pt2" and rt["torch_version"] == torch.__version__
    assert rt["cpu_isa"] and rt["compiler"]
    assert any(f.endswith(".so") for f in rt["package_files"])


def test_python_loader_matches_eager(compiled) -> None:  # type: ignore[no-untyped-def]
    recipe, module, _, result = compiled
    eager = greedy(eager_stepper(module), PROMPT, 32)
    got = follow(get_backend("aoti").load(result.path), PROMPT, eager.tokens)
    assert got.argmax(-1).tolist() == eager.tokens
    tol = 1e-3 if recipe.quantization.linear is None else 0.25
    assert (got - eager.logits).abs().max().item() < tol


def test_cpp_consumer_matches_python_and_eager(compiled, cpp_runner: Path) -> None:  # type: ignore[no-untyped-def]
    _, module, _, result = compiled
    eager = greedy(eager_stepper(module), PROMPT, 32).tokens
    out = subprocess.run(
        [str(cpp_runner), str(result.path), "32", *map(str, PROMPT)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert [int(t) for t in out.stdout.split()] == eager


def test_unloadable_package_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match="AOTInductor cannot load this package here"):
        get_backend("aoti").load(bad)
    with pytest.raises(ArtifactError, match="file missing"):
        get_backend("aoti").load(tmp_path / "absent.pt2")
