"""The generated flow x correction table and the score-centering sentence
(suite/experiments/grid_tables.py) on planted grids: the spread over seeds is shown, and a
separation is claimed only where the exact test gives it."""

from __future__ import annotations

import json

from suite.experiments import grid_tables


def _run(root, algo, prec, seed, final, verdict, k3=0.0, inject=None):
    d = root / f"arith3__{algo}__{prec}__s{seed}"
    d.mkdir(parents=True)
    cfg = {"algorithm": algo, "precision": prec, "seed": seed,
           **({"inject": inject} if inject else {})}
    (d / "config.json").write_text(json.dumps({"config": cfg}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": final}) + "\n")
    (d / "summary.json").write_text(json.dumps({"schema_version": 1, "run": d.name,
                                                "task": "arith3", "algorithm": algo,
                                                "precision": prec, "seed": seed, "verdict": verdict,
                                                "accuracy/final": final,
                                                "mismatch/step0/kl_k3": k3}))


def _grids(tmp_path, monkeypatch):
    monkeypatch.setattr(grid_tables, "REFERENCE_ROOT", tmp_path)
    main, centred = tmp_path / "c" / "fp4", tmp_path / "c" / "fp4-centering"
    for s, (plain, tis,
            cen) in enumerate([(0.50, 0.80, 0.96), (0.60, 0.97, 0.97), (0.70, 0.90, 0.95)]):
        _run(main, "grpo", "bf16_nvfp4rollout", s, plain, "collapse" if plain < 0.6 else "unstable")
        _run(main, "grpo_token_tis", "bf16_nvfp4rollout", s, tis, "pass" if tis > 0.95
             else "unstable")
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
    # nvfp4: all three centred finals above all three plain ones, p = 1/20 = 0.05; bf16: 0.957 vs
    # 0.950, overlapping
    assert "above plain grpo's in 2 of 2 flows (bf16, bf16_nvfp4rollout)" in text
    assert ("separates it (p <= 0.05; the smallest p 3 against 3 seeds can give is 0.05) "
            "in bf16_nvfp4rollout." in text)
    # against token TIS the samples overlap (0.97 > 0.95): not separated
    assert "Against each IS correction it is separated in: grpo_token_tis none." in text


def test_centering_against_the_mismatch_orders_flows_and_injected_arms_by_step0_k3(
    tmp_path, monkeypatch):
    """Where centering starts to pay: the flows (bf16 trainer) and the injected arms (fp32) in one
    order of their plain runs' step-0 k3, and the first separated setting named with its k3; an arm
    run one way only is left out."""
    monkeypatch.setattr(grid_tables, "REFERENCE_ROOT", tmp_path)
    flows, centred, dose, dose_c = (tmp_path / "c" / g for g in ("fp4", "fp4-c", "dose", "dose-c"))
    for s in range(3):
        _run(flows, "grpo", "bf16", s, [0.95, 0.97, 0.93][s], "pass", k3=7e-5)
        _run(centred, "grpo", "bf16", s, [0.96, 0.94, 0.97][s], "pass")
        _run(flows, "grpo", "bf16_nvfp4a4rollout", s, 0.6 + 0.1 * s, "collapse", k3=2e-2)
        _run(centred, "grpo", "bf16_nvfp4a4rollout", s, 0.93 + 0.01 * s, "at_line")
        for scale, k3, plain, cen in ((0.3, 1e-3, 0.90, 0.95), (3.0, 0.5, 0.1, 0.2)):
            arm = {"kind": "noise", "scale": scale}
            _run(dose / f"noise-{scale}", "grpo", "fp32", s, plain + 0.01 * s, "unstable", k3=k3,
                 inject=arm)
            _run(dose_c / f"noise-{scale}", "grpo", "fp32", s, cen - 0.01 * s, "pass", inject=arm)
        _run(dose / "lowp_bias-1.0", "grpo", "fp32", s, 0.5, "unstable", k3=1e-2,
             inject={"kind": "lowp_bias", "scale": 1.0})  # no centred runs: not in the table
    args = ("c/fp4", "c/fp4-c", "c/dose", "c/dose-c")
    table = grid_tables.f_centering_dose(*args).splitlines()
    assert [r.split(" | ")[0] for r in table[2:]] == ["| bf16", "| fp32 + noise 0.3", "| "
                                                                                      "bf16_nvfp4a4rollout",
                                                      "| fp32 + noise 3"]
    # noise 0.3: centred 0.95, 0.94, 0.93 against plain 0.90, 0.91, 0.92: every split separates, p =
    # 1/20
    assert table[3].endswith("| +0.030 (p 0.05) |")
    # bf16: overlapping seeds, 8 of 20 splits at least as far apart
    assert table[2].endswith("(p 0.40) |")
    assert grid_tables.f_centering_dose(*args, part="outcome") == (
        "Score centering's mean final accuracy is above plain GRPO's in 4 of 4 settings; the exact "
        "test separates it (p <= 0.05) in 3, in order of step-0 k3: fp32 + noise 0.3 (1.0e-03, "
        "+0.030), bf16_nvfp4a4rollout (2.0e-02, +0.240), fp32 + noise 3 (5.0e-01, +0.080): 1 of 2 "
        "precision flows and 2 of 2 injected mismatches.")


def test_heldout_table_sets_each_arm_beside_the_clean_policy_with_an_exact_p(tmp_path, monkeypatch):
    """The dose-response claim checked on the policy itself: each arm's held-out accuracy (the last
    eval row, sampled without the perturbation) beside the clean arm's, with the one-sided
    permutation p that the clean one is higher."""
    from suite.experiments import cell_figures

    monkeypatch.setattr(cell_figures, "REFERENCE_ROOT", tmp_path)
    for s in range(3):
        for kind, scale, train, held in (("none", 0.0, 0.96, 0.90 + 0.01 * s),
                                         ("lowp_bias", 0.3, 0.93, 0.80 + 0.01 * s)):
            d = tmp_path / "held" / f"{kind}-{scale}" / f"arith3__grpo__fp32__s{s}"
            d.mkdir(parents=True)
            cfg = {"algorithm": "grpo", "precision": "fp32", "seed": s,
                   "inject": {"kind": kind, "scale": scale}}
            (d / "config.json").write_text(json.dumps({"config": cfg}))
            rows = [{"step": 1, "reward/mean": 0.5, "eval/test/mean@4": 0.1},
                    {"step": 2, "reward/mean": train},
                    {"step": 3, "reward/mean": train, "eval/test/mean@4": held}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / "summary.json").write_text(json.dumps({
                "schema_version": 1, "run": d.name, "task": "arith3", "algorithm": "grpo",
                "precision": "fp32", "seed": s, "verdict": "pass" if kind == "none" else "unstable",
                "accuracy/final": train, "mismatch/step0/kl_k3": 1e-14 if kind == "none"
                else 2.6e-4}))
    table = cell_figures.f_heldout("held").splitlines()
    assert table[2] == ("| none (clean) | 1.0e-14 [1.0e-14, 1.0e-14] (3 runs) | 3/3 | 0.960 "
                        "[0.960, 0.960] | 0.910 [0.900, 0.920] | - |")
    # every clean seed above every biased one: p = 1/20, the floor of 3 against 3
    assert table[3] == ("| lowp_bias 0.3 | 2.6e-04 [2.6e-04, 2.6e-04] (3 runs) | 0/3 | 0.930 "
                        "[0.930, 0.930] | 0.810 [0.800, 0.820] | -0.100 (p 0.05) |")
    assert cell_figures.f_heldout("held", "outcome") == (
        "No seed passes in training in 1 arm(s) (lowp_bias 0.3); the policy's held-out accuracy is "
        "below the clean policy's by the exact test in lowp_bias 0.3, and not separated from it in "
        "none")
