"""The GPT against the same architecture written in PyTorch, weights copied
through state_dict: logits within 1e-4 relative, 20 AdamW steps with
clipping (dropout off) with losses within 1e-4 relative at every step."""

import math

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.models import GPT, GPTConfig

torch = pytest.importorskip("torch")
tnn = torch.nn

REL = 1e-4


class TorchBlock(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg.n_embd
        self.ln_1 = tnn.LayerNorm(c, bias=cfg.bias)
        self.attn = tnn.Module()
        self.attn.c_attn = tnn.Linear(c, 3 * c, bias=cfg.bias)
        self.attn.c_proj = tnn.Linear(c, c, bias=cfg.bias)
        self.ln_2 = tnn.LayerNorm(c, bias=cfg.bias)
        self.mlp = tnn.Module()
        self.mlp.c_fc = tnn.Linear(c, 4 * c, bias=cfg.bias)
        self.mlp.c_proj = tnn.Linear(4 * c, c, bias=cfg.bias)
        self.n_head = cfg.n_head

    def forward(self, x):
        b, t, c = x.shape
        h = self.n_head
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)  # attention written out
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(torch.nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))


class TorchGPT(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.transformer = tnn.ModuleDict(
            dict(
                wte=tnn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=tnn.Embedding(cfg.block_size, cfg.n_embd),
                h=tnn.ModuleList([TorchBlock(cfg) for _ in range(cfg.n_layer)]),
                ln_f=tnn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = tnn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids):
        t = ids.shape[1]
        x = self.transformer.wte(ids) + self.transformer.wpe(torch.arange(t, device=ids.device))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def twin(model):
    tm = TorchGPT(model.config)
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return tm


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


CFG = dict(vocab_size=67, block_size=24, n_layer=2, n_head=4, n_embd=32)


@pytest.mark.parametrize("attention", ["plain", "fused"])
@pytest.mark.parametrize("tie", [False, True])
def test_gpt_logits_match_pytorch(dev, rng, attention, tie):
    if attention == "fused" and not hasattr(pw.functions, "causal_self_attention_qkv"):
        pytest.skip("fused attention not built")
    model = GPT(GPTConfig(**CFG, tie_weights=tie, attention=attention), device=dev, seed=int(rng.integers(1 << 30)))
    tm = twin(model)
    ids = rng.integers(0, CFG["vocab_size"], (3, 24))
    got = model(ids).numpy()
    want = tm(torch.from_numpy(ids)).detach().numpy()
    assert rel(got, want) < REL
    ids7 = ids[:, :7]  # a shorter sequence than the context
    assert rel(model(ids7).numpy(), tm(torch.from_numpy(ids7)).detach().numpy()) < REL


@pytest.mark.parametrize("attention", ["plain", "fused"])
def test_gpt_training_matches_pytorch(dev, rng, attention):
    """20 AdamW steps (clipping at 1.0, weight decay on matrices only), via
    Trainer's captured and replayed steps: every loss within 1e-4 relative."""
    if attention == "fused" and not hasattr(pw.functions, "causal_self_attention_qkv"):
        pytest.skip("fused attention not built")
    from pywgtrain.train import Trainer

    model = GPT(GPTConfig(**CFG, attention=attention), device=dev, seed=int(rng.integers(1 << 30)))
    tm = twin(model)

    def groups(named):
        named = list(named)
        return [
            {"params": [p for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0},
        ]

    opt = pw.optim.AdamW(groups(model.named_parameters()), lr=3e-3, betas=(0.9, 0.95), max_grad_norm=1.0)
    topt = torch.optim.AdamW(groups(tm.named_parameters()), lr=3e-3, betas=(0.9, 0.95))
    trainer = Trainer(model, opt, GPT.loss, steps_per_submit=4)
    data = rng.integers(0, CFG["vocab_size"], (20, 4, 25))
    got = [trainer.step(d[:, :-1].astype(np.int32), d[:, 1:].astype(np.int32)) for d in data]
    want = []
    for d in data:
        topt.zero_grad()
        logits = tm(torch.from_numpy(d[:, :-1]))
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, CFG["vocab_size"]), torch.from_numpy(d[:, 1:]).reshape(-1)
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        topt.step()
        want.append(loss.item())
    for i, (g, w) in enumerate(zip(got, want)):
        assert abs(g.item() - w) <= REL * abs(w), f"step {i}: {g.item()} vs torch {w}"


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_residual_adds_with_dropout_and_without_bias(dev, rng, bias):
    """The residual add runs in the projections' GEMMs (no bias: a GEMM onto a
    copy of the residual) unless a dropout in training mode comes between (in
    eval mode it is the identity and the add is fused again); both models give
    the PyTorch twin's logits, and training with dropout runs."""
    model = GPT(GPTConfig(**CFG, bias=bias, attention="plain"), device=dev, seed=int(rng.integers(1 << 30)))
    dropped = GPT(GPTConfig(**CFG, bias=bias, attention="plain", dropout=0.2), device=dev, seed=0)
    dropped.load_state_dict(model.state_dict())
    tm = twin(model)
    ids = rng.integers(0, CFG["vocab_size"], (3, 24))
    want = tm(torch.from_numpy(ids)).detach().numpy()
    assert rel(model(ids).numpy(), want) < REL
    assert rel(dropped.eval()(ids).numpy(), want) < REL
    dropped.train()
    loss = GPT.loss(dropped(ids[:, :-1]), ids[:, 1:].astype(np.int32))
    loss.backward()
    assert np.isfinite(loss.item())
    for name, p in dropped.named_parameters():
        assert p.grad is not None and np.all(np.isfinite(p.grad.numpy())), name


def test_gpt_input_errors(dev):
    model = GPT(GPTConfig(**CFG, attention="plain"), device=dev)
    with pytest.raises(ValueError, match="longer than the context"):
        model(np.zeros((1, 25), np.int64))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 67\)"):
        model(np.full((1, 3), 67))
    with pytest.raises(ValueError, match=r"\[batch, time\]"):
        model(np.zeros(5, np.int64))
    with pytest.raises(TypeError, match="integer token ids"):
        model(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="not a multiple of n_head"):
        GPTConfig(n_embd=30, n_head=4)
    other = GPT(GPTConfig(**{**CFG, "n_layer": 3}, attention="plain"), device=dev)
    with pytest.raises(KeyError, match="unexpected keys"):
        model.load_state_dict(other.state_dict())
