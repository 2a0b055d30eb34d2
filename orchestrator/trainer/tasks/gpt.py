"""`gpt`: a small decoder-only transformer language model, for throughput and MFU.

Tokens are synthetic (a fixed random Markov chain, so the loss has something to learn) or the bytes of a
text file (`text_file`, vocabulary 256). The size is set by `task_args`: layers, heads, width, sequence.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

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


def text_tokens(path: str, length: int) -> torch.Tensor:
    data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    count = len(data) // length
    if count < 2:
        raise ValueError(f"text_file {path} is too short for sequences of {length} tokens")
    return data[: count * length].view(count, length)


def train_flops_per_token(model: GPT, layers: int, width: int, length: int) -> float:
    """PaLM appendix B: 6 x parameters (without position embeddings) + 12 x layers x width x sequence.

    The token embedding is tied to the output head, so it is counted once: as the head's matmul.
    """
    params = sum(p.numel() for p in model.parameters()) - model.positions.weight.numel()
    return 6.0 * params + 12.0 * layers * width * length


def make(
    layers: int = 2,
    heads: int = 4,
    width: int = 128,
    seq_len: int = 64,
    vocab_size: int = 256,
    samples: int = 2048,
    eval_samples: int = 128,
    dropout: float = 0.0,
    seed: int = 0,
    text_file: str | None = None,
) -> Task:
    if width % heads:
        raise ValueError(f"gpt: width {width} must be divisible by heads {heads}")
    length = seq_len + 1  # inputs are tokens[:-1], targets tokens[1:]
    if text_file:
        vocab_size = 256
        sequences = text_tokens(text_file, length)
        eval_count = max(1, min(eval_samples, len(sequences) // 10))
    else:
        sequences = markov_tokens(samples + eval_samples, length, vocab_size, seed)
        eval_count = eval_samples
    train, held_out = sequences[eval_count:], sequences[:eval_count]
    model = GPT(vocab_size, seq_len, layers, heads, width, dropout)
    return Task(
        model=model,
        train_dataset=TensorDataset(train[:, :-1], train[:, 1:]),
        eval_dataset=TensorDataset(held_out[:, :-1], held_out[:, 1:]) if eval_count else None,
        loss_fn=lm_loss,
        eval_metrics=next_token_accuracy,
        flops_per_sample=train_flops_per_token(model, layers, width, seq_len) * seq_len,
        tokens_per_sample=seq_len,
    )
