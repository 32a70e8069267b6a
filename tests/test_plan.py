"""The memory plan (suite/numerics/memory.py, suite/rl/plan.py): its arithmetic by hand, the
activations it counts against the tensors autograd saves, FSDP2's sharding, and the refusal of a run
that does not fit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from suite.numerics.memory import (
    Arch,
    Shape,
    layer_activation,
    plan,
    shared_activation,
    weight_copies,
)
from suite.rl import config
from suite.rl import plan as rlplan

TINY = Arch(layers=1, hidden=4, heads=2, kv_heads=1, mlp=8, vocab=10)


def test_the_plan_of_a_tiny_config_is_the_hand_computation():
    s = Shape(micro_batch=1, prompt=2, response=2, compute=2, sampler="none")
    # Parameters: q, k, v, o = 4 x (4 + 2 + 2 + 4) = 48, SwiGLU 3 x 4 x 8 = 96, two norms 8;
    # embedding + head 2 x 40, final norm 4.
    assert (TINY.layer_linear, TINY.layer_params, TINY.root, TINY.params) == (144, 152, 84, 236)
    # Per token of the layer: norms 2 (2 x 4 x 4 + 4) = 72, five casts 5 x 2 x 4 = 40, q/k/v/out 4 x
    # 2 x 4 = 32, log-sum-exp 4 x 2 = 8, mask 2 x 4 = 8, SwiGLU 4 x 2 x 8 = 64.
    assert layer_activation(TINY, s) == 224
    # Shared: cos/sin 2 x 4 x 2 = 16, boolean mask 4, final norm 36, head input 2 x 4 = 8, ids 8.
    assert shared_activation(TINY, s) == 72
    assert weight_copies(TINY, s) == (2 * (144 + 40), 2 * (144 + 40))
    p = plan(TINY, s)
    assert [i.bytes for i in p.states] == [4 * 236, 4 * 236, 8 * 236]
    acts = 4 * (224 + 72)  # 4 tokens
    assert p.totals == {"trainer forward": 3776 + 368 + acts + 1 * 4 * 10 * 2 + 3 * 4 * 2 * 10,
                        "trainer backward": 3776 + 368 + acts + 5 * 4 * 2 * 10 + 4 * 40,
                        "layer backward": 3776 + 368 + acts + 4 * 224}
    assert (p.peak, p.peak_moment) == (3776 + 368 + acts + 896, "layer backward")
    # Chunked log-probs: five fp32 chunks of one position, the logits kept, their gradient
    # accumulated.
    chunked = plan(TINY, dataclasses.replace(s, logprob_chunk=1)).moments["trainer backward"]
    assert {i.name: i.bytes for i in chunked}["log-softmax (fp32)"] == 5 * 4 * 1 * 10
    assert {i.name: i.bytes for i in chunked}["logits gradient"] == 2 * 10 * 2
    # Packed, two sequences: the mask spans the 8-token row (the per-layer cast 2 x 8, the shared
    # mask 8 per token), and the head computes the 2 response positions' logits of each sequence
    # only.
    pk = dataclasses.replace(s, packing=True, micro_batch=2)
    assert (layer_activation(TINY, pk), shared_activation(TINY, pk)) == (224 + 2 * 4, 72 + 4)
    assert {i.name: i.bytes
            for i in plan(TINY, pk).moments["trainer forward"]}["logits"] == 2 * 2 * 10 * 2
    # Checkpointed: each layer keeps its fp32 input; a layer is recomputed, its gradients beside it.
    ck = plan(TINY, dataclasses.replace(s, checkpointing=True))
    assert ck.totals["layer backward"] == 3776 + 2 * 184 + 4 * (4 * 4 + 72) + 2 * 4 * 224


def test_fsdp2_divides_the_states_by_the_world_size():
    s = Shape(micro_batch=1, prompt=2, response=2, compute=2, sampler="none")
    one, four = plan(TINY, s), plan(TINY, dataclasses.replace(s, world=4))
    assert [i.bytes for i in four.states[:3]] == [b // 4 for b in (i.bytes for i in one.states[:3])]
    fsdp = four.states[3]
    assert fsdp.name == "FSDP2 unsharded" and fsdp.bytes == 4 * (
        2 * TINY.root + 3 * TINY.layer_params)
    assert len(one.states) == 3  # one process: no gathered copies


def test_deferred_gradient_sync_holds_the_whole_fp32_gradient_while_the_trainer_runs():
    """defer_grad_sync: 4 bytes per parameter more at each trainer moment, only with several ranks
    and several micro-batches per update; a refusal names turning it off."""
    s = Shape(world=4, micro_batch=1, update_rows=2, prompt=2, response=2, compute=2,
              sampler="torch", defer_grad_sync=True)
    on, off = plan(TINY, s), plan(TINY, dataclasses.replace(s, defer_grad_sync=False))
    assert {k: on.totals[k] - off.totals[k] for k in on.totals} == {
        "trainer forward": 4 * 236, "trainer backward": 4 * 236, "layer backward": 4 * 236,
        "sampling": 0}
    for nothing_deferred in (dict(update_rows=1), dict(world=1)):  # one micro-batch, or one rank
        t = dataclasses.replace(s, **nothing_deferred)
        assert plan(TINY, t).totals == plan(TINY,
                                            dataclasses.replace(t, defer_grad_sync=False)).totals
    device = rlplan.Device("cpu", off.peak, "just enough without it")
    assert f"defer_grad_sync=false ({rlplan.gib(off.peak)} GiB)" in rlplan.fixes(
        TINY, s, device, off.peak)
    cfg = config.load(["tier=smoke", "micro_batch=1", "defer_grad_sync=true"])
    big = rlplan.Device("cpu", 10**12, "big")
    assert rlplan.shape(cfg, big,
                        world=2).deferred_sync and not rlplan.shape(cfg, big).deferred_sync


@pytest.mark.parametrize("precision, packed",
                         [("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True)])
def test_the_activations_are_what_autograd_saves(precision, packed):
    """Every tensor the HF decoder saves for its backward (padding mask, autocast on the CPU),
    counted once per storage, plus the boolean mask the forward holds, equals the plan's activations
    and rounded weights. Packed (the two rows as one, position ids restarting: the trainer's packing
    forward), the mask spans the B S row."""
    from transformers import LlamaConfig, LlamaForCausalLM

    a = Arch(layers=2, hidden=32, heads=4, kv_heads=2, mlp=48, vocab=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                                         intermediate_size=a.mlp, num_hidden_layers=a.layers,
                                         num_attention_heads=a.heads,
                                         num_key_value_heads=a.kv_heads,
                                         tie_word_embeddings=False)).float()
    model.config._attn_implementation = "sdpa"  # as the Trainer sets it
    B, S = 2, 24
    ids = torch.randint(3, a.vocab, (B, S))
    attn = torch.ones_like(ids)
    if not packed:
        attn[0, :3] = 0  # a left-padded prompt
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    # packed: the plan's rows are full, so the packed row is every token, positions restarting at
    # each sequence
    inputs = (dict(input_ids=ids.view(1, -1), position_ids=pos.view(1, -1), use_cache=False)
              if packed
              else dict(input_ids=ids, attention_mask=attn, position_ids=pos))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved.setdefault(st.data_ptr(), st.nbytes())
        return t

    c = 2 if precision == "bf16" else 4
    with (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
          torch.autocast("cpu", torch.bfloat16, enabled=c == 2)):
        model(**inputs)
    s = Shape(micro_batch=B, prompt=0, response=S, compute=c, packing=packed)
    bool_mask = B * S * s.mask_cols  # held by the forward, saved by nothing
    assert sum(saved.values()) + bool_mask == (a.layers * layer_activation(a, s)
                                               + shared_activation(a, s)) * B * S \
        + weight_copies(a, s)[1]


def _smoke(*extra):
    return config.load(["tier=smoke", *extra])


def test_a_config_that_does_not_fit_is_refused_naming_the_knobs():
    cfg = _smoke()
    need = rlplan.for_config(cfg, rlplan.Device("cpu", 10**12, "big"))[2].peak
    small = rlplan.Device("cpu", need - 1, "a small machine")
    with pytest.raises(ValueError) as e:
        rlplan.check(cfg, small)
    msg = str(e.value)
    for knob in ("micro_batch", "gradient_checkpointing", "logprob_chunk",
                 "vllm.gpu_memory_fraction", "nproc", "plan.check=false"):
        assert knob in msg
    assert rlplan.check(config.load(["tier=smoke", "plan.check=false"]), small).peak == need
    # CPU ranks of one node share its RAM: two of them need twice the plan of one.
    two = rlplan.Device("cpu", 2 * need - 1, "RAM")
    rlplan.check(cfg, rlplan.Device("cpu", need, "RAM"))
    with pytest.raises(ValueError, match="shared by 2 ranks"):
        rlplan.check(cfg, two, ranks_per_node=2)


def test_suite_run_refuses_before_any_compute(tmp_path, monkeypatch):
    from suite.rl import data, train

    cfg = _smoke(f"out={tmp_path}")
    monkeypatch.setattr(rlplan, "this_device",
                        lambda local_rank=0: rlplan.Device("cpu", 1, "one byte"))

    def no_compute(*a, **k):
        raise AssertionError("compute started")

    monkeypatch.setattr(data, "prepare_data", no_compute)
    monkeypatch.setattr(train.dist, "init", no_compute)
    with pytest.raises(ValueError, match="memory plan"):
        train.run(cfg)
    assert not any(tmp_path.iterdir())  # no run directory either


def test_suite_plan_prints_the_published_recipe_on_a_gpu(capsys):
    from suite.cli import main

    code = main(["plan", "task=sanity_r1d", "tier=full", "precision=fp16", "gpu_gib=79.1"])
    out = capsys.readouterr().out
    assert "peak per rank" in out and "fp32 master weights" in out and "vLLM" in out
    assert code == 0  # the published tier fits (test below)


@pytest.mark.parametrize("nproc", [1, 8])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_published_tier_fits_one_and_eight_h100s_by_the_plan(precision, nproc):
    cfg = config.load(["task=sanity_r1d", "tier=full", f"precision={precision}", f"nproc={nproc}"])
    assert (cfg.engine, cfg.gradient_checkpointing, cfg.logprob_chunk,
            cfg.micro_batch) == ("vllm", True, 1024, 2)
    assert (cfg.vllm.max_model_len == 1024 + 8192 and not cfg.vllm.enforce_eager
            and cfg.reward_workers > 1)
    h100 = rlplan.gpu(rlplan.H100_GIB)
    a, s, p = rlplan.for_config(cfg, h100)
    assert (s.world, s.prompt, s.response, s.micro_batch) == (nproc, 1024, 8192, 2)
    assert s.vllm_bytes == int(0.25 * h100.bytes)
    assert rlplan.check(cfg, h100).peak == p.peak <= h100.bytes


def test_sleep_mode_counts_vllm_at_sampling_only():
    s = Shape(micro_batch=1, prompt=2, response=2, compute=2, sampler="vllm", vllm_bytes=10**6)
    awake, asleep = plan(TINY, s), plan(TINY, dataclasses.replace(s, vllm_asleep=True))
    assert {k: v - 10**6
            for k, v in awake.totals.items()} == {k: v for k, v in asleep.totals.items()
                                                  if k != "sampling"}
    assert asleep.totals["sampling"] == sum(i.bytes for i in asleep.states) + 10**6
    # The fix a refusal names: from a GPU config (validated as on that GPU) whose vLLM share leaves
    # no room.
    cfg = config.load(["task=sanity_r1d", "tier=full", "vllm.gpu_memory_fraction=0.6"])
    with pytest.raises(ValueError, match="vllm.enable_sleep_mode=true"):
        rlplan.check(cfg, rlplan.gpu(rlplan.H100_GIB))


def test_the_plan_reads_a_preset_without_downloading():
    a = rlplan.arch(_smoke("model=r1d-1.5b", "task=sanity_r1d", "optim.lr=1e-6"))
    # the published parameter count, untied head
    assert abs(a.params / 1e9 - 1.78) < 0.01 and not a.tied


def test_the_committed_plan_check_renders_its_rows_and_error_range(tmp_path):
    """docs/tasks.md's table and error range come from the file `suite bench-memory --plan --write`
    commits."""
    import json

    from suite.experiments.bench_memory import plan_markdown

    row = dict(option="both", hidden=96, vocab=151936, batch=8, prompt=32, response=128,
               precision="bf16", predicted_mib=1461.2, measured_mib=1325.0)
    rows = [{**row, "error": 0.1028}, {**row, "option": "logprob_chunk", "error": -0.1434}]
    path = tmp_path / "memory_plan.json"
    path.write_text(json.dumps({"rows": rows}))
    assert plan_markdown(path, "range") == "-14% to +10%"
    table = plan_markdown(path).splitlines()
    assert len(table) == 4 and table[2] == ("| logprob_chunk=16 + gradient_checkpointing | 96 | "
                                            "151,936 | 8 x (32 + 128) | bf16 | 1461 | 1325 | "
                                            "+10.3% |")
    assert table[3].startswith("| logprob_chunk=16 | 96 |") and table[3].endswith("| -14.3% |")
    # the sentence that names the rows the plan underestimates is generated too (it once said "the
    # one row" while the committed file had two)
    assert plan_markdown(path, "under") == ("1 of the 2 rows: logprob_chunk=16 "
                                            "(hidden 96, vocabulary 151,936, bf16) by 14.3%")
    path.write_text(json.dumps({"rows": rows[:1]}))
    assert plan_markdown(path, "under") == "no row"


def test_a_task_of_the_users_own_folder_is_planned_from_that_folder():
    """include_path reaches the plan (the task file's prompt length and the embedded vocabulary), as
    it reaches the
    run: `suite run task=my_letters include_path=DIR` was refused as an unknown task by the plan
    before."""
    from pathlib import Path

    own = Path(__file__).resolve().parents[1] / "examples" / "own_task"
    cfg = config.load(["task=my_letters", f"include_path={own}", "tier=smoke"])
    a, s, p = rlplan.for_config(cfg, rlplan.this_device())
    assert a.vocab > 0 and s.prompt > 0 and p.peak > 0
