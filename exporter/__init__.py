"""exporter: Hugging Face Llama-family checkpoints -> ExecuTorch .pte / AOTInductor .pt2 artifacts."""

__version__ = "0.1.0"
