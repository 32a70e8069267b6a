"""Real models get real recipes (suite/rl/models.py): a preset brings its published
hyper-parameters, and a real model run with the embedded policy's learning rate is refused before
any compute, naming the knob."""

import json
import warnings

import pytest

from suite.rl import config, models


def _hf_dir(tmp_path, **over):
    """A config.json of a Qwen2-1.5B-shaped model (no weights: the check reads the config only)."""
    c = {"hidden_size": 1536, "num_hidden_layers": 28, "vocab_size": 151936,
         "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
         "tie_word_embeddings": False, **over}
    (tmp_path / "config.json").write_text(json.dumps(c))
    return str(tmp_path)


def test_param_count_from_config_matches_the_published_size(tmp_path):
    # DeepSeek-R1-Distill-Qwen-1.5B: 1.78B with untied embeddings (its card); the estimate omits
    # only the biases and norms (~0.1%), so it must land within 1% of the preset's number.
    n = models.param_count(_hf_dir(tmp_path))
    assert abs(n - models.PRESETS["r1d-1.5b"].params_b * 1e9) / n < 0.01, n


def test_a_preset_brings_its_recipe_and_the_command_line_wins():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a preset's recipe leaves nothing to warn about
        cfg = config.load(["task=gsm8k", "model=qwen3-1.7b"])
    assert (cfg.optim.lr, cfg.micro_batch, cfg.gradient_checkpointing,
            cfg.logprob_chunk) == (1e-6, 2, True, 1024)
    # arXiv 2510.26788's AdamW
    assert (cfg.optim.eps, tuple(cfg.optim.betas)) == (1e-15, (0.9, 0.95))
    cfg = config.load(["task=gsm8k", "model=qwen3-1.7b", "optim.lr=3e-6", "micro_batch=4"])
    assert (cfg.optim.lr, cfg.micro_batch) == (3e-6, 4)
    # the embedded policy keeps its tier's recipe
    assert config.load(["tier=smoke"]).optim.lr == 1e-4


def test_a_real_model_with_the_toy_learning_rate_is_refused(tmp_path):
    path = _hf_dir(tmp_path)
    with pytest.raises(ValueError, match=r"1\.7\dB parameters.*toy tier's rate.*optim\.lr=1e-6"):
        config.load(["task=gsm8k", f"model={path}"])
    with pytest.warns(config.RecipeWarning, match=r"micro_batch=None is the embedded policy's "
                                                  r"setting.*micro_batch=2"):
        cfg = config.load(["task=gsm8k", f"model={path}", "optim.lr=1e-6"])
    assert cfg.optim.lr == 1e-6


def test_a_small_local_model_keeps_the_toy_recipe(tmp_path):
    path = _hf_dir(tmp_path, hidden_size=64, num_hidden_layers=2, vocab_size=64,
                   intermediate_size=192, num_attention_heads=4, num_key_value_heads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.load(["task=gsm8k", f"model={path}"]).optim.lr == 1e-4
