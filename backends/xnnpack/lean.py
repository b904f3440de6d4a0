"""Lowering to XNNPACK without the work that changes nothing in its output.

**Decompositions.** ``to_edge_transform_and_lower`` retraces the whole program three times with
``run_decompositions`` (functionalize; decompose all but what XNNPACK keeps; decompose again after
XNNPACK has vetted the kept ops). On our graph the third finds nothing to rewrite but
``aten.sym_size.int``, whose decomposition traces back to itself, and costs 6 s of pycode-4m's
36 s of lowering (18 s on the 1B shape). ``skip_idle_decompositions`` returns a functional program
unchanged when no op of it but those has a decomposition in the table.

**Edge passes.** Turning the program into the edge dialect runs ExecuTorch's own passes over the
whole graph, each a full retrace. Three of them rewrite single ops that our graphs do not have by
then: ``aten.t`` (``NormalizeTransposePass``), view ops (``ReplaceBrokenOpsWithFunctionalOpsPass``,
after the view-to-copy pass), ops that take a memory format (``MemoryFormatOpsPass``).
``skip_idle_edge_passes`` returns the graph as it is when none of their ops is in it (0.85 s each
on pycode-4m, 0.2 s a layer).

**Passes.** XNNPACK's ``preprocess`` runs 17 graph passes on every partition, and each retraces the whole
partition with fake tensors whether or not it finds anything to rewrite. On a decoder, ten of them
look for ops it never has (convolution, batch norm, PReLU, bilinear upsampling, the decomposed aten
SDPA pattern, relu/hardtanh to fuse, concatenation, max pooling, matmuls that are not yet linear).
On pycode-4m the first six took 13 of the 26 s spent in XNNPACK passes and the other four 0.8 s
each; lowering as a whole, with the decomposition and copy shortcuts below: 38.9 -> 23.1 s.

A pass is dropped for a partition only when none of the ops it rewrites occurs there, so the
delegate blob is the one the stock pass list makes; ``tests/backends/test_xnnpack.py`` checks that the two
``.pte`` files are byte-identical. ExecuTorch picks the pass list inside ``preprocess`` with no
option for it, hence the scoped substitution of its pass manager below (stack pinned in
pyproject.toml).

**Copies.** Before ``preprocess``, ExecuTorch deep-copies every partition's program, weights
included, all partitions at once ("in case backends change graph inside preprocess"): on a 1B model
a second 1.3 GB of int8 codes, which made half of the lowering stage's peak. ExecuTorch leaves the
copy to the backend (``BackendDetails.copy_exported_program_for_preprocess``); ours still copies
each graph and its containers, but hands the same weight tensors to the copy. XNNPACK's passes
replace constants rather than write into them, and the byte-identical test above covers this too.

**Dependency sets.** XNNPACK's partitioner (ExecuTorch's ``GroupBasedPartitioner``, built on
torch.fx's ``CapabilityBasedPartitioner``) first records, for every node, the set of all nodes
downstream of it, twice over (torch's viewer, then ExecuTorch's, which adds the upstream sets):
N^2 / 2 set entries each, a transient 0.6 GB on the 3,600 nodes of a 30-layer model, the peak of
its build. They are only ever iterated, so ``compact_dependencies`` keeps each one as a tuple
(8 bytes an entry), and upstream sets only if asked for.

**Leaks.** Module-level state in ExecuTorch keeps graph nodes once lowering is done: XNNPACK's
partitioner configs log rejections through ``WhyNoPartition`` objects that keep the last rejected
node, and ``is_same_node`` (the partitioner's graph check) has an unbounded ``lru_cache`` keyed by
nodes. A node holds its graph, hence the whole lowered program with its delegate blobs, until the
process ends; and torch's class-level fake-tensor dispatch cache keeps the outputs of the ops that
lowering constant-folded (the packed embedding among them). ``forget_graphs`` lets them go: on a
2-layer model of the 1B shape, 1.57 -> 1.23 GB resident after lowering.

**Guard.** Each substitution reaches into ExecuTorch or torch internals, so all of them are applied
only on the versions they were verified on (``VERIFIED_ON``); elsewhere, or with
``EXPORTER_LEAN_LOWERING=0``, lowering runs the stock flow (slower, same program). ``FIRED`` counts
each time a substitution changed what the library would have done, so a test can show every one of
them fired.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from importlib import metadata
from typing import Any

# The versions every substitution below was checked against (byte-identical .pte, memory, time).
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}
OFF_SWITCH = "EXPORTER_LEAN_LOWERING"
# substitution name -> times it changed what the library would have done (for tests and debugging)
FIRED: Counter[str] = Counter()


def enabled() -> bool:
    """The substitutions apply only on the verified versions, and unless switched off."""
    if os.environ.get(OFF_SWITCH, "1") == "0":
        return False
    installed = {dist: metadata.version(dist).split("+")[0] for dist in VERIFIED_ON}
    if installed != VERIFIED_ON:
        logging.getLogger("exporter").info(
            "[lower] lean lowering verified on %s, found %s: stock lowering", VERIFIED_ON, installed
        )
        return False
    return True


# Pass name -> substrings of the op names it rewrites (edge dialect, e.g. "aten.convolution.default").
ONLY_WITH_OPS: dict[str, tuple[str, ...]] = {
    "ConvertToUpsampleBilinear2d": ("upsample", "index"),
    "ConvertToSDPAPass": ("softmax", "bmm", "scaled_dot_product"),
    "FuseBatchNormPass": ("batch_norm",),
    "DecomposeBatchNorm": ("batch_norm",),
    "Conv1dUnsqueezePass": ("convolution",),
    "PReLUReshapePass": ("prelu",),
    "FuseActivationPass": ("relu", "hardtanh"),
    "DecomposeConcatenate": ("aten.cat",),
    "RemoveGetItemPass": ("max_pool2d_with_indices", "max.dim"),
    "ConvertToLinearPass": ("mm",),  # aten.mm, addmm, bmm
}


def op_names(program: Any) -> set[str]:
    """Names of the ops called in ``program``'s graph."""
    return {
        str(getattr(n.target, "__name__", n.target))
        for n in program.graph_module.graph.nodes
        if n.op == "call_function"
    }


def needed(pass_name: str, ops: set[str]) -> bool:
    patterns = ONLY_WITH_OPS.get(pass_name)
    return patterns is None or any(p in op for op in ops for p in patterns)


@contextmanager
def lean_passes() -> Iterator[None]:
    """While active, XNNPACK's ``preprocess`` runs only the passes that can fire on each partition."""
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    stock = preprocess.XNNPACKPassManager

    class LeanPassManager(stock):  # type: ignore[misc, valid-type]
        def __init__(self, exported_program: Any, passes: list[Any] | None = None) -> None:
            super().__init__(exported_program, passes)
            if not passes:  # the stock list; an explicit one is left as asked
                ops = op_names(exported_program)
                stock_list: list[Any] = vars(self)["passes"]
                self.passes = [p for p in stock_list if needed(p.__name__, ops)]
                FIRED["lean_passes"] += len(stock_list) - len(self.passes)

    preprocess.XNNPACKPassManager = LeanPassManager
    try:
        yield
    finally:
        preprocess.XNNPACKPassManager = stock


@contextmanager
def shared_weights() -> Iterator[None]:
    """While active, each partition's program is deep-copied for ``preprocess`` except its weights
    and constants (tensors, and the few script objects ``constants`` may hold), which are shared."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    own = "copy_exported_program_for_preprocess" in vars(XnnpackBackend)
    stock = vars(XnnpackBackend).get("copy_exported_program_for_preprocess")

    def copy_sharing_weights(cls: type, program: Any, compile_specs: list[Any]) -> Any:
        tensors = [*program.state_dict.values(), *program.constants.values()]
        FIRED["shared_weights"] += 1
        return copy.deepcopy(program, {id(t): t for t in tensors})

    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(copy_sharing_weights)
    try:
        yield
    finally:
        if own:
            XnnpackBackend.copy_exported_program_for_preprocess = stock
        else:
            del XnnpackBackend.copy_exported_program_for_preprocess


# Ops whose decomposition retraces to the op itself: their presence alone is no reason to retrace.
SELF_DECOMPOSING = ("aten.sym_size.int",)


def idle(program: Any, table: dict[Any, Any] | None) -> bool:
    """Whether ``run_decompositions(table)`` would give ``program`` back as it is: the graph is
    already functional (no op mutates its inputs) and no op in it has a decomposition to apply."""
    import torch

    if not table:
        return False  # the functionalizing call
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            return False
        if target in table and str(target) not in SELF_DECOMPOSING:
            return False
    return True


@contextmanager
def skip_idle_decompositions() -> Iterator[None]:
    """While active, ``run_decompositions`` returns an ``idle`` program unchanged."""
    from torch.export import ExportedProgram

    stock = ExportedProgram.run_decompositions

    def run_decompositions(self: Any, decomp_table: Any = None, *args: Any, **kwargs: Any) -> Any:
        if idle(self, decomp_table):
            FIRED["skip_idle_decompositions"] += 1
            return self
        return stock(self, decomp_table, *args, **kwargs)

    ExportedProgram.run_decompositions = run_decompositions  # type: ignore[method-assign]
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = stock  # type: ignore[method-assign]


class CompactDependencyViewer:
    """The partitioners' ``_DependencyViewer`` with each node's transitive users (and, on demand,
    inputs) in a tuple, not a set."""

    def __init__(self, graph_module: Any) -> None:
        FIRED["compact_dependencies"] += 1
        self.graph_module = graph_module
        self.downstreams: dict[Any, tuple[Any, ...]] = {}
        self._upstreams: dict[Any, tuple[Any, ...]] | None = None
        for node in reversed(graph_module.graph.nodes):
            down: set[Any] = set()
            for user in node.users:  # users come later in the graph: already recorded
                down.add(user)
                down.update(self.downstreams[user])
            self.downstreams[node] = tuple(down)

    def downstreams_of(self, node: Any) -> tuple[Any, ...]:
        return self.downstreams.get(node, ())

    def upstreams_of(self, node: Any) -> tuple[Any, ...]:
        if self._upstreams is None:  # ExecuTorch builds these but never reads them
            self._upstreams = {}
            for n in self.graph_module.graph.nodes:
                up: set[Any] = set()
                for i in n.all_input_nodes:  # inputs come earlier: already recorded
                    up.add(i)
                    up.update(self._upstreams[i])
                self._upstreams[n] = tuple(up)
        return self._upstreams.get(node, ())


@contextmanager
def compact_dependencies() -> Iterator[None]:
    import executorch.exir.backend.canonical_partitioners.group_partitioner as grouped
    import torch.fx.passes.infra.partitioner as capability

    modules: tuple[Any, ...] = (capability, grouped)
    stock = [m._DependencyViewer for m in modules]
    for m in modules:
        m._DependencyViewer = CompactDependencyViewer
    try:
        yield
    finally:
        for m, viewer in zip(modules, stock, strict=True):
            m._DependencyViewer = viewer


def _edge_pass_triggers() -> dict[type, Callable[[Any], bool]]:
    """Edge pass -> whether a node is one its ``call_operator`` rewrites (else it copies it)."""
    import torch
    from executorch.exir.passes.dim_order_ops_registry import DimOrderOpsMap
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )

    return {
        NormalizeTransposePass: lambda t: t == torch.ops.aten.t.default,
        ReplaceBrokenOpsWithFunctionalOpsPass: lambda t: bool(getattr(t, "is_view", False)),
        MemoryFormatOpsPass: lambda t: t in DimOrderOpsMap,
    }


@contextmanager
def skip_idle_edge_passes() -> Iterator[None]:
    """While active, the passes above hand back a graph that has none of their ops unchanged."""
    from torch.fx import GraphModule
    from torch.fx.passes.infra.pass_base import PassResult

    patched: list[tuple[type, Any]] = []
    for cls, fires_on in _edge_pass_triggers().items():
        stock = cls.__call__

        def call(self: Any, gm: Any, stock: Any = stock, fires_on: Any = fires_on) -> Any:
            nested = any(isinstance(m, GraphModule) for m in gm.children())  # control flow: look inside
            if nested or any(n.op == "call_function" and fires_on(n.target) for n in gm.graph.nodes):
                return stock(self, gm)
            FIRED["skip_idle_edge_passes"] += 1
            return PassResult(gm, False)

        patched.append((cls, stock))
        cls.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, stock in patched:
            cls.__call__ = stock  # type: ignore[method-assign]


@contextmanager
def lean_lowering() -> Iterator[None]:
    """The substitutions above (``forget_graphs`` goes after the program is written); none of them
    where ``enabled()`` says no."""
    if not enabled():
        yield
        return
    with ExitStack() as stack:
        stack.enter_context(skip_idle_decompositions())
        stack.enter_context(skip_idle_edge_passes())
        stack.enter_context(lean_passes())
        stack.enter_context(shared_weights())
        stack.enter_context(compact_dependencies())
        stack.callback(forget_graphs)  # on failure too; ``lower`` calls it again after serializing
        yield


def forget_graphs() -> None:
    """Drop the nodes ExecuTorch's module-level state still holds after lowering."""
    if not enabled():
        return
    FIRED["forget_graphs"] += 1
    from executorch.exir.backend.utils import WhyNoPartition, is_same_node
    from torch._subclasses.fake_tensor import FakeTensorMode

    is_same_node.cache_clear()
    FakeTensorMode.cache.clear()
    for name, module in list(sys.modules.items()):
        if name.startswith("executorch.backends.xnnpack") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, WhyNoPartition):
                    value.node = None
