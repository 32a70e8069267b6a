"""Stage 2, tasks and rewards: the task path and the embedded arith tasks (registry.py; the task
files are in the top-level tasks/ folder or the user's own, checked by spec.py), one prompt with its
ground truth (item.py), the dataset-backed math tasks (hub_tasks.py), their reward (math_reward.py)
and the documents of the embedded lm-eval transfer tasks (lm_eval_docs.py).
"""
