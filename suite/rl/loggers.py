"""Mirrors of a run's metrics in the trackers people watch: W&B, TensorBoard, MLflow
(``logger=[...]``).

``metrics.jsonl`` stays the source of truth; a mirror gets each of its rows (the numbers; lists and
strings such as the per-prompt pass rates and the token hash stay in the JSONL), plus the run's
config and environment at the start. Rank 0 logs, as it writes the bundle. All three work offline:

- ``wandb``: offline mode unless ``WANDB_MODE`` says otherwise; files in ``<run>/wandb/``; project
  ``$WANDB_PROJECT`` (default ``lowprec-rl-suite``), group = the experiment name (a sweep's cells
  share it), run name and id from the run directory, so a resumed run continues the same W&B run.
- ``tensorboard``: event files in ``<run>/tensorboard/``; ``tensorboard --logdir <out>/<name>``
shows
  a sweep's cells side by side. A resumed run purges the steps it redoes (``purge_step``).
- ``mlflow``: a local SQLite store ``<out>/<name>/mlflow.db`` (``$MLFLOW_TRACKING_URI`` wins),
experiment = the
  experiment name, one MLflow run per run directory (found again by its tag when the run resumes;
  the steps it redoes are logged again, MLflow keeps every value it was sent).

A backend that raises is switched off with one warning naming it and the error; the run and its
bundle go on. A backend whose package is missing is refused before any compute (config.validate).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from rich.console import Console

BACKENDS = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard"),
            "mlflow": ("mlflow", "mlflow")}  # name -> (module to import, pip extra)


def check(names: list[str]) -> None:
    """Known names, installed packages; ValueError naming the field otherwise (before any
    compute)."""
    import importlib.util

    from suite.names import unknown

    for name in names:
        if name not in BACKENDS:
            raise ValueError(unknown("logger", name, BACKENDS))
        module, extra = BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"logger={name} needs the optional package {module!r}: "
                             f"pip install 'lowprec-rl-suite[{extra}]'")


def scalars(row: dict) -> dict[str, float]:
    """The numbers of a metrics row (bools and the step excluded); NaN and inf kept as floats."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat_config(cfg: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys with JSON values (MLflow params, TensorBoard text)."""
    out = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v)
    return out


class _Wandb:
    def __init__(self, run_dir: Path, config: dict, env: dict, group: str, start: int):
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lowprec-rl-suite"),
                              group=group, name=run_dir.name, id=run_id, resume="allow",
                              dir=str(run_dir), config={**config, "env": env}, reinit="create_new")

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict, env: dict, group: str, start: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start + 1
                                    if start else None)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```",
                             global_step=start)
        self.writer.add_text("env", "```\n" + json.dumps(env, indent=1, default=str) + "\n```",
                             global_step=start)

    def log(self, values: dict, step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, run_dir: Path, config: dict, env: dict, group: str, start: int):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        # MLflow's local store: a SQLite file per experiment root (MLflow 3 froze the plain-file
        # store).
        uri = (os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{(run_dir.parent / 'mlflow.db').resolve()}")
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(group)
        # Artifacts (env.json) next to the store: MLflow's default artifact root is ./mlruns in the
        # working directory.
        exp_id = exp.experiment_id if exp else self.client.create_experiment(
            group, artifact_location=(run_dir.parent / 'mlflow-artifacts').resolve().as_uri())
        tag = str(run_dir.resolve())
        found = self.client.search_runs([exp_id], filter_string=f"tags.`suite.run_dir` = '{tag}'")
        if found:
            self.run_id = found[0].info.run_id
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name,
                                                 tags={"suite.run_dir": tag}).info.run_id
            params = [Param(k, v[:6000]) for k, v in flat_config(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
            self.client.log_text(self.run_id, json.dumps(env, indent=1, default=str), "env.json")

    def log(self, values: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items() if math.isfinite(v)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_CLASSES = {"wandb": _Wandb, "tensorboard": _TensorBoard, "mlflow": _MLflow}


class Mirrors:
    """The backends of ``logger=[...]`` for one run; each failure switches that backend off with one
    warning."""

    def __init__(self, names: list[str], run_dir: Path, config: dict, env: dict, group: str,
                 start: int, console: Console):
        self.console, self.live = console, {}
        for name in names:
            self._guard(name, lambda name=name: self.live.__setitem__(
                name, _CLASSES[name](Path(run_dir), config, env, group, start)))

    def _guard(self, name: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- any tracker error: the JSONL is the record, the run goes on
            self.live.pop(name, None)
            self.console.print(f"[yellow]warning: logger {name} failed and is off for the rest of "
                               f"the run (metrics.jsonl is complete): {type(e).__name__}: {e}[/]",
                               soft_wrap=True)

    def log(self, row: dict) -> None:
        values = scalars(row)
        for name, backend in list(self.live.items()):
            self._guard(name, lambda backend=backend: backend.log(values, row["step"]))

    def close(self) -> None:
        for name, backend in list(self.live.items()):
            self._guard(name, backend.close)
        self.live = {}
