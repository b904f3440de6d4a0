"""Run built ``.pte`` artifacts on an aarch64 ExecuTorch under qemu-user and compare them with the
x86 run of the same file (``python -m tools.arm64 ARTIFACT_DIR... --out REPORT.json``)."""
