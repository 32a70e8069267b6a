"""The generated flow x correction table and the score-centering sentence (suite/experiments/grid_tables.py) on
planted grids: the spread over seeds is shown, and a separation is claimed only where the exact test gives it."""

from __future__ import annotations

import json

from suite.experiments import grid_tables


def _run(root, algo, prec, seed, final, verdict):
    d = root / f"arith3__{algo}__{prec}__s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"config": {"algorithm": algo, "precision": prec, "seed": seed}}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": final}) + "\n")
    (d / "summary.json").write_text(json.dumps({"schema_version": 1, "run": d.name, "task": "arith3", "algorithm": algo,
                                                "precision": prec, "seed": seed, "verdict": verdict,
                                                "accuracy/final": final}))


def _grids(tmp_path, monkeypatch):
    monkeypatch.setattr(grid_tables, "REFERENCE_ROOT", tmp_path)
    main, centred = tmp_path / "c" / "fp4", tmp_path / "c" / "fp4-centering"
    for s, (plain, tis, cen) in enumerate([(0.50, 0.80, 0.96), (0.60, 0.97, 0.97), (0.70, 0.90, 0.95)]):
        _run(main, "grpo", "bf16_nvfp4rollout", s, plain, "collapse" if plain < 0.6 else "unstable")
        _run(main, "grpo_token_tis", "bf16_nvfp4rollout", s, tis, "pass" if tis > 0.95 else "unstable")
        _run(centred, "grpo", "bf16_nvfp4rollout", s, cen, "pass")
        # a flow where centering is higher on average but overlaps plain GRPO: not separated
        _run(main, "grpo", "bf16", s, [0.95, 0.97, 0.93][s], "pass")
        _run(centred, "grpo", "bf16", s, [0.96, 0.94, 0.97][s], "pass")


def test_the_matrix_shows_the_spread_and_the_verdict_counts_of_each_cell(tmp_path, monkeypatch):
    _grids(tmp_path, monkeypatch)
    table = grid_tables.f_matrix("c/fp4", "c/fp4-centering", "centering").splitlines()
    assert table[0] == "| flow | grpo | grpo_token_tis | centering |"
    assert "| bf16_nvfp4rollout | 0.600 [0.500, 0.700]; 0/3 pass, 1 collapse, 2 unstable | " \
           "0.890 [0.800, 0.970]; 1/3 pass, 2 unstable | 0.960 [0.950, 0.970]; 3/3 pass |" in table


def test_centering_is_called_separated_only_where_every_split_says_so(tmp_path, monkeypatch):
    _grids(tmp_path, monkeypatch)
    text = grid_tables.f_centering("c/fp4", "c/fp4-centering")
    # nvfp4: all three centred finals above all three plain ones, p = 1/20 = 0.05; bf16: 0.957 vs 0.950, overlapping
    assert "above plain grpo's in 2 of 2 flows (bf16, bf16_nvfp4rollout)" in text
    assert "separates it (p <= 0.05; the smallest p 3 against 3 seeds can give is 0.05) in bf16_nvfp4rollout." in text
    # against token TIS the samples overlap (0.97 > 0.95): not separated
    assert "Against each IS correction it is separated in: grpo_token_tis none." in text
