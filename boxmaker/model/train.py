"""Train the tiny agent model on synthetic conversations and write it as a GGUF.

Usage (one command retrains and rewrites the shipped file)::

    python -m boxmaker.model.train --minutes 45 --out boxmaker/model/tiny-agent.gguf

``--minutes`` measures the speed of the first steps and fixes the step count from it (printed,
with the command that reproduces the run exactly with ``--steps``); with ``--steps`` the run
is fully determined by ``--seed`` (data, initialisation, order). One CPU thread by default
(``--threads``). Progress is printed as one line per ``--log-every`` steps: step, minutes,
learning rate, loss on all assistant tokens and on copied spans, tokens per second.

Needs the ``train`` extra (PyTorch CPU, ``gguf``, ``numpy``, ``jinja2``). This module is the
only one that imports torch; ``import boxmaker`` does not import it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from boxmaker.model import default_model_path
from boxmaker.model.data import COPY_WEIGHT, FAMILIES, Sample, make_sample
from boxmaker.model.format import (
    ACCENTED,
    CHAT_FORMATS,
    LLAMA3_TOKENS,
    ModelConfig,
    read_gguf_weights,
    tensor_shapes,
    vocab,
    write_gguf,
)

__all__ = ["TinyLlama", "export", "load_gguf", "main"]


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return out * self.weight


def _rope_tables(head_dim: int, n: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """llama.cpp rope NORMAL: rotate adjacent pairs (x[2i], x[2i+1]). x: (B, H, T, D)."""
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    r0 = x0 * cos - x1 * sin
    r1 = x0 * sin + x1 * cos
    return torch.stack((r0, r1), dim=-1).flatten(-2)


class _Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.attn_norm = _RMSNorm(c.dim, c.norm_eps)
        self.q = nn.Linear(c.dim, c.dim, bias=False)
        self.k = nn.Linear(c.dim, c.dim, bias=False)
        self.v = nn.Linear(c.dim, c.dim, bias=False)
        self.o = nn.Linear(c.dim, c.dim, bias=False)
        self.ffn_norm = _RMSNorm(c.dim, c.norm_eps)
        self.gate = nn.Linear(c.dim, c.ffn, bias=False)
        self.up = nn.Linear(c.dim, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, hd = self.c.n_heads, self.c.head_dim
        y = self.attn_norm(x)
        q = self.q(y).view(b, t, h, hd).transpose(1, 2)
        k = self.k(y).view(b, t, h, hd).transpose(1, 2)
        v = self.v(y).view(b, t, h, hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        y = self.ffn_norm(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return out


class TinyLlama(nn.Module):
    """The llama model as llama.cpp computes it (output tied to the token embedding)."""

    def __init__(self, config: ModelConfig, n_vocab: int) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(n_vocab, config.dim)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.norm = _RMSNorm(config.dim, config.norm_eps)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids (B, T)."""
        t = ids.shape[1]
        cos, sin = _rope_tables(self.config.head_dim, t, self.config.rope_base)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits: torch.Tensor = self.norm(x) @ self.embed.weight.T
        return logits


_BLOCK_NAMES = {"attn_norm.weight": "attn_norm.weight", "attn_q.weight": "q.weight",
                "attn_k.weight": "k.weight", "attn_v.weight": "v.weight",
                "attn_output.weight": "o.weight", "ffn_norm.weight": "ffn_norm.weight",
                "ffn_gate.weight": "gate.weight", "ffn_up.weight": "up.weight",
                "ffn_down.weight": "down.weight"}  # fmt: skip
"""GGUF tensor name in a block -> the torch parameter name in :class:`_Block`."""


def _gguf_to_torch(n_layers: int) -> dict[str, str]:
    names = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight"}
    for i in range(n_layers):
        for gname, tname in _BLOCK_NAMES.items():
            names[f"blk.{i}.{gname}"] = f"blocks.{i}.{tname}"
    return names


def export(model: TinyLlama, path: str | Path, description: str, chat_format: str = "tiny") -> Path:
    """Write ``model`` as a GGUF (see :func:`boxmaker.model.format.write_gguf`) with the
    template and special tokens of ``chat_format``; a model of the extended vocab's size is
    written with the extended vocab."""
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w: dict[str, Any] = {g: sd[t] for g, t in _gguf_to_torch(model.config.n_layers).items()}
    extended = model.embed.num_embeddings == len(vocab(True)[0])
    assert set(w) == set(tensor_shapes(model.config, len(vocab(extended)[0])))
    return write_gguf(path, model.config, w, description=description,
                      chat_format=chat_format, extended=extended)  # fmt: skip


_LIKE = {"<|begin_of_text|>": "<s>", "<|start_header_id|>": "<|im_start|>",
         "<|end_header_id|>": "\n", "<|eot_id|>": "<|im_end|>", "<|eom_id|>": "<|im_end|>",
         "<|python_tag|>": "<tool_call>"}  # fmt: skip
"""A new special token of the extended vocab -> the shipped token its embedding starts from."""


def _extend_embedding(embed: np.ndarray[Any, Any], seed: int) -> np.ndarray[Any, Any]:
    """The shipped vocab's embedding (363 rows) grown to the extended vocab: a new special
    token starts as the shipped token of the same role (:data:`_LIKE`), an accented letter as
    its base letter, each plus noise of 0.1 of the rows' spread (ids 0-362 unchanged)."""
    import unicodedata

    tokens = vocab(True)[0]
    base_tokens = vocab()[0]
    rng = np.random.default_rng(seed)
    rows = [embed]
    spread = float(embed.std())
    bases = {"\u00df": "s", "\u00e6": "a", "\u00c6": "A", "\u00f8": "o", "\u00d8": "O",
             "\u0142": "l", "\u0141": "L", "\u0131": "i", "\u00f0": "d", "\u00d0": "D",
             "\u00fe": "t", "\u00de": "T"}  # fmt: skip
    for tok in tokens[len(base_tokens) :]:
        if tok in LLAMA3_TOKENS:
            like = _LIKE[tok]
        else:
            assert tok in ACCENTED
            like = bases.get(tok) or unicodedata.normalize("NFD", tok)[0]
        row = embed[base_tokens.index(like)] + rng.normal(0, 0.1 * spread, embed.shape[1])
        rows.append(row[None, :].astype(np.float32))
    return np.concatenate(rows)


def load_gguf(model: TinyLlama, path: str | Path) -> None:
    """Set ``model``'s weights from a GGUF written by :func:`export` (the shipped file).

    A shipped-vocab file loaded into an extended-vocab model has its embedding grown (see
    :func:`_extend_embedding`): the fine-tune of the multi-format files starts there.

    Raises:
        ValueError: a tensor is missing, not float32, or of another shape than the model's.
    """
    weights = read_gguf_weights(path)
    embed = weights.get("token_embd.weight")
    if embed is not None and embed.shape[0] < model.embed.num_embeddings:
        if embed.shape[0] != len(vocab()[0]) or model.embed.num_embeddings != len(vocab(True)[0]):
            raise ValueError(f"{path}: {embed.shape[0]} tokens, want {model.embed.num_embeddings}")
        weights["token_embd.weight"] = _extend_embedding(embed, 0)
    state = {t: torch.from_numpy(weights[g].copy())
             for g, t in _gguf_to_torch(model.config.n_layers).items() if g in weights}  # fmt: skip
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}")
    model.load_state_dict(state)


def _batches(
    rng: random.Random,
    max_tokens: int,
    max_len: int,
    pool: int = 256,
    shares: dict[str, float] | None = None,
    formats: dict[str, float] | None = None,
) -> list[list[Sample]]:
    """A pool of samples grouped by length into padded batches of <= max_tokens tokens."""
    samples: list[Sample] = []
    while len(samples) < pool:
        s = make_sample(rng, shares=shares, formats=formats)
        if len(s.ids) <= max_len:
            samples.append(s)
    samples.sort(key=lambda s: len(s.ids))
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in samples:
        if cur and (len(cur) + 1) * len(s.ids) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def _tensors(batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = max(len(s.ids) for s in batch)
    ids = torch.zeros((len(batch), t), dtype=torch.long)
    w = torch.zeros((len(batch), t), dtype=torch.float32)
    for i, s in enumerate(batch):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        w[i, : len(s.ids)] = torch.tensor(s.weights)
    return ids[:, :-1], ids[:, 1:], w[:, 1:]


def _lr(step: int, total: int, peak: float, floor: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * p))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and train; writes the GGUF (and a ``.pt`` checkpoint beside it)."""
    ap = argparse.ArgumentParser(
        prog="python -m boxmaker.model.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default=str(default_model_path()), help="output GGUF path")
    ap.add_argument("--minutes", type=float, default=45.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=0, help="exact step count (overrides minutes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--lr-floor", type=float, default=3e-5, help="final learning rate")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch-tokens", type=int, default=6144, help="padded tokens per batch")
    ap.add_argument("--max-len", type=int, default=2048, help="longest sample in tokens")
    ap.add_argument(
        "--init", default="", help="start from this .pt checkpoint or .gguf (e.g. the shipped one)"
    )
    ap.add_argument(
        "--checkpoint",
        default="",
        help="where to save the final .pt (default: TMPDIR/<out stem>.pt)",
    )
    ap.add_argument(
        "--stop-at",
        type=int,
        default=0,
        help="stop after this many steps (the schedule still spans --steps)",
    )
    ap.add_argument(
        "--snapshot-every",
        type=float,
        default=0.0,
        help="minutes between GGUF snapshots written to OUT.snapshot.gguf (0: none)",
    )
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument(
        "--mix",
        default="",
        help="family shares, e.g. 'weather=3,time=3,copy=1' (default: data.FAMILIES)",
    )
    ap.add_argument(
        "--formats",
        default="",
        help="chat-format shares, e.g. 'tiny=20,qwen3=35,llama3=45' (CHAT_FORMATS): the "
        "extended vocab, samples rendered in those formats, one GGUF per format written to "
        "--out with {format} replaced (default: the shipped tiny format and vocab)",
    )
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=384)
    args = ap.parse_args(argv)

    shares: dict[str, float] | None = None
    if args.mix:
        shares = {k: float(v) for k, v in (kv.split("=") for kv in args.mix.split(","))}
        unknown = set(shares) - set(FAMILIES)
        if unknown:
            ap.error(f"unknown families in --mix: {sorted(unknown)}")
    formats: dict[str, float] | None = None
    if args.formats:
        formats = {k: float(v) for k, v in (kv.split("=") for kv in args.formats.split(","))}
        if set(formats) - set(CHAT_FORMATS):
            ap.error(f"unknown formats in --formats: {sorted(set(formats) - set(CHAT_FORMATS))}")
        if "{format}" not in args.out:
            ap.error("--formats needs an --out with {format} in it")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    config = ModelConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads, ffn=args.ffn)
    model = TinyLlama(config, len(vocab(formats is not None)[0]))
    if args.init.endswith(".gguf"):
        load_gguf(model, args.init)
    elif args.init:
        model.load_state_dict(torch.load(args.init, weights_only=True))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {config} params {n_params:,}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.01)  # fmt: skip
    names = list(formats) if formats else ["tiny"]

    def outputs(path: str) -> dict[str, Path]:
        return {n: Path(path.replace("{format}", n)) for n in names}

    out = Path(args.out.replace("{format}", names[0]))
    total = args.steps if args.steps > 0 else 10**9
    start = time.monotonic()
    last_snap = start
    queue: list[list[Sample]] = []
    acc_loss = acc_copy = acc_tok = 0.0
    acc_n = 0
    step = 0
    while step < total and not (args.stop_at and step >= args.stop_at):
        if not queue:
            queue = _batches(rng, args.batch_tokens, args.max_len, shares=shares, formats=formats)
        batch = queue.pop()
        x, y, w = _tensors(batch)
        lr = _lr(step, total if total < 10**9 else 10**6, args.lr, args.lr_floor, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(x)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                              reduction="none").view_as(w)  # fmt: skip
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            copy_mask = w >= COPY_WEIGHT
            acc_loss += float((nll * (w > 0)).sum() / (w > 0).sum())
            acc_copy += float((nll * copy_mask).sum() / copy_mask.sum().clamp(min=1))
            acc_tok += x.numel()
            acc_n += 1
        elapsed = time.monotonic() - start
        if step == 20 and args.steps <= 0:
            per_step = elapsed / 20
            total = max(40, int(args.minutes * 60 / per_step))
            print(f"{per_step:.2f} s/step -> {total} steps in {args.minutes} min; reproduce with:"
                  f" python -m boxmaker.model.train --steps {total} --seed {args.seed}"
                  f" --out {out}", flush=True)  # fmt: skip
        if step % args.log_every == 0 or step == total:
            print(f"step {step}/{total} {elapsed / 60:.1f} min lr {lr:.2e} "
                  f"loss {acc_loss / acc_n:.4f} copy {acc_copy / acc_n:.4f} "
                  f"{acc_tok / max(1e-9, elapsed):.0f} tok/s", flush=True)  # fmt: skip
            acc_loss = acc_copy = 0.0
            acc_n = 0
        if args.snapshot_every > 0 and time.monotonic() - last_snap > args.snapshot_every * 60:
            last_snap = time.monotonic()
            for n, o in outputs(args.out).items():
                snap = o.with_suffix(".snapshot.gguf")
                export(model, snap, f"snapshot at step {step}", n)
            torch.save(model.state_dict(), out.with_suffix(".snapshot.pt"))
            print(f"snapshot {snap} at step {step}", flush=True)
    minutes = (time.monotonic() - start) / 60
    desc = (f"trained {step} steps ({minutes:.1f} min, 1 CPU thread) with seed {args.seed}, "
            f"lr {args.lr} -> {args.lr_floor}, {n_params} params")  # fmt: skip
    for n, o in outputs(args.out).items():
        export(model, o, desc, n)
        print(f"wrote {o} ({o.stat().st_size} bytes) in format {n}", flush=True)
    ckpt = Path(args.checkpoint or Path(tempfile.gettempdir()) / (out.stem + ".pt"))
    torch.save(model.state_dict(), ckpt)
    print(f"checkpoint {ckpt}", flush=True)
    print(f"wrote {out} ({out.stat().st_size} bytes): {desc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
