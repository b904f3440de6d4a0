"""The model side: ``transformer`` (the one eager definition, static KV cache,
``forward(tokens, input_pos)``), ``args`` (architecture only, torch-free), ``checkpoint`` (Hugging
Face folder -> args + weights, memory-mapped), ``tokenizer`` and ``chat`` (encoding and chat
templates as transformers does them), ``transforms`` (source transforms for export targets).

May import recipe and plumbing only.
"""
