"""Multi-head attention and the transformer encoder, as torch.nn's: the same
arguments, parameter names (state_dicts move between the two) and masks."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Union

import numpy as np

from ... import functions as F
from ...device import Device, resolve_device
from ...tensor import Tensor, TensorLike
from .. import init
from ..parameter import Parameter
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm


def _additive_mask(mask: Any, dev: Device, what: str) -> Optional[Tensor]:
    """An nn.MultiheadAttention mask as a float mask to add to the scores: a boolean NumPy
    mask is True where attention is NOT allowed (torch's convention here, the opposite of
    scaled_dot_product_attention's), a float one is added as it is."""
    if mask is None:
        return None
    if isinstance(mask, np.ndarray) and mask.dtype == np.bool_:
        return F.tensor(np.where(mask, -np.inf, 0.0).astype(np.float32), dev)
    if isinstance(mask, (Tensor, np.ndarray)):
        return F._float_tensor(mask, dev, "MultiheadAttention", what)
    raise TypeError(
        f"MultiheadAttention: {what} must be a boolean NumPy array or a float mask, got {type(mask).__name__}"
    )


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: ``out_proj(attention(q W_q, k W_k, v W_v))`` over
    ``num_heads`` heads; parameters ``in_proj_weight`` [3E, E] (Xavier-uniform),
    ``in_proj_bias`` (zeros), ``out_proj.weight`` / ``out_proj.bias`` (zeros), as torch's.
    Inputs [L, N, E] ([N, L, E] with ``batch_first``, or unbatched [L, E]).

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights)``: weights
    averaged over heads ([N, L, S]) or per head, None when ``need_weights=False``, which
    lets unmasked attention run the fused kernels. Boolean masks are True where attention is
    not allowed; ``key_padding_mask`` [N, S], ``attn_mask`` [L, S] or [N * heads, L, S]; float
    masks are added. ``is_causal`` is a hint that ``attn_mask`` is the causal mask (it must be
    given), as torch's. ``add_bias_kv``, ``add_zero_attn`` and ``kdim`` / ``vdim`` other than
    ``embed_dim`` raise."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        batch_first: bool = False,
        device: Optional[Device] = None,
        seed: Optional[int] = None,
        rng: Optional[np.random.Generator] = None,
    ) -> None:
        super().__init__()
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError(f"MultiheadAttention: embed_dim must be an int >= 1, got {embed_dim!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"MultiheadAttention: num_heads must be an int >= 1, got {num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not implemented")
        if kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: kdim / vdim other than embed_dim are not implemented")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        dev = resolve_device(device)
        rng = rng if rng is not None else np.random.default_rng(seed)
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform_ of [3E, E]
        self.in_proj_weight = Parameter(rng.uniform(-bound, bound, (3 * embed_dim, embed_dim)), dev)
        if bias:
            self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, np.float32), dev)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=dev, rng=rng)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(embed_dim, np.float32), dev)

    def _project(self, x: Tensor, part: int) -> Tensor:
        """x @ W_part^T + b_part for part 0 (q), 1 (k), 2 (v) of the packed projection."""
        e = self.embed_dim
        w = self.in_proj_weight[part * e : (part + 1) * e]
        b = None if self.in_proj_bias is None else self.in_proj_bias[part * e : (part + 1) * e]
        return F.linear(x, w, b)

    def _heads(self, x: Tensor) -> Tensor:
        n, length, _ = x.shape
        return x.reshape(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        query: TensorLike,
        key: TensorLike,
        value: TensorLike,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        dev = self.in_proj_weight.device
        q, k, v = (
            F._float_tensor(x, dev, "MultiheadAttention", n)
            for x, n in ((query, "query"), (key, "key"), (value, "value"))
        )
        unbatched = q.ndim == 2
        if unbatched:
            q, k, v = (x.unsqueeze(1) for x in (q, k, v))
        if q.ndim != 3 or q.shape[-1] != self.embed_dim:
            raise ValueError(
                f"MultiheadAttention: query must be [L, N, {self.embed_dim}] (or batch_first), got {q.shape}"
            )
        if k.shape != v.shape or k.ndim != 3 or k.shape[-1] != self.embed_dim:
            raise ValueError(f"MultiheadAttention: key {k.shape} and value {v.shape} must be [S, N, {self.embed_dim}]")
        if not self.batch_first or unbatched:  # work on [N, L, E]
            q, k, v = (x.transpose(0, 1) for x in (q, k, v))
        n, lq, e = q.shape
        s = k.shape[1]
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "MultiheadAttention: is_causal is a hint that attn_mask is the causal mask; pass attn_mask"
            )
        p = self.dropout if self.training else 0.0
        plain = not need_weights and key_padding_mask is None and (attn_mask is None or is_causal) and p == 0.0
        if query is key and key is value:  # self-attention: one product for q, k and v
            qkv = F.linear(q, self.in_proj_weight, self.in_proj_bias)
            if plain and self.head_dim <= F.ATTN_MAX_HEAD_DIM:  # the kernels read q, k, v out of qkv in place
                out = F._self_attention_qkv(qkv, self.num_heads, None, bool(is_causal), "MultiheadAttention")
                return self._finish(out, None, lq, e, unbatched)
            qh, kh, vh = (self._heads(qkv[..., i * e : (i + 1) * e]) for i in range(3))
        else:
            qh, kh, vh = (self._heads(self._project(x, i)) for i, x in enumerate((q, k, v)))
        mask = _additive_mask(attn_mask, dev, "attn_mask")
        if mask is not None and mask.ndim == 3:
            mask = mask.reshape(n, self.num_heads, lq, s)
        pad = _additive_mask(key_padding_mask, dev, "key_padding_mask")
        if pad is not None:
            if pad.shape != (n, s):
                raise ValueError(f"MultiheadAttention: key_padding_mask must be [{n}, {s}], got {pad.shape}")
            pad = pad.reshape(n, 1, 1, s)
            mask = pad if mask is None else mask + pad
        weights = None
        if need_weights:
            scores = F.matmul(qh, kh.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if mask is not None:
                scores = scores + mask
            w = F.softmax(scores, -1)
            if p > 0.0:
                w = F.dropout(w, p)
            out = F.matmul(w, vh)
            weights = w.mean(1) if average_attn_weights else w
        else:
            causal = bool(is_causal) and pad is None  # torch's hint: the causal mask replaces attn_mask
            out = F.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=None if causal else mask, dropout_p=p, is_causal=causal
            )
        return self._finish(out.transpose(1, 2).reshape(n, lq, e), weights, lq, e, unbatched)

    def _finish(
        self, heads: Tensor, weights: Optional[Tensor], lq: int, e: int, unbatched: bool
    ) -> tuple[Tensor, Optional[Tensor]]:
        """The output projection of [N, L, E] attention results, back in the caller's layout."""
        out = self.out_proj(heads)
        if not self.batch_first or unbatched:
            out = out.transpose(0, 1)
        if unbatched:
            out = out.reshape(lq, e)
            if weights is not None:
                weights = weights.reshape(weights.shape[1:])
        return out, weights

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, batch_first={self.batch_first}"


class _TransformerLayer(Module):
    """What the encoder and decoder layers share: their arguments (torch's), self-attention
    (``self_attn``, ``dropout1``), the feed-forward block (``linear1``, ``activation``,
    ``dropout``, ``linear2`` and its dropout) and ``norms`` LayerNorms ``norm1`` ... ."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Union[str, Callable[[Tensor], Tensor]] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Optional[Device] = None,
        seed: Optional[int] = None,
        rng: Optional[np.random.Generator] = None,
    ) -> None:
        super().__init__()
        what = type(self).__name__
        if isinstance(activation, str) and activation not in ("relu", "gelu"):
            raise ValueError(f"{what}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
        dev = resolve_device(device)
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, device=dev, rng=rng)
        if self.cross_attention:
            self.multihead_attn = MultiheadAttention(
                d_model, nhead, dropout, bias, batch_first=batch_first, device=dev, rng=rng
            )
        fused = activation if isinstance(activation, str) else None
        self.linear1 = Linear(d_model, dim_feedforward, bias, dev, rng=rng, activation=fused)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, dev, rng=rng)
        self.norm_first = bool(norm_first)
        norms = 3 if self.cross_attention else 2
        for i in range(1, norms + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, layer_norm_eps, bias=bias, device=dev))
        for i in range(1, norms + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = activation
        self._config: dict[str, Any] = dict(
            d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
            layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias, device=dev,
        )  # fmt: skip

    cross_attention = False  # the decoder's attention over the memory (multihead_attn, norm3)

    def _sa(self, x: Tensor, mask: Any, pad: Any, is_causal: bool) -> Tensor:
        out = self.self_attn(x, x, x, key_padding_mask=pad, need_weights=False, attn_mask=mask, is_causal=is_causal)[0]
        return self.dropout1(out)

    def _ff(self, x: Tensor) -> Tensor:
        h = self.linear1(x)
        if not isinstance(self.activation, str):
            h = self.activation(h)
        last = self.dropout3 if self.cross_attention else self.dropout2
        return last(self.linear2(self.dropout(h)))


class TransformerEncoderLayer(_TransformerLayer):
    """``torch.nn.TransformerEncoderLayer``: self-attention and a feed-forward block
    (``linear1``, ``activation``, ``dropout``, ``linear2``), each around a residual with
    ``norm1`` / ``norm2`` after it (``norm_first``: before), ``dropout1`` / ``dropout2`` on
    the branches. ``activation`` "relu" or "gelu" (fused into linear1's GEMM) or a callable.
    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``; masks as
    ``MultiheadAttention``'s."""

    def forward(
        self, src: TensorLike, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False
    ) -> Tensor:
        x = F._float_tensor(src, self.linear1.weight.device, "TransformerEncoderLayer", "src")
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


class TransformerDecoderLayer(_TransformerLayer):
    """``torch.nn.TransformerDecoderLayer``: self-attention (``self_attn``), attention over
    the encoder's output (``multihead_attn``) and the feed-forward block, each around a
    residual with ``norm1`` / ``norm2`` / ``norm3`` after it (``norm_first``: before).
    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``; masks as
    ``MultiheadAttention``'s."""

    cross_attention = True

    def _mha(self, x: Tensor, mem: Tensor, mask: Any, pad: Any, is_causal: bool) -> Tensor:
        out = self.multihead_attn(
            x, mem, mem, key_padding_mask=pad, need_weights=False, attn_mask=mask, is_causal=is_causal
        )[0]
        return self.dropout2(out)

    def forward(
        self,
        tgt: TensorLike,
        memory: TensorLike,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Tensor:
        dev = self.linear1.weight.device
        x = F._float_tensor(tgt, dev, "TransformerDecoderLayer", "tgt")
        mem = F._float_tensor(memory, dev, "TransformerDecoderLayer", "memory")
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha(self.norm2(x), mem, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha(x, mem, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff(x))


class _Stack(Module):
    """``num_layers`` copies of ``layer`` (starting from its weights, as torch's deep copies
    do) in ``layers``, then ``norm`` if given."""

    layer_type: type = _TransformerLayer

    def __init__(self, layer: _TransformerLayer, num_layers: int, norm: Optional[Module] = None) -> None:
        super().__init__()
        what = type(self).__name__
        if not isinstance(layer, self.layer_type):
            raise TypeError(f"{what}: the layer must be a {self.layer_type.__name__}, got {type(layer).__name__}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"{what}: num_layers must be an int >= 1, got {num_layers!r}")
        state = layer.state_dict()
        copies = []
        for _ in range(num_layers):
            copy = self.layer_type(**layer._config)
            copy.load_state_dict(state)
            copies.append(copy)
        self.layers = ModuleList(copies)
        self.num_layers = num_layers
        self.norm = norm

    def _input(self, x: TensorLike, name: str) -> Tensor:
        return F._float_tensor(x, self.layers[0].linear1.weight.device, type(self).__name__, name)


class TransformerEncoder(_Stack):
    """``torch.nn.TransformerEncoder``: ``num_layers`` copies of ``encoder_layer`` (starting
    from its weights, as torch's deep copies do) in ``layers``, then ``norm`` if given."""

    layer_type = TransformerEncoderLayer

    def forward(
        self, src: TensorLike, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False
    ) -> Tensor:
        x = self._input(src, "src")
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask, is_causal)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(_Stack):
    """``torch.nn.TransformerDecoder``: ``num_layers`` copies of ``decoder_layer`` (from its
    weights, as torch's deep copies) in ``layers``, then ``norm`` if given."""

    layer_type = TransformerDecoderLayer

    def forward(
        self,
        tgt: TensorLike,
        memory: TensorLike,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Tensor:
        x = self._input(tgt, "tgt")
        for layer in self.layers:
            x = layer(
                x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                memory_is_causal,
            )  # fmt: skip
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """``torch.nn.Transformer``: an encoder and a decoder stack, each with a final LayerNorm;
    every parameter of two or more dimensions starts Xavier-uniform, as torch's
    (``seed``: from ``numpy.random.default_rng(seed)``, else the device's RNG state).
    ``forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
    tgt_key_padding_mask, memory_key_padding_mask, src_is_causal, tgt_is_causal,
    memory_is_causal)``."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: Union[str, Callable[[Tensor], Tensor]] = "relu",
        custom_encoder: Optional[Module] = None,
        custom_decoder: Optional[Module] = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Optional[Device] = None,
        seed: Optional[int] = None,
    ) -> None:
        super().__init__()
        dev = resolve_device(device)
        kw: dict[str, Any] = dict(
            dim_feedforward=dim_feedforward, dropout=dropout, activation=activation, layer_norm_eps=layer_norm_eps,
            batch_first=batch_first, norm_first=norm_first, bias=bias, device=dev,
        )  # fmt: skip
        self.encoder = custom_encoder or TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **kw), num_encoder_layers,
            LayerNorm(d_model, layer_norm_eps, bias=bias, device=dev),
        )  # fmt: skip
        self.decoder = custom_decoder or TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **kw), num_decoder_layers,
            LayerNorm(d_model, layer_norm_eps, bias=bias, device=dev),
        )  # fmt: skip
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        generator = None if seed is None else np.random.default_rng(seed)
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p, generator=generator)

    def forward(
        self,
        src: TensorLike,
        tgt: TensorLike,
        src_mask: Any = None,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        src_key_padding_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        src_is_causal: Optional[bool] = None,
        tgt_is_causal: Optional[bool] = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        memory = self.encoder(src, src_mask, src_key_padding_mask, bool(src_is_causal))
        return self.decoder(
            tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, bool(tgt_is_causal),
            memory_is_causal,
        )  # fmt: skip

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Optional[Device] = None) -> Tensor:
        """The float causal mask of ``sz`` positions: 0 on and below the diagonal, -inf above."""
        return F.tensor(np.triu(np.full((sz, sz), -np.inf, np.float32), 1), resolve_device(device))
