"""Small plumbing every room may use: ``progress`` (stage lines and bars), ``memory`` (RSS and
available memory), ``threads`` (fixed torch thread counts), ``hashing`` (streamed sha256),
``native_logs`` (ExecuTorch's C++ logging kept off the terminal).

May import ``exporter.errors`` only.
"""
