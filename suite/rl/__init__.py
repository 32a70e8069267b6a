"""Stage 3, the RL loop: train.py reads top to bottom (sample, reward, advantage, trainer log-probs, mismatch,
loss, step, log) over the algorithm table (algos.py), the trainer (trainer.py), checkpoints (checkpoint.py),
data parallelism (dist.py), the bundle writer for outside loops (bundle.py) and the trackers (loggers.py).
"""
