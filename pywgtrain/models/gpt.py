"""A GPT (decoder-only transformer, pre-LayerNorm) built from pywgtrain ops.

Parameter names follow the common PyTorch layout (nanoGPT's): a
``transformer`` dict with ``wte``, ``wpe``, ``h.{i}`` blocks (``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``) and
``ln_f``, then ``lm_head`` (no bias), so a ``state_dict`` moves between this
model and the same architecture written in PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, cast

import numpy as np

from .. import functions as F
from .. import nn
from ..autograd import no_grad
from ..device import Device, resolve_device
from ..graphs import Graph, graph
from ..random import host_generator
from ..tensor import Labels, Tensor, tensor, zeros


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128  # context length
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in the Linear layers and LayerNorms
    tie_weights: bool = False  # lm_head shares wte's weight
    attention: str = "fused"  # "fused" (one kernel, no T x T scores in memory) or "plain" (bmm + softmax)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be an int >= 1, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ("fused", "plain"):
            raise ValueError(f"GPTConfig.attention must be 'fused' or 'plain', got {self.attention!r}")


# Named sizes: a few minutes on a CPU adapter; nanoGPT's character model; GPT-2 small.
CONFIGS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64),
    "small": GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128),
    "char": GPTConfig(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2),
    "gpt2": GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


def _dropout(p):
    return nn.Dropout(p) if p > 0 else None


def _project(proj, y, dropout, residual):
    """A branch's output projection, its dropout, then + residual: the GEMM
    adds the residual itself when no dropout comes between (none, or one in
    eval mode, where it is the identity)."""
    if dropout is None or not dropout.training:
        return proj(y, residual=residual)
    y = dropout(proj(y))
    return y if residual is None else residual + y


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, device, rng):
        super().__init__()
        c = cfg.n_embd
        self.n_head, self.n_embd, self.attention = cfg.n_head, c, cfg.attention
        self.c_attn = nn.Linear(c, 3 * c, bias=cfg.bias, device=device, rng=rng)
        self.c_proj = nn.Linear(c, c, bias=cfg.bias, device=device, rng=rng)
        self.resid_dropout = _dropout(cfg.dropout)
        self._masks = {}

    def _causal_mask(self, t, dev):
        m = self._masks.get(t)
        if m is None:
            m = tensor(np.triu(np.full((t, t), -np.inf, np.float32), 1), dev)
            self._masks[t] = m
        return m

    def forward(self, x, residual=None):
        """The attention branch, plus ``residual`` when given (added by the
        projection's GEMM unless a dropout comes between)."""
        b, t, c = x.shape
        qkv = self.c_attn(x)
        if self.attention == "fused":
            y = F.causal_self_attention_qkv(qkv, self.n_head)
        else:
            y = self.plain_attention(qkv, b, t)
        return _project(self.c_proj, y, self.resid_dropout, residual)

    def plain_attention(self, qkv, b, t):
        """softmax(q k^T / sqrt(d) + causal mask) v with batched GEMMs (the reference path)."""
        h, c = self.n_head, self.n_embd
        d = c // h
        # Under autocast qkv and y are float16, and the head views need float32 (exact both ways).
        if qkv.dtype != np.float32:
            qkv = qkv.float()
        heads = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).reshape(3, b * h, t, d)
        q, k, v = heads[0], heads[1], heads[2]
        scores = F.bmm(q, k, trans_b=True) * (1.0 / math.sqrt(d)) + self._causal_mask(t, qkv.device)
        y = F.bmm(scores.softmax(-1), v).float()
        return y.reshape(b, h, t, d).permute(0, 2, 1, 3).reshape(b, t, c)


class MLP(nn.Module):
    def __init__(self, cfg, device, rng):
        super().__init__()
        c = cfg.n_embd
        self.c_fc = nn.Linear(c, 4 * c, bias=cfg.bias, device=device, rng=rng)
        self.c_proj = nn.Linear(4 * c, c, bias=cfg.bias, device=device, rng=rng)
        self.dropout = _dropout(cfg.dropout)

    def forward(self, x, residual=None):
        """The MLP branch, plus ``residual`` when given (as CausalSelfAttention): one
        ``F.mlp`` op (GELU (erf) fused into the first GEMM, its derivative into the
        backward's), the residual added by the last GEMM unless dropout comes between."""
        weights, biases = [self.c_fc.weight, self.c_proj.weight], [self.c_fc.bias, self.c_proj.bias]
        if self.dropout is None or not self.dropout.training:
            return F.mlp(x, weights, biases, ["gelu", None], residual)
        y = self.dropout(F.mlp(x, weights, biases, ["gelu", None]))
        return y if residual is None else residual + y


class Block(nn.Module):
    def __init__(self, cfg, device, rng):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias, device=device)
        self.attn = CausalSelfAttention(cfg, device, rng)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias, device=device)
        self.mlp = MLP(cfg, device, rng)

    def forward(self, x):
        x = self.attn(self.ln_1(x), residual=x)
        return self.mlp(self.ln_2(x), residual=x)


class GPT(nn.Module):
    """``GPT(config)(ids)`` -> logits [B, T, vocab] for int ids [B, T] (T <= block_size).

    Initialized as GPT-2 (normal(0, 0.02) weights, zero biases, residual
    projections scaled by 1/sqrt(2 n_layer)) from ``seed``."""

    def __init__(
        self,
        config: Optional[GPTConfig] = None,
        device: Optional[Device] = None,
        seed: Optional[int] = 0,
        **overrides: Any,
    ) -> None:
        super().__init__()
        cfg = config if config is not None else GPTConfig()
        if overrides:
            cfg = GPTConfig(**{**asdict(cfg), **overrides})
        self.config = cfg
        dev = resolve_device(device)
        rng = np.random.default_rng(seed)
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(cfg.vocab_size, cfg.n_embd, device=dev, rng=rng),
                "wpe": nn.Embedding(cfg.block_size, cfg.n_embd, device=dev, rng=rng),
                "h": nn.ModuleList([Block(cfg, dev, rng) for _ in range(cfg.n_layer)]),
                "ln_f": nn.LayerNorm(cfg.n_embd, bias=cfg.bias, device=dev),
            }
        )
        self.drop = _dropout(cfg.dropout)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False, device=dev, rng=rng)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer["wte"].weight
        self._init_weights(rng)
        self._positions: dict[Any, Tensor] = {}

    def _init_weights(self, rng):
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        with no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "ln_" in name:
                    p.fill_(1.0)
                else:
                    std = proj_std if name.endswith("c_proj.weight") else 0.02
                    p.copy_(rng.normal(0.0, std, p.shape).astype(np.float32))

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer["wpe"].weight.numel() if exclude_embeddings else n

    def _check_ids(self, ids: Labels) -> Tensor:
        if isinstance(ids, Tensor):
            if ids.dtype != np.int32:
                raise TypeError(f"GPT: ids must be an int32 tensor, got {ids.dtype.name}")
            shape = ids.shape
        else:
            arr = np.asarray(ids)
            if arr.dtype.kind not in "iu":
                raise TypeError(f"GPT: ids must be integer token ids, got dtype {arr.dtype.name}")
            shape = arr.shape
            if arr.size and (arr.min() < 0 or arr.max() >= self.config.vocab_size):
                raise ValueError(
                    f"GPT: token ids must lie in [0, {self.config.vocab_size}), got range [{arr.min()}, {arr.max()}]"
                )
            ids = tensor(np.ascontiguousarray(arr, np.int32), self.device)
        if len(shape) != 2:
            raise ValueError(f"GPT: ids must be [batch, time], got shape {shape}")
        if shape[1] > self.config.block_size:
            raise ValueError(
                f"GPT: sequence of {shape[1]} tokens is longer than the context (block_size={self.config.block_size})"
            )
        return ids

    def _position_ids(self, t):
        """[1, t] position ids: the position embeddings are gathered once and
        broadcast over the batch, so their gradient is a sum over the batch
        (the add's backward) and the embedding backward sees t unique ids
        instead of b * t repeated ones (H100, nanoGPT char: 0.4 ms a step)."""
        pos = self._positions.get(t)
        if pos is None:
            pos = tensor(np.arange(t, dtype=np.int32).reshape(1, t), self.device)
            self._positions[t] = pos
        return pos

    def forward(self, ids: Labels) -> Tensor:
        ids = self._check_ids(ids)
        b, t = ids.shape
        tr = self.transformer
        x = tr["wte"](ids) + tr["wpe"](self._position_ids(t))
        if self.drop is not None:
            x = self.drop(x)
        for block in cast(nn.ModuleList, tr["h"]):
            x = block(x)
        return self.lm_head(tr["ln_f"](x))

    def generate(
        self,
        ids: Labels,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        seed: Optional[int] = None,
        capture: bool = True,
    ) -> np.ndarray:
        """Continue int token ids [B, T] (or [T]) by ``max_new_tokens`` sampled
        tokens; returns the whole sequences as an int32 array. The network runs
        on the GPU with a key/value cache (each new token costs one position's
        work); sampling (temperature, top-k) uses the last logits on the host.
        The model sees at most ``block_size`` tokens, as nanoGPT's generate: a
        longer prompt is cropped to its last ``block_size`` tokens (the returned
        sequences keep all of it), and when the context fills, the cache restarts
        from the last half context (at least one token).

        ``seed``: an int seeds a NumPy generator for this call; ``None`` draws the
        sampling seed from the device's ``pywgtrain.random`` generator (and
        advances it), so ``pw.manual_seed`` makes the call reproducible.

        ``capture``: the prompt runs op by op, then each new token replays one
        decode step captured once per batch size and parameter buffers (``pywgtrain.Graph``; the position
        lives on the device, so one graph serves every position). Greedy decoding
        (temperature 0) picks each token on the device and reads the tokens back
        once per context (``block_size`` tokens); sampling reads each step's
        logits back and samples on the host, as the eager path. The step runs op
        by op instead (the eager path) with ``capture=False``, inside a
        ``Device.batch()`` block (no capture there), and where the decode kernels
        do not apply: ``block_size`` past ``functions.DECODE_MAX_CAPACITY``,
        head size over 128, logits [B, vocab] or a layer's cache past one storage binding."""
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"generate: ids must be integer token ids, got dtype {arr.dtype.name}")
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2 or arr.shape[1] < 1:
            raise ValueError(f"generate: ids must be [batch, time] with time >= 1, got shape {np.asarray(ids).shape}")
        cfg = self.config
        if arr.min() < 0 or arr.max() >= cfg.vocab_size:
            raise ValueError(
                f"generate: token ids must lie in [0, {cfg.vocab_size}), got range [{arr.min()}, {arr.max()}]"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not (temperature >= 0.0):
            raise ValueError(f"generate: temperature must be >= 0 (0: greedy), got {temperature}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
            raise ValueError(f"generate: top_k must be None or an int >= 1, got {top_k!r}")
        rng = np.random.default_rng(seed) if seed is not None else host_generator(self.device)
        out = np.ascontiguousarray(arr, np.int32)
        keep = max(1, cfg.block_size // 2)  # tokens the cache restarts from when the context fills
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                step = self._decode_step(out.shape[0]) if capture else None
                if step is not None:
                    return step.generate(out, int(max_new_tokens), temperature, top_k, rng, keep)
                cache = _KVCache(self, out.shape[0])
                logits = _forward_cached(self, out[:, -cfg.block_size :], cache)
                for _ in range(int(max_new_tokens)):
                    last = logits.numpy()[:, -1, :].astype(np.float64)
                    nxt = _sample(last, temperature, top_k, rng)
                    out = np.concatenate([out, nxt[:, None]], 1)
                    if cache.length >= cfg.block_size:  # context full: restart from the recent half
                        cache = _KVCache(self, out.shape[0])
                        logits = _forward_cached(self, out[:, -keep:], cache)
                    else:
                        logits = _forward_cached(self, nxt[:, None], cache)
        finally:
            self.train(was_training)
        return out

    def _decode_step(self, batch: int) -> Optional["_DecodeStep"]:
        """The captured decode step for ``batch`` sequences (kept for the last batch
        size and these parameter buffers), or None where it does not apply."""
        cfg = self.config
        dev = self.device
        d = cfg.n_embd // cfg.n_head
        if (
            dev is None
            or dev._in_batch()  # a capture is a batch of its own
            or cfg.block_size > F.DECODE_MAX_CAPACITY
            or d > F.ATTN_MAX_HEAD_DIM
            or batch * max(cfg.vocab_size, cfg.block_size * cfg.n_embd) * 4
            > dev.limits["max_storage_buffer_binding_size"]  # logits and each cache in one binding
        ):
            return None
        # The graph binds the parameters' buffers: a parameter moved to another buffer (AdamW's
        # arena, a replaced Parameter) needs a new capture.
        bufs = tuple(p.untyped_storage().buf for p in self.parameters())
        step = self.__dict__.get("_decode")
        if (
            step is None
            or step.batch != batch
            or len(step.bufs) != len(bufs)
            or any(a is not b for a, b in zip(step.bufs, bufs))
        ):
            # Kept out of Module's attribute tracking (not a parameter, module or plain value that a
            # captured training step could depend on); the old step's caches go first.
            self.__dict__.pop("_decode", None)
            step = _DecodeStep(self, batch, bufs)
            self.__dict__["_decode"] = step
        return step

    @staticmethod
    def loss(logits: Tensor, targets: Labels, ignore_index: int = -100) -> Tensor:
        """Mean next-token cross-entropy of logits [B, T, V] against targets [B, T]."""
        v = logits.shape[-1]
        flat = targets.reshape(-1) if isinstance(targets, Tensor) else np.asarray(targets).reshape(-1)
        return F.cross_entropy(logits.reshape(-1, v), flat, ignore_index=ignore_index)


class _KVCache:
    """Keys and values of every layer for the positions seen so far: [B*H, block_size, D] each."""

    def __init__(self, model, batch):
        cfg = model.config
        d = cfg.n_embd // cfg.n_head
        shape = (batch * cfg.n_head, cfg.block_size, d)
        from ..tensor import empty

        self.k = [empty(shape, np.float32, model.device) for _ in range(cfg.n_layer)]
        self.v = [empty(shape, np.float32, model.device) for _ in range(cfg.n_layer)]
        self.length = 0


class _DecodeStep:
    """One token's forward for ``batch`` sequences over a key/value cache of
    ``block_size`` rows, captured into a Graph on its first run and replayed for
    every later token. What changes per token lives on the device: ``tok`` (the
    token fed, [B, 1]) and ``pos`` (its position, [1, 1]); the step ends with
    ``next_token``, which writes the argmax into ``tok`` and ``hist`` [B,
    block_size + 1] (column pos + 1) and advances ``pos``, so greedy steps chain
    without the host."""

    def __init__(self, model: GPT, batch: int, bufs: tuple) -> None:
        cfg = model.config
        dev = model.device
        self.model, self.batch, self.bufs = model, batch, bufs
        self.cache = _KVCache(model, batch)
        self.tok = zeros((batch, 1), np.int32, dev)
        self.pos = zeros((1, 1), np.int32, dev)
        self.hist = zeros((batch, cfg.block_size + 1), np.int32, dev)
        self.graph: Optional[Graph] = None
        self.logits: Optional[Tensor] = None  # [B, 1, V] of the last step

    def _forward(self):
        model = self.model
        tr = model.transformer
        x = tr["wte"](self.tok) + tr["wpe"](self.pos)
        for i, block in enumerate(tr["h"]):
            attn = block.attn
            qkv = attn.c_attn(block.ln_1(x))
            y = F.kv_cache_attention(qkv, self.cache.k[i], self.cache.v[i], self.pos, attn.n_head)
            x = attn.c_proj(y, residual=x)
            x = block.mlp(block.ln_2(x), residual=x)
        logits = model.lm_head(tr["ln_f"](x))
        F.next_token(logits, self.tok, self.hist, self.pos)
        return logits

    def run(self):
        """One decode step: the token in ``tok`` at position ``pos``."""
        if self.graph is None:
            g = Graph()
            with graph(g, self.model.device):
                self.logits = self._forward()
            self.graph = g
        else:
            self.graph.replay()

    def prefill(self, ids, greedy):
        """Run the context ids [B, t] op by op into the cache (from row 0); greedy:
        the first new token picked on the device (``hist`` column t, ``pos`` = t),
        else the last position's logits [B, V] returned for the host to sample."""
        t = ids.shape[1]
        self.cache.length = 0
        logits = _forward_cached(self.model, ids, self.cache)
        if not greedy:
            return logits.numpy()[:, -1, :].astype(np.float64)
        self.pos.copy_(np.full((1, 1), t - 1, np.int32))
        F.next_token(logits, self.tok, self.hist, self.pos)
        return None

    def generate(self, out, n, temperature, top_k, rng, keep):
        """GPT.generate's loop over the captured step (see there)."""
        cap = self.model.config.block_size
        greedy = temperature == 0.0
        ctx = out[:, -cap:]
        while n > 0:
            t = ctx.shape[1]
            last = self.prefill(ctx, greedy)
            steps = min(n - 1, cap - t)  # a step at position p fills cache row p < cap
            if greedy:
                for _ in range(steps):
                    self.run()
                new = self.hist.numpy()[:, t : t + steps + 1]
            else:
                picked = []
                for i in range(steps + 1):
                    nxt = _sample(last, temperature, top_k, rng)
                    picked.append(nxt)
                    if i == steps:
                        break
                    self.tok.copy_(nxt[:, None])
                    self.pos.copy_(np.full((1, 1), t + i, np.int32))
                    self.run()
                    last = cast(Tensor, self.logits).numpy()[:, -1, :].astype(np.float64)
                new = np.stack(picked, 1)
            out = np.concatenate([out, new.astype(np.int32)], 1)
            n -= new.shape[1]
            ctx = out[:, -keep:]
        return out


def _write_rows(src, dst, pos):
    """dst[:, pos:pos+t, :] = src ([BH, t, D] into [BH, Tmax, D])."""
    with no_grad():  # the cache holds values, not history
        dst[:, pos : pos + src.shape[1]].copy_(src)


def _attend_cached(self, x, layer, cache, pos, residual):
    """residual + CausalSelfAttention over new tokens x [B, t, C] at positions pos.., appending to the cache."""
    b, t, c = x.shape
    h = self.n_head
    d = c // h
    qkv = self.c_attn(x)
    heads = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).reshape(3, b * h, t, d)
    q, k, v = heads[0], heads[1], heads[2]
    _write_rows(k, cache.k[layer], pos)
    _write_rows(v, cache.v[layer], pos)
    n = pos + t
    keys = cache.k[layer][:, :n]
    values = cache.v[layer][:, :n]
    scores = F.bmm(q, keys, trans_b=True) * (1.0 / math.sqrt(d))
    if t > 1:  # prompt: causal among the new tokens (earlier positions are all visible)
        mask = np.zeros((t, n), np.float32)
        mask[:, pos:] = np.triu(np.full((t, t), -np.inf, np.float32), 1)
        scores = scores + tensor(mask, x.device)
    y = F.bmm(scores.softmax(-1), values)
    return self.c_proj(y.reshape(b, h, t, d).permute(0, 2, 1, 3).reshape(b, t, c), residual=residual)


def _forward_cached(model, ids, cache):
    """Logits of the last position for new ids [B, t], extending the cache."""
    b, t = ids.shape
    pos = cache.length
    tr = model.transformer
    positions = tensor(np.broadcast_to(np.arange(pos, pos + t, dtype=np.int32), (b, t)).copy(), model.device)
    x = tr["wte"](tensor(np.ascontiguousarray(ids, np.int32), model.device)) + tr["wpe"](positions)
    for i, block in enumerate(tr["h"]):
        x = _attend_cached(block.attn, block.ln_1(x), i, cache, pos, residual=x)
        x = block.mlp(block.ln_2(x), residual=x)
    cache.length = pos + t
    return model.lm_head(tr["ln_f"](x[:, t - 1 :]))  # [B, 1, V]


def _sample(logits, temperature, top_k, rng):
    if temperature == 0.0:
        return logits.argmax(-1).astype(np.int32)
    z = logits / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, -1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p], np.int32)
