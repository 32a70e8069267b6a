"""The refit check (suite/numerics/refit.py): after a sync the sampler's quantised weights are a
fresh quantisation of the synced weights, bit for bit, for every flow that quantises; a stale scale
or code is caught and named."""

from __future__ import annotations

import copy

import pytest
import torch

from suite import dist
from suite.numerics import fp4, refit
from suite.numerics.precision import FLOWS
from suite.rl import config
from suite.rl.train import build_engines

QUANTISING = [n for n, f in FLOWS.items() if f.sampler_quant or getattr(f, "fp4", None)]


def _engine(tiny_model, flow):
    model, _, _ = tiny_model
    cfg = config.load(["tier=smoke", f"precision={flow}"])
    trainer, engine, _ = build_engines(cfg, copy.deepcopy(model), dist.World(device="cpu"))
    return trainer, engine


def test_every_quantising_flow_is_checked():
    assert {"fp8", "bf16_fp8rollout", "bf16_nvfp4rollout", "bf16_mxfp4a4rollout",
            "nvfp4a4"} <= set(QUANTISING)


@pytest.mark.parametrize("flow", QUANTISING)
def test_a_fresh_sync_passes_and_a_stale_scale_is_named(tiny_model, flow):
    trainer, engine = _engine(tiny_model, flow)
    old = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    engine.sync(old)
    assert refit.checkable(engine), flow
    assert refit.check(engine, old) == sorted(engine.wq)  # every quantised weight, bit for bit
    stale = dict(engine.wq)
    # an update moves every weight's scale
    new = {k: v * 1.5 if v.dim() == 2 else v for k, v in old.items()}
    engine.sync(new)
    refit.check(engine, new)
    name = sorted(engine.wq)[-1]
    # the planted bug: one layer keeps the last sync's codes and scales
    engine.wq[name] = stale[name]
    with pytest.raises(refit.StaleWeights, match=name.replace(".", r"\.")):
        refit.check(engine, new)
    others = [n for n in sorted(engine.wq) if n != name]
    assert refit.check(engine, new, others) == others  # the rest is fresh


def test_a_stale_tensor_scale_alone_is_caught(tiny_model):
    """NVFP4's per-tensor fp32 scale: codes right, scale of the last sync (what prime-rl found)."""
    trainer, engine = _engine(tiny_model, "bf16_nvfp4rollout")
    w = trainer.model.state_dict()
    engine.sync({k: v * 2 if v.dim() == 2 else v for k, v in w.items()})
    old_scales = {k: q.tensor_scale for k, q in engine.wq.items()}
    engine.sync(w)
    name = sorted(engine.wq)[0]
    q = engine.wq[name]
    engine.wq[name] = fp4.SamplerWeight(q.operand, old_scales[name], q.fmt)
    with pytest.raises(refit.StaleWeights, match="tensor scale"):
        refit.check(engine, w)


def test_the_rotation_covers_every_weight_and_plain_engines_are_skipped(tiny_model):
    trainer, engine = _engine(tiny_model, "bf16_fp8rollout")
    engine.sync(trainer.model.state_dict())
    names = sorted(engine.wq)
    steps = -(-len(names) // 2)
    assert sorted(n for s in range(steps) for n in refit.rotating(engine, s)) == names
    _, plain = _engine(tiny_model, "bf16")
    assert not refit.checkable(plain) and refit.check(plain,
                                                      {}) == [] and refit.rotating(plain, 3) == []


def test_a_tensor_on_another_device_is_compared_where_the_sampler_holds_it(tiny_model):
    trainer, engine = _engine(tiny_model, "bf16_fp8rollout")
    w = trainer.model.state_dict()
    engine.sync(w)
    # cast to the sampler's dtype first
    assert refit.check(engine, {k: v.to(torch.float64) for k, v in w.items()})


def test_a_run_whose_sampler_keeps_stale_weights_stops_naming_the_layer(tmp_path, monkeypatch):
    """The planted bug in a run: after its first sync the sampler never requantises (as a reload
    that leaves the quantised buffers behind); the run stops at the first step's check, naming a
    layer, and says so in its summary."""
    import json

    from suite.numerics.engine import TorchEngine
    from suite.rl.train import run

    real = TorchEngine.sync

    def sync_once(self, state_dict):
        kept = dict(self.wq)
        real(self, state_dict)
        if kept:
            self.wq = kept

    monkeypatch.setattr(TorchEngine, "sync", sync_once)
    cfg = config.load(["tier=smoke", f"out={tmp_path}", "steps=2", "precision=bf16_fp8rollout"])
    with pytest.raises(refit.StaleWeights, match=r"model\.layers\.\d+\..*_proj\.weight"):
        run(cfg)
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["verdict"] == "incomplete" and "refit check" in summary["error"]


def test_the_per_step_check_casts_only_the_layers_it_checks(tiny_model):
    """The rotating check runs inside the RL step: it must not copy the whole model into the
    sampler's dtype."""
    trainer, engine = _engine(tiny_model, "bf16_fp8rollout")
    w = trainer.model.state_dict()
    engine.sync(w)
    seen = []
    real = engine.cast_weights
    engine.cast_weights = lambda sd, **kw: seen.append(sorted(sd)) or real(sd, **kw)
    names = refit.rotating(engine, 0, per_step=1)
    assert refit.check(engine, w, names) == names
    layer = names[0].split(".self_attn.")[0].split(".mlp.")[0] + "."
    assert seen[0] and all(k.startswith(layer) for k in seen[0]) and len(seen[0]) < len(w)


def test_a_stale_dequantised_fp8_operand_is_caught(tiny_model):
    """Emulated FP8 (a CPU): the sampler keeps each weight dequantised between syncs; codes and
    scales fresh but that operand of the last sync is caught, named as the operand."""
    trainer, engine = _engine(tiny_model, "bf16_fp8rollout")
    w = trainer.model.state_dict()
    engine.sync({k: v * 2 if v.dim() == 2 else v for k, v in w.items()})
    old = dict(engine.w_hat)
    engine.sync(w)
    assert sorted(engine.w_hat) == sorted(engine.wq)  # one operand per quantised weight
    refit.check(engine, w)
    name = sorted(engine.w_hat)[0]
    engine.w_hat[name] = old[name]
    with pytest.raises(refit.StaleWeights, match=r"dequantised operand"):
        refit.check(engine, w)
