"""The weight-sync adapter of the vLLM sampler (suite/numerics/vllm_engine.py), on fake vLLM
objects.

vLLM >= 0.16 reloads weights handed to its worker (``collective_rpc("reload_weights", ...)``); older
releases only re-read the checkpoint from disk, so the sync goes through the model's own
``load_weights``. Which path is taken is decided by the installed runner's signature, so these run
without vLLM.
"""

from __future__ import annotations

import pytest
import torch

from suite.numerics.vllm_engine import load_weights, reload_takes_iterator
from suite.numerics.vllm_support import FP8_METHOD, fp8_capable


class _RunnerNew:  # vLLM >= 0.16: v1/worker/gpu_model_runner.py
    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        pass


class _RunnerOld:  # vLLM <= 0.15: reload from disk only
    def reload_weights(self):
        pass


class _Model:
    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        self.loaded.extend(weights)
        return {name for name, _ in weights}


class _LLM:
    """Records what the adapter asks of ``vllm.LLM``."""

    def __init__(self):
        self.model, self.rpcs = _Model(), []

    def collective_rpc(self, method, kwargs=None):
        self.rpcs.append((method, kwargs))
        return [None]

    def apply_model(self, func):
        return [func(self.model)]


WEIGHTS = [("model.embed_tokens.weight", torch.ones(4, 2)), ("lm_head.weight", torch.zeros(4, 2))]


def test_reload_api_is_read_from_the_runner_signature():
    assert reload_takes_iterator(_RunnerNew) is True
    assert reload_takes_iterator(_RunnerOld) is False
    assert reload_takes_iterator(object) is False  # no reload_weights at all


def test_new_vllm_reloads_through_the_worker_in_checkpoint_format():
    llm = _LLM()
    load_weights(llm, WEIGHTS, takes_iterator=True)
    assert llm.rpcs == [("reload_weights",
                         {"weights_iterator": WEIGHTS, "is_checkpoint_format": True})]
    assert llm.model.loaded == []


def test_old_vllm_loads_the_same_tensors_through_the_model():
    llm = _LLM()
    load_weights(llm, WEIGHTS, takes_iterator=False)
    assert llm.rpcs == []
    assert [n for n, _ in llm.model.loaded] == [n for n, _ in WEIGHTS]
    assert all(a is b for (_, a), (_, b) in zip(llm.model.loaded, WEIGHTS))  # by reference, no copy


def test_installed_vllm_takes_the_iterator_path():
    """The extras' range (vLLM >= 0.21) is on the worker path; skipped where vLLM is not
    installed."""
    import pytest

    pytest.importorskip("vllm")
    assert reload_takes_iterator()


def test_fp8_is_refused_by_a_vllm_without_the_block_method(monkeypatch):
    """vLLM < 0.21 has no fp8_per_block: the FP8 flows are refused with the reason, whatever the
    device."""
    q = pytest.importorskip("vllm.model_executor.layers.quantization")
    monkeypatch.setattr(q, "QUANTIZATION_METHODS",
                        [m for m in q.QUANTIZATION_METHODS if m != FP8_METHOD])
    ok, why = fp8_capable()
    assert not ok and FP8_METHOD in why and "0.21" in why
