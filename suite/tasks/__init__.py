"""Stage 2, tasks and rewards: the task registry and the embedded arith tasks (registry.py, task files in
task_files/), one prompt with its ground truth (item.py), the dataset-backed math tasks (hub_tasks.py),
their reward (math_reward.py) and the documents of the embedded lm-eval transfer tasks (lm_eval_docs.py).
"""
