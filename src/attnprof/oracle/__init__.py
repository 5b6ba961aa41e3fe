"""The fp64 oracle's verdict on one output, below `run()`: how far it is (`agreement.py`: `Agreement`, `Reference`),
the effective softmax scale (`scale.py`), and the rule that judges it against plain PyTorch in the same dtype
(`gate.py`: `Gate`). `run()` judges every measured call with these; the verify jobs that drive them over cases and
models are `numerics/`, above `run()`.
"""
