"""Stage 4, experiments: grids of runs and what drives them: the named grids (grids.py), sweeps and their
launchers (sweep.py, local_launcher.py, submitit_jobs.py), benchmarks (bench*.py), the held-out and transfer
evaluation (evaluate.py), the TRL and verl bridges (trl_bridge.py, verl_import.py) and fingerprint.py.
"""
