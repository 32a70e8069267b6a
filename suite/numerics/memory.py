"""The memory plan: the predicted peak of one rank, itemised, from the model's dimensions and the
run's shapes.

Pure arithmetic (no torch): suite/rl/plan.py turns a run config into ``Arch`` and ``Shape`` and
refuses a config whose plan exceeds the device. Every count below is of what this suite's code
holds, not of a generic
trainer: HF decoder layers under ``torch.autocast`` with fp32 masters (suite/numerics/trainer.py),
the fp32 log-softmax of ``scoring.log_probs``, AdamW, FSDP2 over ``world`` ranks, and the sampler
beside them.

**States** (N parameters, W = nproc x nnodes ranks; FSDP2 shards all three, a single process holds
them whole): fp32 masters 4N/W, fp32 gradients 4N/W, AdamW's exp_avg and exp_avg_sq 8N/W. Sharded, a
rank also holds unsharded copies while it computes: the root unit (embeddings, final norm, head)
stays gathered from the start of the forward to the end of the backward (FSDP2 does not reshard the
root after forward), two decoder layers are gathered at a time (the current one and the prefetched
next), and the root's and one layer's fp32 gradients exist unsharded until their reduce-scatter: 4
(2 N_root + 3 N_layer) bytes. With ``defer_grad_sync`` and several micro-batches per update, every
unit keeps its unsharded fp32 gradient from the first micro-batch's backward to the last one's
reduce-scatter (FSDP2's accumulation without communication): 4N more during the trainer's moments.

**Low-precision weight copies.** Autocast caches the cast of every parameter it rounds for the
length of the forward (``torch.autocast``'s weight cache), and a linear layer saves its rounded
weight for the backward: c N_lin bytes (c: the compute dtype's bytes; N_lin: every linear weight,
the head included, the embedding not). Emulated GEMMs (``lowp_linear``) save an fp32 copy of the
rounded weight instead, 4 N_lin.

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4.1: count every tensor a layer saves for its backward; their 34 sbh + 5 a s^2 b is
GPT's with GeLU, dropout and un-fused attention). Here, per token of one decoder layer, for HF Llama
/ Qwen2 / Qwen3 under autocast with SDPA and a padding mask (r = 4: the residual stream and RMSNorms
stay fp32; H hidden, Q = heads x head_dim, K = kv_heads x head_dim, I the SwiGLU width, S the padded
length, c the compute dtype's bytes):

    2 (2 r H + 4)          two RMSNorms: their fp32 input and normalised output, and 1/rms
    + 5 c H the norm outputs cast to c by autocast, once per projection (q, k, v, gate, up) + 4 c Q
    SDPA's q, k and v (k and v repeated to every query head: HF repeats them when
                           a mask is given) and its output (the o-projection's input)
    + 4 heads + c S SDPA's log-sum-exp, and the boolean mask converted to the compute dtype (per
    layer) + 4 c I SwiGLU: gate and up outputs, silu(gate), and their product + (2 r + c)(Q + K)
    Qwen3 only: the q/k RMSNorms

In fp32 (no autocast) the q/k/v and gate/up projections share one saved input, 2 r H instead of 5 c
H. Emulated GEMMs (``lowp_linear``, ``lowp_attention``) save fp32 inputs (5 x 4 H + 4 Q + 4 I),
rounded q, k, v (4 Q + 8 K), the attention probabilities twice in fp32 and a boolean mask (8 heads S
+ S) instead. With gradient checkpointing a layer keeps only its fp32 input (r H); one layer is
recomputed in the backward. Shared by all layers: the rotary cos/sin (2 x 4 head_dim) and the
boolean mask (S bytes per token). Checked exactly against the tensors autograd saves on CPU (the
tests).

**Packing** (``packing``, suite/numerics/packing.py): a micro-batch is one row of N tokens. The
plan's rows are already full (prompt + max_new_tokens, no pads), so packing removes no token here;
what changes is the mask: SDPA's and eager's block-diagonal mask spans the whole row, so every S
above that counts mask columns becomes
N = B S (the boolean mask, its per-layer cast, the emulated attention's probabilities): quadratic in
the micro-batch, the price of packing without flash-attention's varlen kernel (which the plan does
not model). The head's input is still counted at every position, though packed it is gathered at the
response positions only.

**The log-prob pass** (``Trainer._logprobs``): the logits of the whole padded sequence in the
compute dtype (B S V c), and the fp32 log-softmax and entropy of the R response positions: the
backward of ``scoring.log_probs`` holds five fp32 (B, R, V) tensors at once (log-probs and their exp
saved, three gradients), the forward three beside the logits. With ``logprob_chunk`` = C the five
are of one chunk (B, C, V), but the logits stay alive for the chunks' recomputation and their
gradient accumulates over the chunks (B R V c). Packed, the head computes the logits of the response
positions only (``logits_to_keep``), B R V c. Not counted: each chunk's gradient is expanded to the
whole (B, R, V) slice before it is added (autograd's slice backward), a transient that makes the
plan 14% low on the chunked fp32 row of ``suite bench-memory --plan`` (docs/tasks.md).

**The sampler.** vLLM on a GPU takes ``gpu_memory_fraction`` of the device (weights and KV cache);
with ``kv_cache_gib`` (and on CPU) its weights plus that cache. With ``enable_sleep_mode`` it frees
both after each rollout (level 1: weights offloaded to host RAM, KV cache dropped), so its share
counts at sampling only; the CUDA context and graph pools of either process are not counted (the
plan counts tensors). The built-in engine holds its weights in the sampler dtype (plus an fp32 copy
when its GEMMs are emulated), a dense KV cache of every sequence it decodes at once (2 L K c_s per
position) and the prefill's activations.

The peak is the largest of four moments, each the sum of what is alive then: the end of the
trainer's forward, the start of its backward (the log-prob pass's gradients), a layer's backward,
and sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30


@dataclass(frozen=True)
class Arch:
    """A Llama / Qwen2 / Qwen3 decoder's dimensions (config.json's names in comments)."""

    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    mlp: int  # intermediate_size (per expert)
    vocab: int  # vocab_size
    head_dim: int = 0  # head_dim (0: hidden // heads)
    tied: bool = False  # tie_word_embeddings
    qk_norm: bool = False  # Qwen3's per-head q/k RMSNorm
    qkv_bias: bool = False  # Qwen2's q/k/v biases
    experts: int = 0  # mixture of experts: experts per layer (0: dense)
    top_k: int = 0  # experts per token

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q(self) -> int:
        return self.heads * self.d

    @property
    def kv(self) -> int:
        return self.kv_heads * self.d

    @property
    def layer_linear(self) -> int:
        """Linear weights of one decoder layer: q, k, v, o and the SwiGLU (every expert, and the
        router)."""
        mlp = 3 * self.hidden * self.mlp * max(self.experts, 1) + self.hidden * self.experts
        return self.hidden * (2 * self.q + 2 * self.kv) + mlp

    @property
    def layer_params(self) -> int:
        bias = (self.q + 2 * self.kv) if self.qkv_bias else 0
        return self.layer_linear + bias + 2 * self.hidden + (2 * self.d if self.qk_norm else 0)

    @property
    def head(self) -> int:
        return self.vocab * self.hidden

    @property
    def root(self) -> int:
        """The FSDP2 root unit: embeddings, final norm and (untied) head."""
        return self.head * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root

    @property
    def linear(self) -> int:
        """Every weight autocast rounds: the decoder's linears and the head (the embedding is a
        lookup)."""
        return self.layers * self.layer_linear + self.head


@dataclass(frozen=True)
class Shape:
    """What sizes one rank's memory in a run (suite/rl/plan.py fills it from the config)."""

    world: int = 1  # ranks the trainer is sharded over (nproc x nnodes); 1: no FSDP2
    micro_batch: int = 1  # sequences per forward/backward
    update_rows: int = 0  # sequences per rank per optimizer update (0: one micro-batch)
    defer_grad_sync: bool = False  # one reduce-scatter per update, after the last micro-batch
    prompt: int = 1  # longest prompt (tokens): every row is padded to prompt + response
    response: int = 1  # max_new_tokens
    checkpointing: bool = False
    logprob_chunk: int = 0
    compute: int = 4  # bytes of the trainer's compute dtype (autocast); 4 = fp32
    emulated: bool = False  # trainer GEMMs emulated in fp32 (lowp_linear, lowp_attention)
    logits: int = 0  # bytes of a logit (0: the compute dtype's; 4 with lm_head_fp32)
    kl_reference: bool = False  # a frozen copy of the masters for the KL term
    # torch (built-in engine), vllm, or none (the trainer alone: bench_memory)
    sampler: str = "torch"
    sampler_bytes: float = 4  # bytes per sampler weight (1 for fp8 linears, approximately)
    # bytes of the sampler's activations and KV cache (its dtype; bf16 for fp8)
    sampler_act: int = 4
    sampler_emulated: bool = False  # the built-in engine keeps an fp32 copy of its rounded weights
    # sequences the built-in engine decodes at once (rollouts, or evaluation chunks)
    gen_batch: int = 1
    vllm_bytes: int = 0  # vLLM's share (computed by the caller from the device and the config)
    vllm_asleep: bool = False  # vllm.enable_sleep_mode: the share is alive while sampling only
    packing: bool = False  # the micro-batch scored as one row (suite/numerics/packing.py)

    @property
    def seq(self) -> int:
        return self.prompt + self.response

    @property
    def deferred_sync(self) -> bool:
        """Whether unsharded gradients accumulate over micro-batches (sharded, deferred, more than
        one micro-batch)."""
        return self.defer_grad_sync and self.world > 1 and self.update_rows > self.micro_batch

    @property
    def mask_cols(self) -> int:
        """Key positions of the attention mask per token: a padded row's length, or the packed row's
        (B S)."""
        return self.micro_batch * self.seq if self.packing else self.seq


@dataclass(frozen=True)
class Item:
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Plan:
    states: list[Item]  # alive at every moment
    moments: dict[str, list[Item]]  # what else is alive at each candidate peak
    notes: list[str] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        base = sum(i.bytes for i in self.states)
        return {k: base + sum(i.bytes for i in v) for k, v in self.moments.items()}

    @property
    def peak_moment(self) -> str:
        return max(self.totals, key=self.totals.get)

    @property
    def peak(self) -> int:
        return self.totals[self.peak_moment]

    def items(self) -> list[Item]:
        """The items of the peak moment, states first."""
        return self.states + self.moments[self.peak_moment]


def layer_activation(a: Arch, s: Shape, r: int = 4) -> int:
    """Bytes one decoder layer saves for its backward, per token (the formula of the module
    docstring)."""
    c, H, S = s.compute, a.hidden, s.mask_cols
    norms = 2 * (2 * r * H + 4)
    # + the router's logits
    mlp = 4 * c * a.mlp * max(a.top_k, 1) + (4 * a.experts if a.experts else 0)
    qk = (2 * r + c) * (a.q + a.kv) if a.qk_norm else 0
    # fp32 rounded inputs of every projection; math attention: fp32 probabilities, rounded q, k, v
    if s.emulated:
        # the down projection's input is saved rounded, in fp32
        mlp += (4 - c) * a.mlp * max(a.top_k, 1)
        return norms + 5 * 4 * H + 4 * a.q + 4 * a.q + 8 * a.kv + 8 * a.heads * S + S + mlp + qk
    inputs = 2 * r * H if c == r else 5 * c * H
    return norms + inputs + 4 * c * a.q + 4 * a.heads + c * S + mlp + qk


def shared_activation(a: Arch, s: Shape, r: int = 4) -> int:
    """Bytes per token saved once for all layers: rotary cos/sin, the boolean mask, the final norm,
    the head's input, the token ids."""
    head_in = r * a.hidden if s.compute == r else (4 if s.emulated else s.compute) * a.hidden
    return 2 * 4 * a.d + s.mask_cols + 2 * r * a.hidden + 4 + head_in + 8


def logprob_pass(a: Arch, s: Shape, backward: bool) -> list[Item]:
    """The logits and the fp32 log-softmax/entropy of one micro-batch (``Trainer._logprobs``)."""
    B, R, V = s.micro_batch, s.response, a.vocab
    c = s.logits or s.compute
    chunk = s.logprob_chunk if 0 < s.logprob_chunk < R else R
    rows = R if s.packing else s.seq  # packed: the response positions' logits only (logits_to_keep)
    logits = Item("logits", B * rows * V * c, f"{B} x {rows} x {V:,} x {c} B "
                  + ("(the response positions, packed)" if s.packing
                     else "(the whole padded sequence)"))
    n = 5 if backward else 3
    fp32 = Item("log-softmax (fp32)", n * 4 * B * chunk * V,
                f"{n} x fp32 {B} x {chunk} x {V:,}"
                + (f" (chunks of {chunk})" if chunk < R else ""))
    if chunk < R:  # logits kept for the recomputation, their gradient accumulated over the chunks
        return [logits,
                fp32] + ([Item("logits gradient", B * R * V * c, "accumulated over the chunks")]
                                 if backward else [])
    return [fp32] if backward else [logits, fp32]


def plan(a: Arch, s: Shape) -> Plan:
    """The itemised peak of one rank (bytes)."""
    N, W, L = a.params, s.world, a.layers
    T = s.micro_batch * s.seq  # tokens of a micro-batch
    states = [Item("fp32 master weights", 4 * N // W, f"{N / 1e9:.3g}B parameters"
                   + (f" / {W} ranks" if W > 1 else "")),
              Item("fp32 gradients", 4 * N // W), Item("AdamW exp_avg, exp_avg_sq", 8 * N // W)]
    if W > 1:
        states.append(Item("FSDP2 unsharded", 4 * (2 * a.root + 3 * a.layer_params),
                           "root gathered for the step; 2 layers gathered, 1 layer's grads before "
                           "reduce-scatter"))
    if s.kl_reference:
        states.append(Item("KL reference masters", 4 * N // W))
    vllm = Item("vLLM", s.vllm_bytes, "weights + KV cache"
                + (", asleep during the updates" if s.vllm_asleep else ""))
    if s.sampler == "vllm" and not s.vllm_asleep:
        states.append(vllm)
    elif s.sampler == "torch":
        extra = 4 if s.sampler_emulated else 0
        states.append(Item("sampler weights", int(N * s.sampler_bytes)
                           + extra * (a.linear + a.head * (not a.tied)),
                           "built-in engine, one copy per rank"))

    # From the first micro-batch's backward to the last one's reduce-scatter (the trainer's moments,
    # not sampling).
    accumulated = (Item("accumulated gradients (unsharded)", 4 * N, "defer_grad_sync: fp32, until "
                                                                    "the last micro-batch")
                   if s.deferred_sync else None)
    fwd_copies, bwd_copies = weight_copies(a, s)
    per_layer = layer_activation(a, s)
    kept = (L * 4 * a.hidden if s.checkpointing else L * per_layer) + shared_activation(a, s)
    acts = Item("activations", T * kept, f"{s.micro_batch} x {s.seq} tokens, "
                + ("checkpointed: each layer's input" if s.checkpointing
                   else f"{L} layers x {per_layer:,} B/token"))
    moments = {
        "trainer forward": [Item("weight copies", fwd_copies, "compute dtype, "
                                                              f"{a.linear / 1e9:.3g}B linear "
                                                              "weights")
                            if fwd_copies else None, acts, *logprob_pass(a, s, backward=False),
                            accumulated],
        "trainer backward": [Item("weight copies", bwd_copies) if bwd_copies else None, acts,
                             *logprob_pass(a, s, backward=True),
                             Item("head gradient (unsharded)", 4 * a.head), accumulated],
        # A layer's backward: its activations (recomputed when checkpointed) and their gradients,
        # about as large.
        "layer backward": [Item("weight copies", bwd_copies) if bwd_copies else None, acts,
                           Item("one layer recomputed + its gradients",
                                T * per_layer * (2 if s.checkpointing else 1)),
                           accumulated],
    }
    if s.sampler == "torch":
        moments["sampling"] = sampling(a, s)
    # awake: the trainer's states and the engine's share
    elif s.sampler == "vllm" and s.vllm_asleep:
        moments["sampling"] = [vllm]
    moments = {k: [i for i in v if i is not None] for k, v in moments.items()}
    return Plan(states, moments)


def weight_copies(a: Arch, s: Shape) -> tuple[int, int]:
    """Rounded weights alive at the end of the forward and at the start of the backward (bytes).
    Autocast caches every cast for the whole forward, checkpointed or not; emulated GEMMs cache
    nothing and save an fp32 copy of each rounded weight; a checkpointed layer saves none until its
    recomputation."""
    if s.compute == 4:
        return 0, 0
    layers = a.layer_linear if s.checkpointing else a.layers * a.layer_linear
    if s.emulated:
        return 4 * (a.head + (0 if s.checkpointing else layers)), 4 * (a.head + layers)
    return s.compute * a.linear, s.compute * (a.head + layers)


def sampling(a: Arch, s: Shape) -> list[Item]:
    """The built-in engine's decode: a dense KV cache of every sequence, the prefill's largest
    activations."""
    B, P, cs = s.gen_batch, s.prompt, s.sampler_act
    kv = Item("KV cache", B * s.seq * a.layers * 2 * a.kv * cs,
              f"{B} sequences x {s.seq} positions")
    # Prefill (B, P): the SwiGLU's gate, up and product, q/k/v, and the attention scores (math
    # attention in fp32 on emulated or fp32 engines; SDPA's mask in the dtype otherwise); the last
    # position's logits in fp32.
    scores = B * P * P * (3 * 4 * a.heads if (s.sampler_emulated or cs == 4) else cs)
    prefill = B * P * cs * (3 * a.mlp + a.q + 2 * a.kv) + scores
    return [kv, Item("prefill", prefill, f"{B} x {P} prompt tokens"),
            Item("decode logits", B * a.vocab * (cs + 12), "logits, fp32 log-softmax, noise")]


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"
