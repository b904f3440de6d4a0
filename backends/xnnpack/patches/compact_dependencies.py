"""The partitioners' transitive-dependency sets kept as tuples, and upstream sets only if asked for.

XNNPACK's partitioner (ExecuTorch's ``GroupBasedPartitioner``, built on torch.fx's
``CapabilityBasedPartitioner``) first records, for every node, the set of all nodes downstream of
it, twice over (torch's viewer, then ExecuTorch's, which adds the upstream sets): N^2 / 2 set
entries each, a transient 0.6 GB on the 3,600 nodes of a 30-layer model, the peak of its build.
They are only ever iterated, so each is kept as a tuple (8 bytes an entry).

Upstream: ``_DependencyViewer`` in ``torch/fx/passes/infra/partitioner.py`` and in
``executorch/exir/backend/canonical_partitioners/group_partitioner.py``; pytorch/pytorch#136608
("Remove unnecessary upstream nodes in dependency viewer", O(N^2), closed unmerged) is the same
cost seen from the time side.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .guard import FIRED

NAME = "compact_dependencies"
VERIFIED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}


class CompactDependencyViewer:
    """The partitioners' ``_DependencyViewer`` with each node's transitive users (and, on demand,
    inputs) in a tuple, not a set."""

    def __init__(self, graph_module: Any) -> None:
        FIRED[NAME] += 1
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
def apply() -> Iterator[None]:
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
