"""`gpt`: a small decoder-only transformer language model, for throughput and MFU.

Tokens are synthetic (a fixed random Markov chain, so the loss has something to learn), nanoGPT's
prepared `train.bin`/`val.bin`, or the bytes of a text file. The size is set by `task_args` with
nanoGPT's names: n_layer, n_head, n_embd, seq_len (block_size), vocab_size.
"""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from orchestrator.trainer.tasks import Task, accuracy


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, length: int, layers: int, heads: int, width: int, dropout: float) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's N(0, 0.02): PyTorch's N(0, 1) embeddings, tied to the head, would start with huge logits.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def next_token_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    return accuracy(logits.flatten(0, 1), targets.flatten())


def markov_tokens(count: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """`count` sequences of `length` tokens from a random chain where each token has 4 likely successors."""
    generator = torch.Generator().manual_seed(seed)
    successors = torch.randint(vocab, (vocab, 4), generator=generator)
    sequences = torch.empty(count, length, dtype=torch.long)
    sequences[:, 0] = torch.randint(vocab, (count,), generator=generator)
    for position in range(1, length):
        choice = torch.randint(4, (count,), generator=generator)
        sequences[:, position] = successors[sequences[:, position - 1], choice]
    return sequences


class TokenWindows(Dataset):
    """Sample i: tokens [i*length, (i+1)*length + 1) of a 1-D token array (a NumPy memmap: nothing loaded)."""

    def __init__(self, tokens: np.ndarray, length: int) -> None:
        self.tokens, self.length = tokens, length

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.length
        window = torch.from_numpy(self.tokens[start : start + self.length + 1].astype(np.int64))
        return window[:-1], window[1:]


def file_datasets(path: str, length: int) -> tuple[Dataset, Dataset]:
    """nanoGPT's prepared data (a directory with train.bin and val.bin, uint16 GPT-2 tokens), or the bytes
    of any file (vocabulary 256, the last tenth held out)."""
    source = Path(path)
    train: np.ndarray
    val: np.ndarray
    if source.is_dir():
        train, val = (
            np.memmap(source / name, dtype=np.uint16, mode="r") for name in ("train.bin", "val.bin")
        )
    else:
        data = np.frombuffer(source.read_bytes(), dtype=np.uint8)
        cut = len(data) * 9 // 10
        train, val = data[:cut], data[cut:]
    datasets = TokenWindows(train, length), TokenWindows(val, length)
    if len(datasets[0]) < 1 or len(datasets[1]) < 1:
        raise ValueError(f"gpt: {path} is too short for sequences of {length} tokens")
    return datasets


def train_flops_per_token(model: GPT, layers: int, width: int, length: int) -> float:
    """PaLM appendix B: 6 x parameters (without position embeddings) + 12 x layers x width x sequence.

    The token embedding is tied to the output head, so it is counted once: as the head's matmul.
    """
    params = sum(p.numel() for p in model.parameters()) - model.positions.weight.numel()
    return 6.0 * params + 12.0 * layers * width * length


def make(
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 128,
    seq_len: int = 64,
    vocab_size: int | None = None,
    samples: int = 2048,
    eval_samples: int = 128,
    dropout: float = 0.0,
    seed: int = 0,
    dataset: str | None = None,
) -> Task:
    """Names as nanoGPT's GPTConfig. `dataset`: nanoGPT's train.bin/val.bin directory or a text file;
    None: synthetic tokens (`samples` training and `eval_samples` held-out sequences)."""
    if n_embd % n_head:
        raise ValueError(f"gpt: n_embd {n_embd} must be divisible by n_head {n_head}")
    if dataset:
        train, held_out = file_datasets(dataset, seq_len)
        vocab_size = vocab_size or (50304 if Path(dataset).is_dir() else 256)  # GPT-2's, padded to 64
    else:
        vocab_size = vocab_size or 256
        sequences = markov_tokens(samples + eval_samples, seq_len + 1, vocab_size, seed)
        train = TensorDataset(sequences[eval_samples:, :-1], sequences[eval_samples:, 1:])
        held_out = TensorDataset(sequences[:eval_samples, :-1], sequences[:eval_samples, 1:])
    model = GPT(vocab_size, seq_len, n_layer, n_head, n_embd, dropout)
    return Task(
        model=model,
        train_dataset=train,
        eval_dataset=held_out if len(cast(Sized, held_out)) else None,
        loss_fn=lm_loss,
        eval_metrics=next_token_accuracy,
        flops_per_sample=train_flops_per_token(model, n_layer, n_embd, seq_len) * seq_len,
        tokens_per_sample=seq_len,
        shard_units=list(model.blocks),  # FSDP: one unit per block; embeddings, norm and head in the root
    )
