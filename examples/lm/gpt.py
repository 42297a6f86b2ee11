"""A byte-level decoder-only transformer (GPT) and its text: Python's documentation, as reST.

The text is the reST sources Debian's python3.11-doc ships under
/usr/share/doc/python3.11/html/_sources (497 files, 11 MB of English prose and code). The split
is fixed: the files sorted by path, every 20th (index 19, 39, ...) is validation, the rest
training; each side is its files' bytes joined with a newline. Tokens are bytes (a 256-symbol
vocabulary), so the validation loss in bits per token is bits per byte.

    text = Corpus()                                      # training and validation bytes
    model = GPT(GPTConfig())                             # 4 layers, d_model 128: 0.86 M params
    batches = text.batches(batch=8, context=128, seed=rank)
    x, y = batches.next()                                # [8, 128] bytes and the next bytes
    loss = model.loss(x, y)                              # mean cross-entropy, nats
    bpb = text.bits_per_byte(model)                      # on the validation windows
"""
import dataclasses
import glob
import math
import os

import numpy as np
import torch

SOURCES = "/usr/share/doc/python3.11/html/_sources"
VALIDATION_EVERY = 20  # every 20th file, sorted by path, is validation


@dataclasses.dataclass
class GPTConfig:
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    context: int = 128
    vocab: int = 256  # bytes


class Block(torch.nn.Module):
    """Pre-norm: x + attention(LN(x)), then x + MLP(LN(x)); causal attention."""

    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.ln1 = torch.nn.LayerNorm(c.d_model)
        self.qkv = torch.nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = torch.nn.Linear(c.d_model, c.d_model)
        self.ln2 = torch.nn.LayerNorm(c.d_model)
        self.fc = torch.nn.Linear(c.d_model, 4 * c.d_model)
        self.out = torch.nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        # Causal: made each call (16 k values), not kept as a buffer, which DDP would broadcast
        # (gloo has no bool) and tern would count as model state.
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, c=None):
        super().__init__()
        c = c or GPTConfig()
        self.config = c
        self.tok = torch.nn.Embedding(c.vocab, c.d_model)
        self.pos = torch.nn.Embedding(c.context, c.d_model)
        self.blocks = torch.nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = torch.nn.LayerNorm(c.d_model)
        self.head = torch.nn.Linear(c.d_model, c.vocab, bias=False)
        # GPT-2's initialization: N(0, 0.02), the residual projections scaled by 1/sqrt(2 layers).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c.layers) if name.endswith(("proj.weight",
                                                                      "out.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def loss(self, x, y):
        logits = self(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))


def adamw(model, lr, weight_decay=0.1):
    """AdamW as GPT training runs it: β (0.9, 0.95), weight decay on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "tok" not in n
             and "pos" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "tok" not in n
                                                           and "pos" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def lr_at(step, steps, peak, warmup_frac=0.1, floor=0.1):
    """Linear warm-up over the first warmup_frac of the steps, then cosine down to floor × peak."""
    warmup = max(1, int(warmup_frac * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


class Batches:
    """Random windows of a byte stream: `batch` of them, `context` bytes each, drawn with a
    seeded generator (each worker its own seed: iid shards of the stream)."""

    def __init__(self, data, batch, context, seed):
        self.data, self.batch, self.context = data, batch, context
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, len(self.data) - self.context - 1, (self.batch,),
                               generator=self.gen)
        idx = starts[:, None] + torch.arange(self.context + 1)[None, :]
        w = self.data[idx]
        return w[:, :-1], w[:, 1:]


class Corpus:
    """The training and validation bytes (see the module's comment) as int64 tensors."""

    def __init__(self, sources=SOURCES):
        files = sorted(glob.glob(os.path.join(sources, "**", "*.txt"), recursive=True))
        if not files:
            raise FileNotFoundError(
                f"no reST sources under {sources}: apt-get install python3.11-doc")
        train, val = [], []
        for i, f in enumerate(files):
            with open(f, "rb") as fh:
                (val if i % VALIDATION_EVERY == VALIDATION_EVERY - 1 else train).append(fh.read())
        self.files = (len(train), len(val))
        self.train = torch.from_numpy(np.frombuffer(b"\n".join(train), dtype=np.uint8).astype(
            np.int64))
        self.val = torch.from_numpy(np.frombuffer(b"\n".join(val), dtype=np.uint8).astype(
            np.int64))

    def batches(self, batch, context, seed):
        return Batches(self.train, batch, context, seed)

    def validation_windows(self, context, count=128, seed=0):
        """`count` non-overlapping windows of the validation stream, a seeded choice of them."""
        n = (len(self.val) - 1) // context
        pick = np.sort(np.random.default_rng(seed).choice(n, size=min(count, n), replace=False))
        starts = torch.from_numpy(pick * context)
        idx = starts[:, None] + torch.arange(context + 1)[None, :]
        w = self.val[idx]
        return w[:, :-1], w[:, 1:]

    def bits_per_byte(self, model, windows=None, chunk=32):
        """The model's mean validation loss in bits per byte."""
        x, y = windows if windows is not None else self.validation_windows(model.config.context)
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(x), chunk):
                total += model.loss(x[i:i + chunk], y[i:i + chunk]).item() * len(x[i:i + chunk])
        return total / len(x) / math.log(2)
