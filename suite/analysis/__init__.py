"""Stage 5, analysis: pure functions of result files. The result schema (results.py), statistics (stats.py),
provenance (provenance.py), the report (runs.py loads, report.py assembles, render.py renders, figures.py
plots), the collapse search (collapse.py), reproduction against the reference (reproduce.py), the transfer
index (transfer.py) and the static leaderboard (leaderboard.py, site/).
"""
