"""Batches are addressed by global sample index: every layout sees the same data at the same step."""

import torch

from harness.config.schema import DataConfig
from harness.runtime.data import SyntheticTokens, micro_batches, token_source


def _rows(source, step, micro, accum, dp_size):
    rows = []
    for rank in range(dp_size):
        for batch in micro_batches(source, step, micro, accum, rank, dp_size):
            rows.extend(batch.tolist())
    return sorted(rows)


def test_synthetic_samples_are_deterministic_and_distinct():
    a, b = SyntheticTokens(256, 16, seed=7), SyntheticTokens(256, 16, seed=7)
    assert torch.equal(a.sample(3), b.sample(3))
    assert not torch.equal(a.sample(3), a.sample(4))
    assert not torch.equal(a.sample(3), SyntheticTokens(256, 16, seed=8).sample(3))
    assert int(a.sample(0).max()) < 256


def test_dp_ranks_together_see_what_one_process_sees():
    source = SyntheticTokens(256, 8, seed=1)
    for step in range(3):
        one_process = _rows(source, step, micro=4, accum=2, dp_size=1)
        two_ranks = _rows(source, step, micro=2, accum=2, dp_size=2)
        four_ranks = _rows(source, step, micro=1, accum=2, dp_size=4)
        assert one_process == two_ranks == four_ranks
        assert len(one_process) == 8


def test_dp_ranks_read_disjoint_samples():
    source = SyntheticTokens(256, 8, seed=1)
    rank0 = [row for b in micro_batches(source, 0, 2, 1, 0, 2) for row in b.tolist()]
    rank1 = [row for b in micro_batches(source, 0, 2, 1, 1, 2) for row in b.tolist()]
    assert not set(map(tuple, rank0)) & set(map(tuple, rank1))


def test_local_text_dataset_through_datasets(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(50)))
    source = token_source(DataConfig(kind="text", path=str(path)), vocab_size=256, seq_len=32)
    first = source.sample(0)
    assert first.shape == (32,)
    assert bytes(first.tolist()).decode("utf-8") == path.read_text()[:32]
    batch = next(micro_batches(source, 0, 2, 1, 0, 1))
    assert batch.shape == (2, 32)
