"""The vLLM sampler (``engine=vllm``): the real inference engine behind the built-in one's
interface.

Same three things as ``TorchEngine`` (suite/numerics/engine.py): ``sync(state_dict)``,
``generate(prompts, max_new_tokens, temperature, top_p, generator) -> Rollout`` and ``.dtype``, so
the RL loop does not know which engine it drives. What vLLM brings is the arithmetic of a production
sampler: its own kernels (paged attention, fused QKV / gate-up GEMMs, its own sampler), so the
mismatch measured with it is the one real stacks (verl, OpenRLHF, slime) live with.

How each requirement maps onto vLLM 0.32 (read from its source, paths relative to ``vllm/``; every
call below exists from 0.21 to 0.33, read from those releases' sources, except the weight reload,
which ``load_weights`` adapts to vLLM <= 0.15):

- **precision from the table only**: ``dtype`` is ``Flow.sampler_dtype`` and FP8 flows ask for
  ``quantization="fp8_per_block"``, vLLM's online block-scaled FP8 (E4M3 weights per 128x128 block,
  activations per 1x128 group, ``model_executor/layers/quantization/online/fp8.py``), i.e. the
  DeepSeek-V3 / Jet-RL recipe (arXiv 2601.14243; DeepSeek-V3, arXiv 2412.19437).
  (``quantization="fp8"`` no longer quantises online in 0.32: ``layers/quantization/fp8.py`` raises
  and points to ``fp8_per_tensor`` / ``fp8_per_block``.) The engine reads its dtype back from
  ``llm_engine.model_config.dtype`` and refuses to start if vLLM changed it.
- **sampler log-probs**: ``logprobs_mode="processed_logprobs"`` makes the returned log-prob the
  ``log_softmax`` of the fp32 logits *after* temperature (``v1/sample/sampler.py``: ``sample`` ->
  ``topk_topp_sampler``), the same quantity the built-in engine records and the trainer recomputes.
- **truncated sampling** (``top_p < 1`` or ``top_k > 0`` in training, ``truncating``): vLLM samples
  from its kept set, but its processed log-probs are already renormalised and say nothing of the
  kept mass. So such an engine runs ``logprobs_mode="raw_logprobs"`` and asks for every token's
  log-prob (``logprobs=-1``, ``max_logprobs=-1``): vLLM's full distribution at each position (raw =
  before temperature, hence refused with a temperature other than 1), from which
  suite/numerics/truncation.py derives the kept ids, the kept mass and the renormalised log-prob
  with the same function as the built-in engine (and checks that vLLM's token is in that kept set).
- **KV cache**: ``kv_cache_dtype`` from the table's ``KV_CACHE`` (``"fp8"``: E4M3, per-tensor scale
  1.0 without checkpoint scales, ``layers/attention/attention.py``; the CPU backend needs AVX-512
  or AMX and head sizes divisible by 32).
- **seeds**: one ``SamplingParams(seed=...)`` per request, drawn from the run's step generator, so a
  run is reproducible and a response does not depend on its neighbours in the batch (vLLM keeps one
  ``torch.Generator`` per seeded request, ``v1/worker/gpu_input_batch.py``).
- **weight sync without disk**: the engine core runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` -> ``InprocClient`` + ``UniProcExecutor``), so
  ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` hands the trainer's
  tensors by reference to ``Worker.reload_weights`` ->
  ``model_executor/model_loader/reload/inplace.py``, which runs the model's own ``load_weights``
  (fusing q/k/v and gate/up, casting to the engine dtype) inside vLLM's layer-wise reload, which
  re-quantises FP8 layers. Then ``reset_prefix_cache()``: KV blocks cached under the old weights
  must not be reused.
- **several ranks** (``nproc``/``nnodes`` > 1, docs/distributed.md): one engine per rank, or per
  group of ``tensor_parallel_size`` ranks, inside the suite's own process group through vLLM's
  ``external_launcher`` (``_world_args``); every rank syncs the full weights it gathered from the
  FSDP2 shards, and vLLM loads its TP shard of them.
- **sleep mode (GPU)**: with ``enable_sleep_mode`` the engine sleeps (level 1: weights to host RAM,
  KV cache dropped) right after each rollout. It wakes in the order vLLM documents for RL and verl's
  rollout follows: free the trainer's cached blocks, wake the *weights* only, load the new weights
  (loading into offloaded memory would be lost), free again, then wake the *KV cache*, so weights
  and cache never both compete with the trainer's cached memory. ``generate`` wakes a sleeping
  engine itself (level 1 kept the weights on the host): an evaluation samples split after split.
  vLLM's CPU worker ignores sleep, so the config refuses it there.

Nothing here imports vLLM at module level: the rest of the suite works without it.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import torch

from suite.numerics import vllm_state, vllm_support
from suite.numerics.engine import EOS, PAD, Rollout
from suite.numerics.precision import Flow


def _set_env() -> None:
    """Process-wide vLLM settings, before vLLM is imported (vllm/envs.py reads them lazily)."""
    # The engine core in this process: weight syncs pass tensors by reference (no pickling, no
    # disk).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if vllm_support.device() == "cpu":
        # No core pinning: the process is shared with the trainer and the machine with other jobs.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # Linux hands out AMX tile state only to a process that asks (arch_prctl
        # ARCH_REQ_XCOMP_PERM); oneDNN asks on its first bf16 GEMM, vLLM's CPU attention kernel does
        # not and dies of SIGILL when it runs first (seen in a fresh torchrun rank). Ask here; False
        # where there is no AMX.
        torch.cpu._init_amx()


def _world_args(world, tp: int) -> dict:
    """vLLM inside our torchrun/srun world: one engine per rank, or per group of ``tp`` consecutive
    ranks.

    ``distributed_executor_backend="external_launcher"`` makes vLLM join the process group the suite
    already opened instead of starting its own workers (``config/parallel.py``); with
    ``data_parallel_size = world / tp`` each engine serves its own requests, vLLM's DP rank is
    ``RANK // tp`` and the engines step together (a rank out of requests runs dummy batches,
    ``v1/engine/llm_engine.py: has_unfinished_requests_dp``), so every rank must call ``generate``
    the same number of times. The tp ranks of a group serve the same requests.
    """
    if world is None or not world.distributed:
        return {}
    return {"distributed_executor_backend": "external_launcher",
            "data_parallel_size": world.size // tp}


def reload_takes_iterator(runner=None) -> bool:
    """Does the installed vLLM's worker reload weights handed to it
    (``reload_weights(weights_iterator=..., is_checkpoint_format=...)``)? vLLM 0.16 onwards
    (``v1/worker/gpu_model_runner.py``, which the CPU runner inherits); up to 0.15
    ``reload_weights()`` takes no arguments and re-reads the checkpoint from disk. ``runner``: the
    model-runner class to ask (tests pass fakes)."""
    if runner is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as runner
    fn = getattr(runner, "reload_weights", None)
    return fn is not None and "weights_iterator" in inspect.signature(fn).parameters


def load_weights(llm, weights: list[tuple[str, torch.Tensor]], takes_iterator: bool) -> None:
    """Hand HF-format ``(name, tensor)`` pairs to a running ``LLM``, through the API its vLLM has.

    With ``takes_iterator`` (vLLM >= 0.16) the worker's layer-wise reload, which re-quantises
    online-FP8 layers. Before that, the model's own ``load_weights`` through ``apply_model`` (what
    TRL, verl and OpenRLHF called then): it fuses q/k/v and gate/up the same way but does not
    re-quantise, which is harmless because ``vllm_support.FP8_METHOD`` exists only from vLLM 0.21
    (FP8 flows cannot start on those versions).
    """
    if takes_iterator:
        llm.collective_rpc("reload_weights",
                           kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    else:
        llm.apply_model(lambda model: model.load_weights(weights))


class VllmEngine:
    """A vLLM ``LLM`` in this process, configured from the precision table and ``cfg.vllm``."""

    # Every prompt of an evaluation in one generate() call: vLLM's scheduler batches the requests
    # itself within its paged KV cache (max_num_seqs, continuous batching); chunks would idle it at
    # the end of each one.
    max_batch: int | None = None

    def __init__(self, model_dir: str | Path, flow: Flow, vcfg, seed: int = 0, world=None,
                 kv_cache: str = "auto", truncating: bool = False, head_logprobs: int = 0):
        _set_env()
        from vllm import LLM

        from suite.numerics.flows import KV_CACHE

        self.truncating = truncating
        self.kv_cache = kv_cache
        self.flow = flow
        self.dtype = flow.sampler_dtype
        self.quant = flow.sampler_quant
        self.sleep_mode = vcfg.enable_sleep_mode
        self.asleep = False
        kv = (vcfg.kv_cache_gib if vcfg.kv_cache_gib is not None
              else (1.0 if vllm_support.device() == "cpu" else None))
        set_threads = torch.set_num_threads
        t0 = time.perf_counter()
        from transformers import AutoConfig

        from suite.numerics.engine import eos_ids

        hf = AutoConfig.from_pretrained(model_dir)
        self.eos = eos_ids(hf)  # skip_tokenizer_init: vLLM cannot read it
        self.vocab = hf.vocab_size  # a top-k head asks for at most this many (as the torch engine)
        heads = hf.num_attention_heads
        head = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        why = self.quant == "fp8" and vllm_support.device() == "cuda" and (
            vllm_support.fp8_width_problem(hf.hidden_size, heads * head, hf.intermediate_size))
        if why:  # before vLLM starts: a model from a directory (the config checks the embedded one)
            raise ValueError(f"precision: {why} in {model_dir}; use engine=torch (FP8 "
                             "emulation) or a non-FP8 precision.")
        args = dict(
            # ids in, ids out
            model=str(model_dir), tokenizer=str(model_dir), skip_tokenizer_init=True,
            dtype=self.dtype,
            quantization=vllm_support.FP8_METHOD if self.quant == "fp8" else None,
            logprobs_mode="raw_logprobs" if truncating else "processed_logprobs",
            # head_logprobs: score centering's top-k head (vLLM refuses logprobs > max_logprobs, 20)
            **({"max_logprobs": -1} if truncating else {"max_logprobs": max(20, head_logprobs)}),
            kv_cache_dtype=KV_CACHE[kv_cache][1],
            generation_config="vllm",  # vLLM's defaults, not the model's
            seed=seed, max_model_len=vcfg.max_model_len,
            gpu_memory_utilization=vcfg.gpu_memory_fraction, kv_cache_memory_bytes=None
            if kv is None else int(kv * 2**30), enforce_eager=vcfg.enforce_eager,
            tensor_parallel_size=vcfg.tensor_parallel_size,
            enable_sleep_mode=vcfg.enable_sleep_mode,
            **_world_args(world, vcfg.tensor_parallel_size),
        )
        from vllm import SamplingParams, TokensPrompt

        self._before = vllm_state.record()  # what the start changes process-wide; close() undoes it
        try:
            self.llm = LLM(**args)
            # With eager mode and an explicit KV cache size vLLM skips its warm-up forward
            # (CPUWorker._should_warm_up_model), so the first request pays the lazy initialisation
            # (~30 s measured on CPU). Pay it here, as start-up: one token from one short prompt.
            self.llm.generate([TokensPrompt(prompt_token_ids=[EOS])],
                              SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        except BaseException:
            vllm_state.restore(self._before, dict(os.environ))
            raise
        self._started = dict(os.environ)
        self.startup_s = time.perf_counter() - t0
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op because it pins its worker
        # process's threads (v1/worker/cpu_worker.py, init_device); in this process nothing is
        # pinned and the suite sets its own thread count, so put the real function back.
        torch.set_num_threads = set_threads
        got = self.llm.llm_engine.model_config.dtype
        if got != self.dtype:  # the OpenRLHF failure: an "fp16" run sampling in bf16
            raise RuntimeError(f"vLLM runs in {got}, the precision table asks for {self.dtype}")
        self.n_syncs = 0

    # ---- weights -------------------------------------------------------------------------
    def sync(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the trainer's current weights into the running engine (in memory, no checkpoint)."""
        woke = self.asleep
        if woke:  # the weights first: weights loaded into offloaded memory would be lost
            _free_cached_device_memory()
            self.llm.wake_up(tags=["weights"])
        # Cast to the engine dtype here (vLLM's loader would cast too, warning once per tensor). FP8
        # layers receive sampler-dtype (bf16) weights, the checkpoint format they quantise online.
        weights = [(k, v.detach().to(self.dtype)) for k, v in state_dict.items()]
        # is_checkpoint_format: HF names and layout; vLLM fuses q/k/v and gate/up and re-quantises
        # FP8 layers. (Its "RotaryEmbedding: Failed to load weights" warning is expected: the rotary
        # cache is a computed buffer, not a checkpoint tensor, and is put back unchanged.)
        load_weights(self.llm, weights, reload_takes_iterator())
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.n_syncs += 1
        if woke:  # then the KV cache, into the memory the weight copy's temporaries left
            _free_cached_device_memory()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def _wake(self) -> None:
        """Wake with the weights it slept with (level 1 kept them on the host), weights before KV
        cache."""
        _free_cached_device_memory()
        self.llm.wake_up(tags=["weights"])
        _free_cached_device_memory()
        self.llm.wake_up(tags=["kv_cache"])
        self.asleep = False

    def weights(self) -> dict[str, torch.Tensor]:
        """The engine's current parameters (vLLM names and layout), copied to CPU: for tests."""
        return self.llm.apply_model(lambda m: {k: v.detach().cpu().clone()
                                               for k, v in m.named_parameters()})[0]

    # ---- sampling ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 top_p: float, generator: torch.Generator | torch.Tensor, top_k: int = 0,
                 keep_dist: bool = False, dist_topk: int = 0, *, logprobs: bool = True) -> Rollout:
        """One response per prompt; temperature 0 is greedy decoding. ``generator``: the batch's
        generator, or (B,) per-sequence seeds (sampling.sequence_seeds), each request's own seeded
        stream. Truncated sampling and ``keep_dist`` need an engine started with ``truncating``
        (every token's log-prob is returned). ``keep_dist`` with ``dist_topk`` = k records the top-k
        head of the processed distribution instead (``logprobs=k``, an engine started with
        ``head_logprobs`` >= k): Rollout.dist and dist_ids (B, R, k).
        ``logprobs=False``: the tokens only (an evaluation grades text): vLLM builds no log-prob
        object per token (AIME mean@32 at 8,192 tokens: 16 M of them) and applies top-p / top-k
        itself; the log-probs are zeros."""
        from vllm import SamplingParams, TokensPrompt

        from suite.numerics import truncation

        # e.g. an evaluation's second split: the same weights, slept after the first
        if self.asleep:
            self._wake()
        seeds = ([int(x) % (2**31 - 1) for x in generator] if isinstance(generator, torch.Tensor)
                 else torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist())
        # k >= V is the whole distribution; vLLM's own top-k would fail ("selected index k out of
        # range") on a vocabulary under k, the embedded policy's among them
        head = min(dist_topk, self.vocab) if keep_dist and logprobs else 0
        full = logprobs and (truncation.active(top_p, top_k) or (keep_dist and not head))
        # -1: every token's log-prob; k: the sampled one's and the k likeliest; None: none at all
        asked = (-1 if full else head) if logprobs else None
        if full and not (self.truncating and temperature == 1.0):
            raise ValueError("engine=vllm: truncated sampling (or the full distribution) needs an "
                             "engine started with truncating=True and temperature 1 (vLLM's raw "
                             "log-probs are taken before temperature)")
        params = [SamplingParams(n=1, temperature=temperature, top_p=top_p,
                                 top_k=top_k if top_k > 0 else 0,
                                 max_tokens=max_new_tokens, seed=s, logprobs=asked,
                                 stop_token_ids=self.eos, detokenize=False) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 use_tqdm=False)
        B, R = len(prompts), max(len(o.outputs[0].token_ids) for o in outs)
        tokens = torch.full((B, R), PAD, dtype=torch.long)
        logps = torch.zeros(B, R)
        mask = torch.zeros(B, R)
        truncated, dists = [], []
        head_lp, head_ids = torch.zeros(B, R, head), torch.zeros(B, R, head, dtype=torch.long)
        for b, o in enumerate(outs):
            c = o.outputs[0]
            ids = list(c.token_ids)
            if full:  # vLLM's whole distribution at every position (B, R, V)
                V = max(len(step) for step in c.logprobs)
                d = torch.full((R, V), -torch.inf)
                for t, step in enumerate(c.logprobs):
                    d[t, list(step)] = torch.tensor([x.logprob for x in step.values()])
                dists.append(d)
                lp = [0.0] * len(ids)  # filled below from the distribution
            elif logprobs:  # logprobs=k: the sampled token's (processed) log-prob, the k likeliest
                lp = [step[t].logprob for step, t in zip(c.logprobs, ids)]
                for t, step in enumerate(c.logprobs[:len(ids)] if head else []):
                    top = sorted(step.items(), key=lambda kv: kv[1].logprob, reverse=True)[:head]
                    head_ids[b, t] = torch.tensor([v for v, _ in top])
                    head_lp[b, t] = torch.tensor([x.logprob for _, x in top])
            else:
                lp = [0.0] * len(ids)
            tokens[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            logps[b, :len(ids)] = torch.tensor(lp, dtype=torch.float32)
            mask[b, :len(ids)] = 1.0
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM request {o.request_id} finished with {c.finish_reason!r}")
            truncated.append(c.finish_reason == "length")
        if self.sleep_mode:  # free the device for the trainer until the next sync
            self.llm.sleep(level=1)
            self.asleep = True
        roll = Rollout(prompt_ids=[list(p) for p in prompts], tokens=tokens, mask=mask,
                       logprobs=logps, truncated=truncated, dist=head_lp if head else None,
                       dist_ids=head_ids if head else None)
        return (_from_distribution(roll, torch.stack(dists), top_p, top_k, keep_dist) if full
                else roll)

    def close(self) -> None:
        """Shut the engine down and release vLLM's process-wide state, so another can start."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        cleanup_dist_env_and_memory()
        vllm_state.restore(self._before, self._started)  # the trainer computes as before the start


def _from_distribution(roll: Rollout, dist: torch.Tensor, top_p: float, top_k: int,
                       keep_dist: bool) -> Rollout:
    """Log-probs, kept ids and kept mass of a rollout from vLLM's full distribution (B, R, V), with
    the functions of the built-in engine (suite/numerics/truncation.py); a token outside the kept
    set means vLLM cut differently."""
    from suite.numerics import truncation

    m = roll.mask.bool()
    V = dist.shape[-1]
    # pads: a harmless uniform row
    logp = torch.log_softmax(torch.where(m[..., None], dist, torch.zeros(V)), dim=-1)
    tok = roll.tokens.clamp(max=V - 1)
    if truncation.active(top_p, top_k):
        keep = truncation.keep_mask(logp.view(-1, V), top_p, top_k).view_as(logp)
        if not bool(keep.gather(-1, tok[..., None])[..., 0][m].all()):
            raise RuntimeError("engine=vllm: vLLM sampled a token outside the kept set the suite "
                               f"computes for top_p={top_p}, top_k={top_k} (a different cut rule); "
                               "the log-probs would be wrong")
        kept = torch.where(m[..., None], truncation.kept_ids(keep), -1)
        lp, log_mass = truncation.renormalised(logp, tok, kept)
        roll.kept, roll.kept_mass = kept, torch.where(m, log_mass.exp(), 1.0)
    else:
        lp = logp.gather(-1, tok[..., None])[..., 0]
    roll.logprobs = torch.where(m, lp, 0.0)
    roll.dist = logp if keep_dist else None
    return roll


def _free_cached_device_memory() -> None:
    """Return the trainer's cached but unused CUDA blocks to the device before vLLM claims memory
    (verl does the same around each wake-up); nothing to do without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
