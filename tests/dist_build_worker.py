"""Run under torchrun by tests/test_dist.py: the base-policy build fails on local rank 0 only. Every
rank must stop with an error (none may wait at the barrier for a build that will never come); each
writes the error it raised to <out>/rank<N>.txt."""

import os
import sys
from pathlib import Path

from suite.rl import config, data, train


def main(out: Path) -> None:
    def broken_build(cfg, console):
        raise OSError("disk full while writing the policy")

    data.prepare_data = broken_build  # only local rank 0 builds; the others would read the cache
    rank = os.environ["RANK"]
    try:
        train.run(config.load(["tier=smoke", "nproc=2", f"out={out}"]))
    except Exception as e:
        (out / f"rank{rank}.txt").write_text(f"{type(e).__name__}: {e}")
        return
    (out / f"rank{rank}.txt").write_text("no error")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
