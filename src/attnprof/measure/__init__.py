"""The clocks and meters of one call, below `run()`: wall and device time with quantiles (`timing.py`) and the peak
memory above the inputs (`memory.py`). The jobs that sweep them over cells and machines are `bench/`, above `run()`.
"""
