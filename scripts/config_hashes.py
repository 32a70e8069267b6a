"""Write the hashes of a sample of existing configs: the fixture tests/test_config_layers.py reads.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python scripts/config_hashes.py [COMMIT] \\
        > tests/fixtures/config_hashes.json

(COMMIT: the commit the tree is at, recorded in the file; default ``git rev-parse --short HEAD``.)

The sample: every tier x regime on the tier's own task and the embedded policy, task sanity_r1d
at tier full (the r1d-1.5b preset its full tier names, with and without model= spelled out), and
every cell of the `sanity` grid. Each entry maps the overrides to the ``config_hash`` of what
``suite.rl.config.load`` resolves them to and a digest of the whole resolved dict (``digest``),
or to the refusal of a combination that validation rejects. Run on a commit whose resolution is
the reference, the file pins it: a change to how the config layers combine that moves any of
these configs changes a hash. Nothing here reads a clock or the machine, so a rerun writes the
same file ($SUITE_TASKS_PATH unset).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import sys


def sample() -> list[list[str]]:
    """The overrides of each sampled config, in a fixed order."""
    from suite.experiments import grids
    from suite.rl.schema import REGIMES, TIERS

    out = [[f"tier={t}", f"regime={r}"] for t in TIERS for r in REGIMES]
    out += [["task=sanity_r1d", "tier=full"], ["task=sanity_r1d", "tier=full", "model=r1d-1.5b"]]
    g = grids.get("sanity")
    for values in itertools.product(*g["axes"].values()):
        axes = [f"{k}={v}" for k, v in zip(g["axes"], values)]
        out.append([*g["overrides"], *axes, f"name={g['name']}"])
    return out


def digest(cfg: dict) -> str:
    """sha256 of the whole resolved dict: config_hash leaves out the location and memory keys
    (suite/results.py LOCATION_KEYS), and a layer must not move those either."""
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hashes() -> dict[str, str]:
    from suite.results import config_hash
    from suite.rl import config

    out = {}
    for ov in sample():
        try:
            cfg = config.to_dict(config.load(ov))
            out[" ".join(ov)] = f"{config_hash(cfg)} {digest(cfg)}"
        except ValueError as e:  # a combination validation refuses (wide: hidden 256, 6 heads)
            out[" ".join(ov)] = f"ValueError: {e}"
    return out


def main() -> int:
    commit = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"made_by": "PYTHONPATH=. HF_HUB_OFFLINE=1 python scripts/config_hashes.py "
                      "> tests/fixtures/config_hashes.json",
           "commit": commit or "unknown", "hashes": hashes()}
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
