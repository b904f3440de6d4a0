"""XNNPACK lowering on tiny seeded models: what stays outside the delegate, and runtime == eager."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from backends import get_backend
from exporter.build.pipeline import export_program, prepare_module
from exporter.gate.steppers import eager_stepper, follow, greedy
from exporter.gate.validate import top2_margin
from exporter.model.checkpoint import load_model, open_checkpoint
from exporter.model.head import SplitHead
from exporter.model.transformer import Transformer
from exporter.model.transforms import for_export
from exporter.plumbing.native_logs import native_logs_captured
from exporter.quant.configs import quantize_model
from exporter.quant.stream import DTYPES
from exporter.recipe import Recipe, load_recipe

# Everything else (every matmul in particular) must run inside the XNNPACK delegate.
ALLOWED_OUTSIDE = {
    "aten::_local_scalar_dense",  # input_pos[0].item()
    "aten::embedding.out",  # fp32 embedding (reference recipe)
    "aten::sym_size.int",
    "aten::select_copy.int_out",
    "aten::slice_copy.Tensor_out",
    "aten::unsqueeze_copy.out",
    "executorch_prim::add.Scalar",
    "executorch_prim::et_view.default",
    "llama::custom_sdpa.out",
    "llama::update_cache.out",
    "quantized_decomposed::embedding_4bit.out",
}


SPLIT = "android-arm64, split head"
# a split head's logits are put back in vocabulary order by one gather of V entries per position
SPLIT_OUTSIDE = {"aten::index_select.out", "aten::cat.out"}


def split_head(recipe: Recipe, model: Transformer) -> torch.nn.Module:
    """The recipe's module with its head split as the escalation splits it: 300 scattered rows
    int8 per channel, the rest as the recipe quantizes them."""
    from exporter.model.head import linear_of, other_rows
    from exporter.quant.configs import quantize_linears
    from exporter.quant.escalate import rows_of
    from exporter.quant.gptq import INT8

    head = model.output.weight.detach().clone()
    model.to(DTYPES[recipe.export.dtype])
    quantize_model(model, recipe.quantization)
    rows = torch.randperm(head.shape[0], generator=torch.Generator().manual_seed(0))[:300]
    first = linear_of(head[rows])
    quantize_linears(first, INT8)
    rest = linear_of(rows_of(model.output.weight, other_rows(rows, head.shape[0])))
    model.output = SplitHead(first, rest, rows)  # type: ignore[assignment]
    return for_export(recipe, model)


@pytest.fixture(scope="module", params=["android-arm64", "reference-fp32", SPLIT])
def lowered(request: pytest.FixtureRequest, tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    recipe = load_recipe(request.param.split(",")[0], ("export.max_seq_len=64",))
    model = load_model(open_checkpoint(tiny_checkpoint), recipe.export.max_seq_len)
    module = prepare_module(recipe, model) if request.param != SPLIT else split_head(recipe, model)
    backend = get_backend("xnnpack")
    meta = {"get_max_seq_len": 64, "get_vocab_size": 4096, "use_kv_cache": True}
    out = tmp_path_factory.mktemp("pte") / "model.pte"
    result = backend.lower(export_program(module, 64), meta, out)
    return recipe, module, backend, result


def test_nothing_unexpected_outside_the_delegate(lowered) -> None:  # type: ignore[no-untyped-def]
    _, module, _, result = lowered
    ops = set(result.runtime["operators_outside_delegate"])
    assert result.runtime["delegates"] == ["XnnpackBackend"]
    split = any(isinstance(m, SplitHead) for m in module.modules())
    allowed = ALLOWED_OUTSIDE | (SPLIT_OUTSIDE if split else set())
    assert ops <= allowed, ops - allowed
    assert not any("linear" in op or "mm" in op for op in ops)


def test_lowering_leaves_no_graph_in_module_state(lowered) -> None:  # type: ignore[no-untyped-def]
    import sys

    from executorch.exir.backend.utils import WhyNoPartition, is_same_node

    assert is_same_node.cache_info().currsize == 0
    loggers = [
        v
        for name, m in list(sys.modules.items())
        if name.startswith("executorch.backends.xnnpack") and m is not None
        for v in vars(m).values()
        if isinstance(v, WhyNoPartition)
    ]
    assert loggers and all(w.node is None for w in loggers)


def test_constant_methods_are_in_the_program(lowered) -> None:  # type: ignore[no-untyped-def]
    _, _, _, result = lowered
    assert {"forward", "get_max_seq_len", "get_vocab_size", "use_kv_cache"} <= set(result.runtime["methods"])


def test_runtime_matches_eager(lowered) -> None:  # type: ignore[no-untyped-def]
    recipe, module, backend, result = lowered
    prompt = [0, 17, 99, 1024, 5]
    eager = greedy(eager_stepper(module), prompt, 32)
    with native_logs_captured():
        got = follow(backend.load(result.path), prompt, eager.tokens)
    tol = 1e-3 if recipe.quantization.linear is None else 0.1
    assert (got - eager.logits).abs().max().item() < tol
    # Within tol of eager everywhere, the argmax can differ only where eager's own top-2 margin is
    # below 2 * tol (random weights have such near-ties; XNNPACK's int8 activation rounding is not
    # torchao's to the last bit): anywhere else a differing token is a real divergence.
    flipped = (got.argmax(-1) != torch.tensor(eager.tokens)).nonzero().flatten()
    assert bool((top2_margin(eager.logits)[flipped] < 2 * tol).all()), flipped.tolist()
    assert len(flipped) <= 2


def test_dynamic_prompt_length(lowered) -> None:  # type: ignore[no-untyped-def]
    _, _, backend, result = lowered
    with native_logs_captured():
        step = backend.load(result.path)
        for length in (1, 9, 63):
            tokens = torch.arange(length)[None] % 4096
            logits = step(tokens, torch.tensor([0]))
            assert logits.shape == (1, 4096)


def test_partition_progress_ticks_each_partition_and_restores_preprocess(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from backends.xnnpack.partition_progress import partition_progress

    monkeypatch.setattr(logging.getLogger("exporter"), "propagate", True)
    caplog.set_level(logging.INFO, logger="exporter")
    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(lambda program, specs: program.upper()))
    stock = vars(XnnpackBackend)["preprocess"]
    assert "preprocess_multimethod" not in vars(XnnpackBackend)  # BackendDetails' loop
    with partition_progress():
        got = XnnpackBackend.preprocess_multimethod({"forward": ["a", "b", "c"]}, {"forward": [[], [], []]})
    assert got == {"forward": ["A", "B", "C"]}  # called through
    assert caplog.messages[-1].startswith("[lower] partition 3/3 (")
    assert vars(XnnpackBackend)["preprocess"] is stock
    assert "preprocess_multimethod" not in vars(XnnpackBackend)


def test_an_8da4w_linear_computes_what_its_eager_module_computes() -> None:
    """The gate compares the .pte with the eager quantized model, so they must be one model:
    XNNPACK stores group-wise scales as bf16, and the recipe's scales are chosen in bf16 so that
    cast is exact. With fp32 scales the difference was 2% of the int4 error in every linear."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from exporter.quant.configs import quantize_linears

    torch.manual_seed(0)
    fp32 = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False))
    quantized = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False))
    quantized.load_state_dict(fp32.state_dict())
    quantize_linears(quantized, load_recipe("android-arm64").quantization.linear)
    x = torch.randn(16, 256) * torch.linspace(0.1, 8, 256)  # uneven channels, like a real model's
    with torch.no_grad():
        eager, exact = quantized(x), fp32(x)
    program = to_edge_transform_and_lower(
        torch.export.export(quantized, (x,)), partitioner=[XnnpackPartitioner()]
    )
    with native_logs_captured():
        method = Runtime.get().load_program(program.to_executorch().buffer).load_method("forward")
        (out,) = method.execute([x])
    quantization_error = (eager - exact).pow(2).mean().sqrt()
    assert (out - eager).pow(2).mean().sqrt() < 1e-3 * quantization_error


@pytest.mark.parametrize("why", ["switched off", "another executorch"])
def test_partition_progress_stays_out_when_off_or_unverified(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from backends.xnnpack import partition_progress as patch

    if why == "switched off":
        monkeypatch.setenv(patch.OFF_SWITCH, "0")
    else:
        monkeypatch.setattr(patch, "VERIFIED_ON", "0.0.0")
    stock = vars(XnnpackBackend)["preprocess"]
    with patch.partition_progress():
        assert vars(XnnpackBackend)["preprocess"] is stock  # not wrapped
    assert patch.enabled() is False
