"""Low-precision RL sanity tests: does an RL recipe stay stable in BF16, FP16, FP8 or FP32?

The package follows the pipeline, one subpackage per stage, each importing only the stages before it
(scripts/import_graph.py checks it, and that no import circle exists):

    numerics how each side of the loop computes: precision flows, FP8, the samplers, the trainer,
    mismatch tasks what is asked and how it is graded: task registry and files, dataset tasks, math
    reward rl one run: config, data, the step (rl/step.py), the run (rl/train.py), algorithms,
    checkpoints analysis what result files say: report, figures, collapse search, reproduction,
    bundles, leaderboard experiments many runs: named grids, sweeps and launchers, benchmarks, the
    TRL and verl bridges

Shared by every stage: names.py (choices and suggestions), console.py, results.py (the result files,
written atomically), dist.py (the torch.distributed world) and lifetime.py (no process outlives its
parent). cli.py is the ``suite`` command over all of them.
"""
