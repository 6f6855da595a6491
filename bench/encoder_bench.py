"""A transformer encoder's training step beside PyTorch: nn.TransformerEncoder (post-norm,
GELU, dropout 0.1, batch_first) with a token-classification head, cross-entropy and AdamW,
ours through Trainer and through the plain loop, torch's eager (fused AdamW, TF32 off) in the
same process; ms per step over 10 steps after 3, the same weights. Two configurations: a
BERT-base-sized stack (12 layers, d 768, 12 heads, T 512, batch 8) and a small one (6 layers,
d 512, 8 heads, T 256, batch 32). CPU adapters run one tiny configuration.

    python bench/encoder_bench.py [--json FILE]     # on the GPU machine after the prelude
"""

import json
import sys

import numpy as np

import pywgtrain as pw
from pywgtrain.benchmarks.common import _torch_cuda, is_cpu_adapter, time_steps
from pywgtrain.train import Trainer

CONFIGS = [  # name, layers, d_model, heads, T, batch
    ("BERT-base-sized", 12, 768, 12, 512, 8),
    ("small", 6, 512, 8, 256, 32),
]
TINY = [("tiny", 2, 64, 4, 32, 4)]
CLASSES = 16


class Net(pw.nn.Module):
    def __init__(self, layers, d, heads, dev):
        super().__init__()
        layer = pw.nn.TransformerEncoderLayer(d, heads, 4 * d, 0.1, "gelu", batch_first=True, device=dev, seed=0)
        self.encoder = pw.nn.TransformerEncoder(layer, layers)
        self.head = pw.nn.Linear(d, CLASSES, device=dev, seed=1)

    def forward(self, x):
        return self.head(self.encoder(x)).reshape(-1, CLASSES)


def main():
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    dev = pw.default_device()
    torch = _torch_cuda()
    print(f"adapter: {dev.name}; torch CUDA: {'yes' if torch else 'no'} (TF32 off)", flush=True)
    rows = []
    for name, layers, d, heads, t, batch in TINY if is_cpu_adapter(dev) else CONFIGS:
        rng = np.random.default_rng(0)
        data = [
            (rng.standard_normal((batch, t, d), dtype=np.float32), rng.integers(0, CLASSES, batch * t).astype(np.int32))
            for _ in range(4)
        ]
        row = dict(config=name, layers=layers, d_model=d, heads=heads, t=t, batch=batch)
        for kind in ("trainer", "loop"):
            pw.manual_seed(0, dev)
            model = Net(layers, d, heads, dev)
            opt = pw.optim.AdamW(model.parameters(), lr=1e-4)
            loss_fn = pw.nn.CrossEntropyLoss()
            batches = [(pw.tensor(x, dev), pw.tensor(y, dev)) for x, y in data]
            if kind == "trainer":
                tr = Trainer(model, opt, loss_fn)

                def step(i, tr=tr, batches=batches):
                    return tr.step(*batches[i % 4])

            else:

                def step(i, model=model, opt=opt, loss_fn=loss_fn, batches=batches):
                    opt.zero_grad()
                    x, y = batches[i % 4]
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
                    return loss

            row[f"pywgtrain_{kind}_ms"] = time_steps(step, 10, dev.synchronize, warmup=3)
        if torch is not None:
            enc_layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, 0.1, "gelu", batch_first=True)
            tmodel = torch.nn.Sequential()
            tmodel.encoder = torch.nn.TransformerEncoder(enc_layer, layers, enable_nested_tensor=False)
            tmodel.head = torch.nn.Linear(d, CLASSES)
            tmodel = tmodel.cuda()
            state = {k: torch.from_numpy(v) for k, v in model.state_dict().items()}
            tmodel.load_state_dict(state)
            topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-4, fused=True)
            tbatches = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).long().cuda()) for x, y in data]

            def tstep(i):
                topt.zero_grad(set_to_none=True)
                x, y = tbatches[i % 4]
                loss = torch.nn.functional.cross_entropy(tmodel(x).reshape(-1, CLASSES), y)
                loss.backward()
                topt.step()

            row["torch_eager_ms"] = time_steps(tstep, 10, torch.cuda.synchronize, warmup=3)
        rows.append(row)
        cells = ", ".join(f"{k[:-3]} {v:.1f} ms" for k, v in row.items() if k.endswith("_ms"))
        print(f"{name} ({layers} layers, d {d}, {heads} heads, T {t}, batch {batch}): {cells}", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(dict(adapter=dev.name, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
