"""Token batches addressed by global sample index, so every layout sees the same data at a given step."""

from __future__ import annotations

from typing import Iterator, List

import torch

from harness.config.data_file import BYTE_VOCAB, builder_for
from harness.config.schema import DataConfig


class SyntheticTokens:
    """Uniform random tokens; sample `i` is a pure function of (seed, i)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randint(0, self.vocab_size, (self.seq_len,), generator=generator)


class TextTokens:
    """A local text dataset read through `datasets`, byte-tokenised (no tokenizer download) and packed."""

    def __init__(self, path: str, text_column: str, vocab_size: int, seq_len: int):
        from datasets import load_dataset

        if vocab_size < BYTE_VOCAB:
            raise ValueError(f"data.kind=text needs vocab_size >= {BYTE_VOCAB} for byte tokens, got {vocab_size}")
        builder = builder_for(path)
        column = "text" if builder == "text" else text_column
        dataset = load_dataset(builder, data_files=path, split="train")
        stream: List[int] = []
        for text in dataset[column]:
            stream.extend((text + "\n").encode("utf-8"))
        if len(stream) < seq_len:
            raise ValueError(f"data.path={path!r} holds {len(stream)} bytes, fewer than seq_len={seq_len}")
        usable = len(stream) // seq_len * seq_len
        self.chunks = torch.tensor(stream[:usable], dtype=torch.long).view(-1, seq_len)

    def sample(self, index: int) -> torch.Tensor:
        return self.chunks[index % len(self.chunks)]


def token_source(data: DataConfig, vocab_size: int, seq_len: int):
    if data.kind == "synthetic":
        return SyntheticTokens(vocab_size, seq_len, data.seed)
    if data.kind == "text":
        if not data.path:
            raise ValueError("data.kind=text needs data.path")
        return TextTokens(data.path, data.text_column, vocab_size, seq_len)
    raise ValueError(f"data.kind={data.kind!r} is not one of synthetic, text")


def micro_batches(
    source, step: int, micro_batch: int, grad_accum: int, dp_rank: int, dp_size: int
) -> Iterator[torch.Tensor]:
    """The micro-batches of one optimizer step for one data-parallel rank.

    Global sample order: step, then accumulation slot, then dp rank, then row, so a single process
    with micro_batch * dp_size rows sees exactly the union of what the dp ranks see.
    """
    global_batch = micro_batch * grad_accum * dp_size
    for slot in range(grad_accum):
        first = step * global_batch + (slot * dp_size + dp_rank) * micro_batch
        yield torch.stack([source.sample(first + row) for row in range(micro_batch)])
