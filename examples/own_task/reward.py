"""The reward function of my_letters (reward.function: reward.py:compute_score in my_letters.yaml).

verl's custom-reward signature: the suite calls it with the row's data_source, the response text, the row's
reward_model.ground_truth (a string) and its extra_info; a truncated response scores 0 without a call.
"""

import re


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 iff the last 'Answer: N' line of the response gives the ground truth count."""
    found = re.findall(r"^Answer:\s*(-?\d+)\s*$", solution_str, flags=re.M)
    return 1.0 if found and found[-1] == ground_truth.strip() else 0.0
