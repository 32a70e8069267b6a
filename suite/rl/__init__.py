"""Stage 3, one RL run. step.py is the RL step, read top to bottom (sample, reward, advantage,
trainer log-probs, mismatch, loss, updates, sync, log), and train.py the run around it (set-up, the
steps, teardown), over: the config (schema.py fields, tiers and regimes; compose.py turns key=value
overrides into a config, config.py layers and validates it; recipe.py the recipe's knobs;
provenance.py the command that reruns a run), the data (data.py: the base policy of policy.py or
models.py and the perfectible set of perfectible.py), the algorithm table (algos.py), checkpoints
(checkpoint.py), trackers (loggers.py) and evaluation after the run (evaluate.py, lm-eval's calls in
lm_eval_harness.py, the transfer index of transfer.py). env_record.py writes each run's env.json.
"""
