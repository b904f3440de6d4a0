"""``to_edge_transform_and_lower`` with the XNNPACK partitioner, then ``to_executorch`` -> ``.pte``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch.export import ExportedProgram

from exporter.plumbing.memory import release_memory

from .. import Lowered, Stepper
from .partition_progress import partition_progress
from .patches import lean_lowering as lean_patches

log = logging.getLogger("exporter")


class XnnpackBackend:
    name = "xnnpack"
    suffix = ".pte"

    def lower(
        self, program: ExportedProgram, metadata: dict[str, Any], out: Path, *, lean_lowering: bool = True
    ) -> Lowered:
        """``metadata`` becomes the program's constant methods (``get_max_seq_len``, ...);
        ``lean_lowering`` applies the verified shortcuts of ``patches`` (same program, less time)."""
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import (
            EdgeCompileConfig,
            ExecutorchBackendConfig,
            to_edge_transform_and_lower,
        )
        from executorch.exir.passes import MemoryPlanningPass

        # The phases around XNNPACK's per-partition preprocess take as long again on a real model;
        # name them so a user sees which one runs.
        log.info("[lower] edge dialect and XNNPACK partitioning ...")
        with lean_patches(lean_lowering) as forget_graphs, partition_progress():
            edge = to_edge_transform_and_lower(
                program,
                partitioner=[XnnpackPartitioner()],
                # Our custom SDPA / cache ops are not core ATen; the IR check would reject them.
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
                constant_methods=metadata,
            )
        del program  # the caller's only reference: the graph goes (the gate's eager module keeps the weights)
        release_memory()  # the decompositions' retraced graphs, before serialization needs the room
        info = get_delegation_info(edge.exported_program().graph_module)
        log.info("[lower] memory planning and serialization ...")
        try:
            et = edge.to_executorch(
                ExecutorchBackendConfig(
                    extract_delegate_segments=True,
                    # Folds torchao's dequantize_affine on the embedding into
                    # quantized_decomposed::embedding_{4,8}bit, which has an out variant.
                    do_quant_fusion_and_const_prop=True,
                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                )
            )
            del edge
        finally:
            forget_graphs()  # else module-level state in ExecuTorch keeps this program alive after we return
        with open(out, "wb") as f:
            et.write_to_file(f)  # streams the segments; ``et.buffer`` would join them in memory first
        plan = next(p for p in et.executorch_program.execution_plan if p.name == "forward")
        operators = sorted({f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators})
        delegated = info.num_delegated_nodes
        total = delegated + info.num_non_delegated_nodes
        return Lowered(
            out,
            {
                "format": "executorch-pte",
                "delegates": sorted({d.id for d in plan.delegates}),
                "delegate_partitions": info.num_delegated_subgraphs,
                "delegated_node_share": round(delegated / total, 4) if total else 0.0,
                "operators_outside_delegate": operators,
                "methods": sorted(p.name for p in et.executorch_program.execution_plan),
                # Memory-planned buffers: activations and the mutable KV cache.
                "planned_memory_bytes": int(sum(plan.non_const_buffer_sizes)),
                # torchao keeps int4 codes unpacked in int8 before lowering; XNNPACK packs them
                # into the delegate blob, so the weights are (almost all of) the file.
                "weight_bytes": out.stat().st_size,
            },
        )

    def load(self, path: Path) -> Stepper:
        from .runtime import load_pte

        return load_pte(path)


BACKEND = XnnpackBackend()
