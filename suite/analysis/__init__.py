"""Stage 4, analysis: functions of result files. Runs read back (runs.py), the report (report.py
assembles, outcomes.py the outcome tables, render.py renders, pages.py writes the pages, figures.py
plots, stats.py the statistics), the collapse search (collapse.py), reproduction against the
committed reference (reproduce.py, reference.py, fingerprint.py), the bundle of outside loops
(bundle.py), the static leaderboard (leaderboard.py, run_labels.py, site/) and the hypothesis grids'
report (hypotheses.py, hypothesis_tables.py); commands.py holds the `suite` commands that read
result folders.
"""
