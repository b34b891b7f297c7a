"""models: the benchmark workloads, in plain torch.nn with random weights (no downloads, no torchvision needed).

- resnet50():   ResNet-50 (torchvision's when installed, else the same architecture written here)
- Encoder:      a BERT-base-like encoder (12 layers, d=768, 12 heads, seq 128)
- GPT:          a GPT-2-like decoder-only LM (small by default) for training
- Llama:        a Llama-like decoder (RMSNorm, rotary, SwiGLU) with a static KV cache for prefill / decode

torch is imported lazily by the caller; importing this module needs torch (it is only imported by workers).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# The determinism check sets this: fused attention backward kernels may use atomics (not bit-reproducible).
FORCE_MATH_ATTENTION = False


def attention(q, k, v, causal=False, mask=None):
    """SDPA when this PyTorch has it (2.x, fused kernels on the GPU), else the textbook formula (CPU checks)."""
    if hasattr(F, "scaled_dot_product_attention") and not FORCE_MATH_ATTENTION:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s + torch.full(s.shape[-2:], float("-inf"), device=q.device, dtype=s.dtype).triu(1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


# ---------------------------------------------------------------- ResNet-50 ------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + idt)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for b in range(blocks):
                layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50():
    try:
        import torchvision  # noqa: F401

        return torchvision.models.resnet50(weights=None), "torchvision"
    except Exception:  # not installed, or an incompatible build: our own copy of the architecture
        return ResNet50(), "builtin"


# ---------------------------------------------------------------- BERT-like encoder ----------------------------
class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = attention(q, k, v)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class Encoder(nn.Module):
    """BERT-base shape: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, seq 128."""

    def __init__(self, layers=12, d=768, heads=12, ff=3072, vocab=30522, max_seq=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_seq, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList([EncoderLayer(d, heads, ff) for _ in range(layers)])
        self.pool = nn.Linear(d, d)

    def forward(self, ids):
        x = self.ln(self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pool(x[:, 0]))


# ---------------------------------------------------------------- GPT-2-like -----------------------------------
class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = attention(q, k, v, causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2 shape; default = GPT-2 small (12 layers, 768, 12 heads, vocab 50257)."""

    def __init__(self, layers=12, d=768, heads=12, vocab=50257, max_seq=1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList([GPTBlock(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


# ---------------------------------------------------------------- Llama-like -----------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)


def rope(x, pos, base=10000.0):
    """Rotary embedding; x: (b, h, s, hd), pos: (s,) int positions."""
    hd = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class LlamaLayer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.n1 = RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n2 = RMSNorm(d)
        self.gate = nn.Linear(d, ff, bias=False)
        self.up = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x, pos, kcache, vcache, causal):
        """x: (b, s, d); pos: (s,) absolute positions; caches (b, h, max_seq, hd) written at pos."""
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k = rope(q, pos), rope(k, pos)
        kcache.index_copy_(2, pos, k)
        vcache.index_copy_(2, pos, v)
        if causal:  # prefill: attend within the prompt
            a = attention(q, k, v, causal=True)
        else:  # decode: one new token attends to the whole (masked) cache
            L = kcache.shape[2]
            mask = (torch.arange(L, device=x.device)[None, :] <= pos[:, None])
            a = attention(q, kcache, vcache, mask=mask[None, None])
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.silu(self.gate(self.n2(x))) * self.up(self.n2(x)))


class Llama(nn.Module):
    """Llama-like decoder; default ~1B parameters (16 layers, d=2048, 16 heads, FFN 5632, vocab 32000)."""

    def __init__(self, layers=16, d=2048, heads=16, ff=5632, vocab=32000):
        super().__init__()
        self.d, self.heads = d, heads
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaLayer(d, heads, ff) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def new_cache(self, batch, max_seq, device, dtype):
        shape = (batch, self.heads, max_seq, self.d // self.heads)
        return [(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
                for _ in self.layers]

    def forward(self, ids, pos, cache, causal):
        x = self.emb(ids)
        for layer, (kc, vc) in zip(self.layers, cache):
            x = layer(x, pos, kc, vc, causal)
        return self.head(self.norm(x[:, -1]))


MODEL_SIZES = {
    # name: constructor kwargs; "small" variants keep --quick and CPU checks cheap
    "gpt2": dict(layers=12, d=768, heads=12),
    "gpt2-tiny": dict(layers=2, d=128, heads=4, vocab=1000, max_seq=128),
    "bert": dict(),
    "bert-tiny": dict(layers=2, d=128, heads=4, ff=256, vocab=1000),
    # issue 26's short LC (a batch-1 request of at most ~0.4 ms on an H100): the encoder cut to two layers
    "bert-2l": dict(layers=2),
    "bert-2l-tiny": dict(layers=1, d=128, heads=4, ff=256, vocab=1000),
    "llama": dict(),
    "llama-tiny": dict(layers=2, d=128, heads=4, ff=256, vocab=1000),
    # issue 26's ~1 ms decode step: the same Llama-like model cut to five layers (16 layers take ~3.2 ms)
    "llama-5l": dict(layers=5),
}
