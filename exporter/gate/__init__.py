"""The validation gate: ``inputs`` (the gate's prompts and texts from the recipe), ``steppers``
(greedy decoding and teacher-forced scoring against one calling convention), ``validate`` (artifact
vs eager vs fp32 figures and thresholds), ``generate`` (chat and completion with a built artifact).

May import artifact, backends, model, recipe and plumbing; never quant, build, measure or cli.
"""
