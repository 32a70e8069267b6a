"""Stage 1, numerics: how a token probability is computed on each side of the RL loop.

The precision flows, resolved from one config field (precision.py), FP8 GEMMs (fp8.py) on the E4M3
format and its round trip (e4m3.py), the machine class that decides which kernels run (machine.py),
the samplers (engine.py, vllm_engine.py; vllm_support.py what engine=vllm can run here) and how they
draw tokens (sampling.py), the trainer with its master weights, autocast and loss scaling
(trainer.py, loss_scaling.py), the training-inference mismatch metrics (mismatch.py) and the FLOP
count (flops.py). Imports only the shared modules.
"""
