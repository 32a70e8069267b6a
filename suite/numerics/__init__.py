"""Stage 1, numerics: how a number is computed on each side of the RL loop.

The precision flows (precision.py) and FP8 GEMMs (fp8.py), the machine class that decides which kernels run
(machine.py), the samplers (engine.py, vllm_engine.py) and the embedded policy they sample from (policy.py,
models.py), the training-inference mismatch metrics (mismatch.py) and the FLOP count (flops.py).
Imports only the top level (suite.names) and itself.
"""
