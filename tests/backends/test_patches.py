"""The lean-lowering patches: each fires, none changes the program (byte-identical ``.pte`` against
the stock flow on every shipped XNNPACK recipe's graph shape), and each stays out when switched
off or on versions it was not verified on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from backends import get_backend
from backends.xnnpack import patches
from backends.xnnpack.patches import guard
from backends.xnnpack.patches.compact_dependencies import CompactDependencyViewer
from backends.xnnpack.patches.lean_passes import ONLY_WITH_OPS, needed
from exporter.build.pipeline import export_program, prepare_module
from exporter.errors import RecipeError
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.recipe import Recipe, list_recipes, load_recipe

EVERY_PATCH = {p.NAME for p in patches.PATCHES}
DEVICE_RECIPES = ("android-arm64", "ios-arm64", "linux-arm64")

# (recipe, overrides, checkpoint family and config): every graph shape the shipped XNNPACK recipes
# lower. The device recipes tune linears to 8da4w g32 or 8da8w per channel: both are covered.
SHAPES: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "8da4w-untied": ("android-arm64", (), {"family": "llama"}),
    "8da4w-tied-qkv-bias": ("android-arm64", (), {"family": "qwen2", "tie_word_embeddings": True}),
    "8da8w-per-channel-qk-norm": (
        "android-arm64",
        (
            "quantization.gptq=false",
            "quantization.linear.scheme=8da8w",
            "quantization.linear.group_size=0",
        ),
        {"family": "qwen3", "tie_word_embeddings": False},
    ),
    "fp32-tied-qkv-bias": ("reference-fp32", (), {"family": "qwen2", "tie_word_embeddings": True}),
    "fp32-untied-qk-norm": ("reference-fp32", (), {"family": "qwen3", "tie_word_embeddings": False}),
}


def _lower(recipe: Recipe, checkpoint: Path, out: Path, lean: bool) -> bytes:
    model = load_model(open_checkpoint(checkpoint), recipe.export.max_seq_len)
    module = prepare_module(recipe, model)
    program = export_program(module, recipe.export.max_seq_len)
    get_backend("xnnpack").lower(program, {"get_max_seq_len": 64}, out, lean_lowering=lean)
    return out.read_bytes()


def test_the_shapes_cover_every_shipped_xnnpack_recipe() -> None:
    """The device recipes differ in name and description only, so one of them stands for all."""
    recipes = [load_recipe(str(p)) for p in list_recipes()]
    xnnpack = {r.name for r in recipes if r.backend == "xnnpack"}
    # android-arm64-qat: the device recipe with the whole-model tuning, same grids
    assert xnnpack == {name for name, _, _ in SHAPES.values()} | set(DEVICE_RECIPES) | {"android-arm64-qat"}
    android = load_recipe("android-arm64")
    for name in DEVICE_RECIPES:
        r = load_recipe(name)
        assert (r.export, r.quantization) == (android.export, android.quantization), name
    linear = android.quantization.linear
    assert linear is not None and (linear.scheme, linear.group_size) == ("8da4w", 32)
    assert android.quantization.gptq is not None and android.quantization.gptq.int8_size_ratio > 1  # 8da8w
    qat = load_recipe("android-arm64-qat").quantization
    assert qat.linear == linear and qat.mixed is not None
    assert {c.scheme for c in qat.mixed.candidates} == {"8da8w"}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_lean_lowering_makes_the_stock_program(
    shape: str, make_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe_name, overrides, config = SHAPES[shape]
    recipe = load_recipe(recipe_name, ("export.max_seq_len=64", *overrides))
    checkpoint = make_checkpoint(shape, **config)
    patches.FIRED.clear()
    lean = _lower(recipe, checkpoint, tmp_path / "lean.pte", lean=True)
    fired = {name for name, n in patches.FIRED.items() if n}
    patches.FIRED.clear()
    stock = _lower(recipe, checkpoint, tmp_path / "stock.pte", lean=False)
    assert not any(patches.FIRED.values())  # export.lean_lowering=false: the stock flow
    assert stock == lean
    assert fired == EVERY_PATCH  # each patch fired on this shape


def test_the_off_switch_applies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.export import ExportedProgram

    stock = ExportedProgram.run_decompositions
    monkeypatch.setenv(patches.OFF_SWITCH, "0")
    with patches.lean_lowering(True) as after:
        assert ExportedProgram.run_decompositions is stock
    patches.FIRED.clear()
    after()
    assert not any(patches.FIRED.values())
    monkeypatch.delenv(patches.OFF_SWITCH)
    with patches.lean_lowering(True):
        assert ExportedProgram.run_decompositions is not stock


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_an_unverified_version_takes_the_stock_path_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    from backends.xnnpack.patches import lean_passes, shared_weights

    # a handler on the exporter logger itself: earlier CLI runs in this process may have changed
    # its propagation and handlers, which made caplog see one warning twice
    records = _Records()
    logger = logging.getLogger("exporter")
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, records])  # restored after the test
    monkeypatch.setattr(guard, "_warned", set())
    monkeypatch.setattr(lean_passes, "VERIFIED_ON", {**lean_passes.VERIFIED_ON, "executorch": "9.9.9"})
    stock = preprocess.XNNPACKPassManager
    for _ in range(2):  # two lowerings in one process: one warning
        with patches.lean_lowering(True):
            assert preprocess.XNNPACKPassManager is stock  # this one stays out
            assert "copy_exported_program_for_preprocess" in vars(preprocess.XnnpackBackend)  # others apply
    warnings = records.messages
    assert len(warnings) == 1 and "lean_passes" in warnings[0] and "9.9.9" in warnings[0]
    assert shared_weights.NAME not in warnings[0]


def test_a_pass_stays_when_its_ops_are_there() -> None:
    assert not needed("Conv1dUnsqueezePass", {"aten.linear.default", "aten.mul.Tensor"})
    assert needed("Conv1dUnsqueezePass", {"aten.convolution.default"})
    assert needed("ConvertToSDPAPass", {"aten._softmax.default"})
    assert needed("RemoveRedundantCopyPass", set())  # not listed: always runs
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    stock = {p.__name__ for p in XNNPACKPassManager(None).passes}  # type: ignore[arg-type]
    assert set(ONLY_WITH_OPS) <= stock  # a renamed pass upstream would otherwise go unnoticed


def _tiny_program(checkpoint: Path) -> Any:
    recipe = load_recipe("android-arm64", ("export.max_seq_len=64",))
    return export_program(prepare_module(recipe, load_model(open_checkpoint(checkpoint), 64)), 64)


def test_partition_copies_share_weights_not_graphs(tiny_checkpoint: Path) -> None:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from backends.xnnpack.patches import shared_weights

    program = _tiny_program(tiny_checkpoint)
    with shared_weights.apply():
        copied = XnnpackBackend.copy_exported_program_for_preprocess(program, [])
    stock = XnnpackBackend.copy_exported_program_for_preprocess(program, [])  # restored on exit
    assert copied.graph_module is not program.graph_module
    assert copied.state_dict is not program.state_dict
    names = list(program.state_dict)
    assert names and all(copied.state_dict[n] is program.state_dict[n] for n in names)
    assert all(stock.state_dict[n] is not program.state_dict[n] for n in names)


def test_compact_dependencies_hold_the_same_nodes(tiny_checkpoint: Path) -> None:
    from executorch.exir.backend.canonical_partitioners import group_partitioner
    from torch.fx.passes.infra import partitioner

    from backends.xnnpack.patches import compact_dependencies

    gm = _tiny_program(tiny_checkpoint).graph_module
    stock_viewer, group_viewer = partitioner._DependencyViewer, group_partitioner._DependencyViewer
    stock, grouped, compact = stock_viewer(gm), group_viewer(gm), CompactDependencyViewer(gm)
    nodes = list(gm.graph.nodes)
    assert any(stock.downstreams_of(n) for n in nodes)
    for n in nodes:
        got, up = compact.downstreams_of(n), compact.upstreams_of(n)
        assert len(got) == len(set(got)) and set(got) == stock.downstreams_of(n)
        assert len(up) == len(set(up)) and set(up) == grouped.upstreams_of(n)
    # XNNPACK's partitioner builds ExecuTorch's viewer on top of torch's: both are replaced.
    with compact_dependencies.apply():
        assert partitioner._DependencyViewer is CompactDependencyViewer
        assert group_partitioner._DependencyViewer is CompactDependencyViewer
    assert group_partitioner._DependencyViewer is group_viewer


def test_forgetting_restores_nothing_and_clears_the_cache(tiny_checkpoint: Path) -> None:
    from executorch.exir.backend.utils import is_same_node

    from backends.xnnpack.patches import forget_graphs

    gm = _tiny_program(tiny_checkpoint).graph_module
    node = next(iter(gm.graph.nodes))
    is_same_node(node, node)
    assert is_same_node.cache_info().currsize > 0
    with forget_graphs.apply():
        pass
    assert is_same_node.cache_info().currsize == 0


def test_the_recipe_key_reaches_the_manifest_record() -> None:
    on, off = load_recipe("android-arm64"), load_recipe("android-arm64", ("export.lean_lowering=false",))
    assert on.to_dict()["export"]["lean_lowering"] is True
    assert off.to_dict()["export"]["lean_lowering"] is False
    with pytest.raises(RecipeError, match=r"export\.lean_lowering"):
        load_recipe("android-arm64", ("export.lean_lowering=3",))


def test_a_decomposition_round_is_skipped_only_when_it_has_nothing_to_do() -> None:
    from torch.export import export

    from backends.xnnpack.patches.skip_idle_decompositions import idle

    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(x) + x.shape[1]

    x = torch.randn(2, 3)
    program = export(Net(), (x,), dynamic_shapes=({1: torch.export.Dim("n")},))
    silu = torch.ops.aten.silu.default
    sym_size = torch.ops.aten.sym_size.int
    table = {silu: lambda t: t * torch.sigmoid(t), sym_size: lambda t, d: t.shape[d]}
    assert not idle(program, {})  # the functionalizing round always runs
    assert not idle(program, table)  # silu has a decomposition to apply
    decomposed = program.run_decompositions(table)
    assert idle(decomposed, table)  # what is left decomposes to itself (sym_size) or not at all
    # silu's own kernel and x * sigmoid(x) may round the last bit differently
    torch.testing.assert_close(decomposed.module()(x), Net()(x))

    class Mutating(torch.nn.Module):
        count: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            return x + self.count

    assert not idle(export(Mutating(), (x,)), table)  # not functional yet


def test_idle_edge_passes_return_the_graph_and_are_restored() -> None:
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass

    from backends.xnnpack.patches import skip_idle_edge_passes

    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))  # no aten.t in it
    stock = NormalizeTransposePass.__call__
    with skip_idle_edge_passes.apply():
        assert NormalizeTransposePass.__call__ is not stock
        result = NormalizeTransposePass()(gm)
        assert result.graph_module is gm and not result.modified
    assert NormalizeTransposePass.__call__ is stock
