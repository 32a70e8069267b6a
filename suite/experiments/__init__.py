"""Stage 5, experiments: many runs and what drives them. The named grids (grids.py), sweeps and
their launchers (cells.py expands a grid into run configs; sweep.py, local_launcher.py,
submitit_jobs.py), benchmarks (bench.py, bench_memory.py, bench_trl.py), the TRL and verl bridges
(trl_bridge.py, verl_import.py) and the figures the documents quote from the committed results and
the grids (docfigures.py). A sweep ends in an analysis report, so this stage sits above analysis.
"""
