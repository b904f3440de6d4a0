"""Development tools, outside the installed package: the peer race against ExecuTorch's export_llm
(``peer``), the ARM64 execution check (``arm64``), the real-model fetcher (``real_model``), the
shipped texts' generator (``texts``) and the trainer of the shipped model (``train_default``).

Run from the repository root (``python -m tools.peer ...``; the Makefile does). They may import
anything of ``exporter`` and ``backends``; nothing there imports them.
"""
