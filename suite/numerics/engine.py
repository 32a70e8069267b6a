"""The built-in sampler (``engine=torch``): a small vLLM-like rollout engine for Llama models.

Why a separate engine and not the trainer's model: in real RL stacks the rollout engine
(vLLM, SGLang) holds its own copy of the weights in low precision and runs its own kernels:
incremental decoding against a KV cache, one query row at a time, while the trainer runs a
full-sequence forward under autocast on fp32 master weights. Same parameters, different
arithmetic: that is the training-inference mismatch this suite measures (arXiv 2510.26788,
section 2). This engine reproduces those differences on purpose and nothing else:

- weights are *cast* to the sampler dtype at every sync (as vLLM stores them), and every
  activation, the KV cache and the logits stay in that dtype; RMSNorm accumulates in fp32
  and rounds back, as HF and vLLM do;
- decoding is incremental (prefill, then one token per step against the cache);
- the sampled token's log-prob is ``log_softmax`` in fp32 of the low-precision logits
  divided by the temperature (vLLM's "processed" log-probs).

The model code is a direct functional transcription of ``transformers``' Llama
(``modeling_llama.py``: RMSNorm, rotary embedding with ``rotate_half``, GQA attention, SwiGLU
MLP), so in fp32 it agrees with the trainer to ~1e-6 and a test checks it. As vLLM does, the
Q/K/V projections and the gate/up projections are fused into one GEMM each at sync (same
dot products, fewer kernel launches). With ``backend="emulated"`` the low-precision GEMMs
and attention run through ``precision.lowp_linear`` / ``lowp_attention`` (see precision.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from suite.numerics import fp4, fp8, moe, truncation
from suite.numerics.fp8 import fake_quant_kv, fp8_linear, fp8_linear_inference, quantize_blockwise
from suite.numerics.perturbation import NoiseStream, Perturbation, perturb
from suite.numerics.precision import lowp_attention, lowp_linear

# The sampler's output and the special ids live in rollout.py; imported here, where callers look.
from suite.numerics.rollout import BOS, EOS, PAD, Rollout, eos_ids  # noqa: F401
from suite.numerics.sampling import draw, uniforms


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # As LlamaRMSNorm: accumulate in fp32, round back to the activation dtype, then scale.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TorchEngine:
    """Batched sampling with a KV cache from a copy of the weights held in ``dtype``."""

    # Prompts one generate() call of an evaluation takes (suite/rl/step.py evaluate): the KV cache
    # is dense, every sequence of a batch holds prompt + max_new_tokens positions, so the batch
    # bounds the memory (the plan's gen_batch).
    max_batch: int | None = 256

    def __init__(self, config, dtype: torch.dtype, backend: str = "native", device: str = "cpu",
                 lm_head_fp32: bool = False, functional_cache: bool = False,
                 quant: str | None = None, perturbation: Perturbation | None = None,
                 kv_quant: str | None = None):
        self.cfg = config
        # kv_quant="fp8": every K and V is stored in (and read back from) an FP8 E4M3 cache with one
        # scale per tensor, as vLLM's kv_cache_dtype="fp8" (fp8.fake_quant_kv); the weights and
        # activations keep ``dtype``.
        self.kv_quant = kv_quant
        # A synthetic mismatch added to the sampled distribution only (dose-response runs;
        # perturbation.py).
        self.perturbation = perturbation or Perturbation()
        # Mixture of experts (Mixtral layout): experts per token; routes to replay in score_full (B,
        # S, L, k).
        self.top_k = getattr(config, "num_experts_per_tok",
                             0) if getattr(config, "num_local_experts", 0) else 0
        self.replay_routes: torch.Tensor | None = None
        self.routes_seen: list[torch.Tensor] = []
        # quant="fp8": every decoder linear holds block-scaled E4M3 weights, quantised at each sync
        # from the trainer's weights rounded to the sampler dtype (bf16), the input vLLM's online
        # FP8 quantisation receives too, and quantises its input per 1x128 group. An FP4 name
        # (fp4.FORMATS: nvfp4, mxfp4; the a4 variants quantise activations too): the same in 4 bits.
        self.quant = quant
        # functional_cache: grow K/V by concatenation instead of writing a preallocated cache, so
        # the same code can run under autograd (the `exact` flow trains through this very forward).
        self.functional_cache = functional_cache
        self.dtype = dtype
        self.lm_head_fp32 = lm_head_fp32
        self.backend = backend
        self.device = device
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.eps = config.rms_norm_eps
        self.eos = torch.tensor(eos_ids(config), device=device)
        rope = getattr(config, "rope_scaling", None) or {}
        # only the default rotary is transcribed
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"engine=torch: rope scaling {rope} is not supported; use engine=vllm")
        theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
        # HF default rope: inverse frequencies in fp32 (LlamaRotaryEmbedding).
        self.inv_freq = 1.0 / (
            theta ** (
                torch.arange(0, self.head_dim, 2, dtype=torch.int64,
                             device=device).float() / self.head_dim))
        self.w: dict[str, torch.Tensor] = {}
        self.w32: dict[str, torch.Tensor] = {}
        self.head32: torch.Tensor | None = None
        self.wq: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.w_hat: dict[str, torch.Tensor] = {}  # emulated FP8: wq's GEMM operands, per sync
        self.fp8_master: dict[str, torch.Tensor] = {}

    # ---- weights -------------------------------------------------------------------------
    def sync(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the trainer's current weights, cast to the sampler dtype (no disk round trip)."""
        w = self.cast_weights(state_dict, detach=True)
        self.wq = {}
        if self.quant:
            # The bf16 copy, as vLLM's loader gets it (suite/numerics/vllm_engine.py): both FP8
            # samplers quantise the same values, so they hold the same E4M3 codes.
            for k in [k for k in w if k.endswith(("_proj.weight",))]:
                wk = w.pop(k)  # FP8: (fp8 (N, K), fp32 block scales); FP4: an fp4.SamplerWeight
                self.wq[k] = (quantize_blockwise(wk) if self.quant == "fp8"
                              else fp4.quantize_weight(wk, self.quant))
        # Emulated FP8 GEMMs read each weight dequantised; once per sync, not once per product.
        self.w_hat = ({k: fp8.weight_operand(*q) for k, q in self.wq.items()}
                      if self.quant == "fp8" and fp8.emulated(self.device) else {})
        # tied embeddings
        head = state_dict.get("lm_head.weight", state_dict["model.embed_tokens.weight"])
        # The fp32 output head (option lm_head_fp32) is the master weight itself, not a rounded
        # copy.
        self.head32 = head.detach().to(self.device, torch.float32,
                                       copy=True) if self.lm_head_fp32 else None
        bad = {str(v.dtype) for v in w.values() if v.dtype != self.dtype}
        assert not bad, f"sampler weights in {bad}, expected {self.dtype}"
        self.w = w
        # Emulated GEMMs read an fp32 copy of the *rounded* weights (exactly the same values).
        self.w32 = {k: v.float() for k, v in w.items()
                    if v.dim() == 2} if self.backend == "emulated" else {}

    def cast_weights(self, state_dict: dict[str, torch.Tensor], detach: bool,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Weights in the engine's dtype and layout (fused QKV and gate/up, as vLLM's
        QKVParallelLinear / MergedColumnParallelLinear). Without ``detach`` the casts stay in the
        autograd graph, so gradients reach the fp32 masters (the ``exact`` flow's trainer)."""
        dtype = dtype or self.dtype
        w = {k: (v.detach() if detach else v).to(self.device, dtype, copy=detach)
             for k, v in state_dict.items()}
        # tied embeddings (a subset: neither)
        if "lm_head.weight" not in w and "model.embed_tokens.weight" in w:
            w["lm_head.weight"] = w["model.embed_tokens.weight"]
        for i in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            for fused, parts in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                 ("mlp.gate_up_proj", ("gate_proj", "up_proj"))):
                pre = fused.split(".")[0] + "."
                for kind in ("weight", "bias"):
                    names = [p + pre + part + "." + kind for part in parts]
                    if names[0] in w:
                        w[p + fused + "." + kind] = torch.cat([w.pop(n) for n in names])
        return w

    def _lin(self, x, name):
        # training: quantise the master inside autograd (Jet-RL)
        if name + ".weight" in self.fp8_master:
            if self.quant != "fp8":  # quantisation-aware FP4: the sampler's forward, STE gradients
                return fp4.FP4LinearSTE.apply(x, self.fp8_master[name + ".weight"],
                                              self.w.get(name + ".bias"), self.dtype, self.quant)
            return fp8_linear(x, self.fp8_master[name + ".weight"], self.w.get(name + ".bias"),
                              self.dtype)
        if name + ".weight" in self.wq:
            if self.quant != "fp8":
                return fp4.fp4_linear(x, self.wq[name + ".weight"], self.w.get(name + ".bias"),
                                      self.dtype)
            qw, sw = self.wq[name + ".weight"]
            return fp8_linear_inference(x, qw, sw, self.w.get(name + ".bias"), self.dtype,
                                        w_hat=self.w_hat.get(name + ".weight"))
        w, b = self.w[name + ".weight"], self.w.get(name + ".bias")
        if self.backend == "emulated":
            return lowp_linear(x, w, b, self.dtype, w32=self.w32.get(name + ".weight"))
        return F.linear(x, w, b)

    def _attn(self, q, k, v, keep):
        # Plain math attention (grouped, no K/V copies) for fp32 and for emulated low precision:
        # at decode time (one query row) it is ~5x cheaper on CPU than the flash kernel.
        if self.backend == "emulated" or self.dtype == torch.float32:
            return lowp_attention(q, k, v, keep, self.head_dim ** -0.5, self.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep,
                                              enable_gqa=self.n_kv != self.n_heads)

    def _mat(self, x, w):
        """The engine's GEMM on a raw weight (an expert's slice): x @ w.T in the compute dtype."""
        return lowp_linear(x, w, None, self.dtype) if self.backend == "emulated" else F.linear(x, w)

    def _moe(self, h, p, layer):
        """Top-k experts of each token (its own router, or the replayed choice); records the own
        top-k."""
        B, S, H = h.shape
        x = h.reshape(-1, H)
        replay = (self.replay_routes[:, :, layer].reshape(B * S, -1)
                  if self.replay_routes is not None else None)
        w, idx, own = moe.route(self._lin(x, p + "mlp.gate"), self.top_k, replay)
        self.routes_seen.append(own.view(B, S, -1))
        y = moe.experts(x, self.w[p + "mlp.experts.gate_up_proj"],
                        self.w[p + "mlp.experts.down_proj"], idx, w, self._mat)
        return y.view(B, S, H)

    # ---- model ---------------------------------------------------------------------------
    def _forward(self, ids, pos, cache, t0, key_valid, all_positions: bool = False):
        """Run ids (B, S) at positions pos (B, S); write K/V at cache slots t0..t0+S-1.

        key_valid (B, t0+S) marks real (non-pad) keys. Returns logits of the last position (B, V),
        or of every position (B, S, V) with ``all_positions``.
        """
        B, S = ids.shape
        self.routes_seen = []  # MoE: each layer's top-k (B, S, k) of this call
        x = self.w["model.embed_tokens.weight"][ids]  # (B, S, H) in sampler dtype
        # Rotary tables for every position, computed once per generate call (fp32 as HF, then cast).
        cos, sin = self._rope[0][pos][:, None], self._rope[1][pos][:, None]  # (B, 1, S, D)
        T = t0 + S
        if S == 1:  # decode: the new token sees every real key so far
            mask = key_valid[:, None, :T]
        else:  # prefill: causal, real keys only
            causal = torch.ones(S, T, dtype=torch.bool, device=ids.device).tril(diagonal=t0)
            # A pad query would see no key at all (NaN softmax); let it see itself. Its output is
            # never used, but a NaN in its V row would poison every real query (0 * NaN = NaN).
            # (B, S, T)
            mask = (causal[None] & key_valid[:, None, :T]) | _diag(S, T, t0).to(ids.device)[None]
        for i in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            h = _rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            qkv = self._lin(h, p + "self_attn.qkv_proj")
            nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            q = qkv[..., :nq].view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
            k = qkv[..., nq:nq + nk].view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            v = qkv[..., nq + nk:].view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
            # Qwen3: per-head RMSNorm of q and k before rotary
            if p + "self_attn.q_norm.weight" in self.w:
                q = _rms_norm(q, self.w[p + "self_attn.q_norm.weight"], self.eps)
                k = _rms_norm(k, self.w[p + "self_attn.k_norm.weight"], self.eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            # what attention reads is what the cache holds, the new token's K/V included
            if self.kv_quant == "fp8":
                k, v = fake_quant_kv(k), fake_quant_kv(v)
            if self.functional_cache:
                kc, vc = cache[i]
                cache[i] = (kc, vc) = (k,
                                       v) if kc is None else (
                                           torch.cat([kc, k], 2), torch.cat([vc, v], 2))
            else:
                kc, vc = cache[i]
                kc[:, :, t0:T] = k
                vc[:, :, t0:T] = v
                kc, vc = kc[:, :, :T], vc[:, :, :T]
            a = self._attn(q, kc, vc, mask[:, None])
            x = x + self._lin(a.transpose(1, 2).reshape(B, S, -1), p + "self_attn.o_proj")
            h = _rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            if self.top_k:  # a mixture of experts (suite/numerics/moe.py)
                x = x + self._moe(h, p, i)
            else:
                gate, up = self._lin(h, p + "mlp.gate_up_proj").chunk(2, dim=-1)
                x = x + self._lin(F.silu(gate) * up, p + "mlp.down_proj")
        x = _rms_norm(x if all_positions else x[:, -1], self.w["model.norm.weight"], self.eps)
        if self.head32 is not None:
            return F.linear(x.float(), self.head32)  # (B, [S,] V) fp32
        return self._lin(x, "lm_head")  # (B, [S,] V) in sampler dtype

    # ---- sampling ------------------------------------------------------------------------
    def _start(self, ids: torch.Tensor, valid_prompt: torch.Tensor, n_new: int):
        """Prefill left-padded prompts ids (B, P); return (logits (B, V), cache, key_valid,
        last_pos)."""
        B, P = ids.shape
        # generated slots are always real keys
        valid = torch.ones(B, P + n_new, dtype=torch.bool, device=ids.device)
        valid[:, :P] = valid_prompt
        pos = (valid[:, :P].long().cumsum(1) - 1).clamp(min=0)
        if self.functional_cache:
            cache = [(None, None) for _ in range(self.cfg.num_hidden_layers)]
        else:
            shape = (B, self.n_kv, P + n_new, self.head_dim)
            cache = [(torch.zeros(shape, dtype=self.dtype, device=ids.device),
                      torch.zeros(shape, dtype=self.dtype, device=ids.device))
                     for _ in range(self.cfg.num_hidden_layers)]
        # (P+N, D/2) fp32, as HF
        freqs = torch.arange(P + n_new, device=ids.device).float()[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        self._rope = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        return self._forward(ids, pos, cache, 0, valid), cache, valid, pos[:, -1]

    # ---- sampling ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 top_p: float, generator: torch.Generator | torch.Tensor, top_k: int = 0,
                 keep_dist: bool = False, dist_topk: int = 0, *, logprobs: bool = True) -> Rollout:
        """Sample one response per prompt (prompts are left padded into one batch).
        ``logprobs``: the engines' shared interface (vLLM skips them when False); this decode loop
        has them anyway.

        Truncated sampling (``top_p < 1`` or ``top_k > 0``): the token is drawn from the kept set,
        and the recorded log-prob is renormalised over it, as vLLM's processed log-probs are; the
        kept ids and the kept mass are recorded (suite/numerics/truncation.py). ``keep_dist``: also
        record the full log-distribution, or with ``dist_topk`` = k its top-k head (log-probs and
        ids).

        ``generator``: a torch.Generator (one stream for the batch: the tokens depend on the batch
        composition), or a (B,) tensor of per-sequence seeds (``sequence_seeds``): sequence b then
        draws its tokens from its own stream, whatever else is in the batch or on which rank.
        """
        ids, valid_prompt = (t.to(self.device) for t in left_pad(prompts))
        B, P = ids.shape
        dev = ids.device
        noise = uniforms(generator, max_new_tokens,
                         dev) if isinstance(generator, torch.Tensor) else None
        tokens = torch.full((B, max_new_tokens), PAD, dtype=torch.long, device=dev)
        logps = torch.zeros(B, max_new_tokens, device=dev)
        mask = torch.zeros(B, max_new_tokens, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        logits, cache, valid, last_pos = self._start(ids, valid_prompt, max_new_tokens)
        trunc = truncation.active(top_p, top_k)
        kept, masses, dists = [], [], []
        routes = None
        # the experts each position ran through, (B, P + N, L, k); -1 where no forward ran (last
        # token)
        if self.top_k:
            routes = torch.full((B, P + max_new_tokens, self.cfg.num_hidden_layers, self.top_k), -1,
                                dtype=torch.long)
            routes[:, :P] = torch.stack(self.routes_seen, 2).cpu()
        z = NoiseStream(generator, logits.shape[-1],
                        dev) if self.perturbation.kind == "noise" else None
        for t in range(max_new_tokens):
            # fp32 log-softmax of the low-precision logits, after temperature (vLLM "processed").
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
            # the sampler draws from, and records, the perturbed distribution
            if self.perturbation.active:
                logp = perturb(logp, self.perturbation, z.next(B) if z is not None else None)
            keep = truncation.keep_mask(logp, top_p, top_k) if trunc else None
            tok = draw(logp, keep, generator if noise is None else noise[:, t])
            live = ~done
            tokens[:, t] = torch.where(live, tok, PAD)
            if trunc:
                ids_t = truncation.kept_ids(keep)
                lp, log_mass = truncation.renormalised(logp, tok, ids_t)
                kept.append(torch.where(live[:, None], ids_t, -1).cpu())
                masses.append(torch.where(live, log_mass.exp(), 1.0).cpu())
            else:
                lp = logp.gather(1, tok[:, None])[:, 0]
            if keep_dist:  # (log-probs, ids): all of them, or the top-k head
                k = min(dist_topk, logp.shape[-1])
                dists.append(tuple(x.cpu() for x in logp.topk(k, dim=-1)) if dist_topk
                             else (logp.cpu(), None))
            logps[:, t] = torch.where(live, lp, 0.0)
            mask[:, t] = live.float()
            done |= torch.isin(tok, self.eos)
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            last_pos = last_pos + 1
            logits = self._forward(tok[:, None], last_pos[:, None], cache, P + t, valid)
            if routes is not None:
                routes[:, P + t] = torch.stack(self.routes_seen, 2)[:, 0].cpu()
        return Rollout(prompt_ids=[list(p) for p in prompts], tokens=tokens[:, : t + 1].cpu(),
                       mask=mask[:, : t + 1].cpu(), logprobs=logps[:, : t + 1].cpu(),
                       truncated=(~done).tolist(), routes=None if routes is None
                       else routes[:, : P + t + 1],
                       kept=truncation.stack_kept(kept) if trunc else None,
                       kept_mass=torch.stack(masses, 1) if trunc else None,
                       dist=torch.stack([d for d, _ in dists], 1) if keep_dist else None,
                       dist_ids=(torch.stack([i for _, i in dists], 1) if keep_dist and dist_topk
                                 else None))

    def training_weights(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Weights for a differentiable forward from the trainer's fp32 masters (casts kept in the
        graph); FP8 layers get their fp32 master holding the values of its bf16 rounding (what
        ``sync`` quantises), with the gradient passed straight through to the master, quantised
        inside ``fp8_linear`` (FP4 layers: ``fp4.FP4LinearSTE``)."""
        w = self.cast_weights(params, detach=False)
        if self.lm_head_fp32:
            w["lm_head.fp32"] = params.get("lm_head.weight", params["model.embed_tokens.weight"])
        if self.quant:
            master = self.cast_weights(params, detach=False, dtype=torch.float32)
            for k in [k for k in w if k.endswith("_proj.weight")]:
                m = master[k]
                # forward: bf16 values; grad: fp32
                w["fp8:" + k] = m + (w.pop(k).detach().float() - m).detach()
        return w

    def _use(self, weights):
        """Swap in training weights (or restore the synced ones when ``weights`` is the saved
        tuple)."""
        saved = self.w, self.w32, self.head32, self.fp8_master
        if isinstance(weights, tuple):
            self.w, self.w32, self.head32, self.fp8_master = weights
        elif weights is not None:
            self.fp8_master = {k[4:]: v for k, v in weights.items() if k.startswith("fp8:")}
            self.w = {k: v for k, v in weights.items() if not k.startswith("fp8:")}
            self.w32 = {}
            self.head32 = weights.get("lm_head.fp32") if self.lm_head_fp32 else None
        return saved

    def score_full(self, ids: torch.Tensor, attn: torch.Tensor, n_resp: int, targets: torch.Tensor,
                   temperature: float, weights: dict[str, torch.Tensor],
                   routes: torch.Tensor | None = None,
                   kept: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (B, R) from ONE full-sequence pass of this engine's own forward.

        The unified FP8 flow's trainer: the sampler's computation is a subgraph of it (same
        code, same quantisers, same dtypes), only the shapes differ (Jet-RL, arXiv 2601.14243).
        ids/attn (B, P+R) left-padded prompt + right-padded response.
        """
        saved = self._use(weights)
        try:
            valid = attn.bool()
            valid[:, -n_resp:] = True  # as in generate: every generated slot is a real key
            pos = (attn.cumsum(1) - 1).clamp(min=0)
            freqs = torch.arange(ids.shape[1], device=ids.device).float()[:, None] * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
            cache = [(None, None) for _ in range(self.cfg.num_hidden_layers)]
            self_fc, self.functional_cache = self.functional_cache, True
            self.replay_routes = routes  # MoE routing replay (B, P+R, L, k), or None
            try:
                logits = self._forward(ids, pos, cache, 0, valid, all_positions=True)  # (B, P+R, V)
            finally:
                self.functional_cache, self.replay_routes = self_fc, None
            logp_all = torch.log_softmax(logits[:, -n_resp - 1:-1].float() / temperature, dim=-1)
            return _picked(logp_all, targets, kept), -(logp_all.exp() * logp_all).sum(-1)
        finally:
            self._use(saved)

    def score(self, ids: torch.Tensor, valid_prompt: torch.Tensor, tokens: torch.Tensor,
              temperature: float, weights: dict[str, torch.Tensor] | None = None,
              kept: torch.Tensor | None = None, full: bool = False) -> tuple[torch.Tensor, ...]:
        """Log-probs and entropies (B, R) of ``tokens`` by replaying the decode loop,
        teacher-forced.

        The same ops in the same order as ``generate`` on the same batch, so with the same weights
        the result is bitwise the sampler's (the ``exact`` flow). ``weights`` (from
        ``cast_weights(..., detach=False)``) replace the synced ones, keeping autograd. ``kept`` (B,
        R, K): the sampler's kept ids, renormalised over as ``generate`` does; ``full``: also return
        the (B, R, V) log-probs.
        """
        saved = self._use(weights)
        try:
            B, P = ids.shape
            R = tokens.shape[1]
            logits, cache, valid, last_pos = self._start(ids, valid_prompt, R)
            logps, ents, alls = [], [], []
            for t in range(R):
                logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
                logps.append(_picked(logp, tokens[:, t], None if kept is None else kept[:, t]))
                ents.append(-(logp.exp() * logp).sum(-1))
                if full:
                    alls.append(logp)
                if t < R - 1:
                    last_pos = last_pos + 1
                    logits = self._forward(tokens[:, t:t + 1], last_pos[:, None], cache, P + t,
                                           valid)
            out = torch.stack(logps, 1), torch.stack(ents, 1)
            return (*out, torch.stack(alls, 1)) if full else out
        finally:
            self._use(saved)


def _picked(logp_all: torch.Tensor, targets: torch.Tensor,
            kept: torch.Tensor | None) -> torch.Tensor:
    """Log-probs of ``targets`` from full log-probs (..., V); renormalised over ``kept`` ids where
    given, with the function the sampler used (truncation.renormalised), so identical kernels give
    identical numbers. A row whose kept ids are all -1 (past the end of its response) keeps the full
    log-prob."""
    full = logp_all.gather(-1, targets[..., None])[..., 0]
    if kept is None:
        return full
    renorm = truncation.renormalised(logp_all, targets, kept.to(logp_all.device))[0]
    return torch.where((kept >= 0).any(-1).to(logp_all.device), renorm, full)


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> ids (B, P) left padded with PAD, and the mask of real tokens (B, P)."""
    B, P = len(prompts), max(map(len, prompts))
    ids = torch.full((B, P), PAD, dtype=torch.long)
    valid = torch.zeros(B, P, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
        valid[b, P - len(p):] = True
    return ids, valid


def _diag(S: int, T: int, t0: int) -> torch.Tensor:
    """(S, T) mask with True where query s meets its own key slot t0+s."""
    m = torch.zeros(S, T, dtype=torch.bool)
    m[torch.arange(S), t0 + torch.arange(S)] = True
    return m
