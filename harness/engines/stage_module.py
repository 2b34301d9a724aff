"""One pipeline stage of a Hugging Face decoder-only LM, made of the model's own modules (no copies of weights):
the stage module of both pipeline engines (DeepSpeed's PipelineModule and torch.distributed.pipelining)."""

from __future__ import annotations

import copy
from typing import List

import torch


class StageModule(torch.nn.Module):
    """The embedding (first stage), decoder layers, the final norm and LM head (last stage).

    As the model's own forward does, the stage computes rotary embeddings once for its layers, from positions
    0..seq-1, and passes no attention mask (SDPA is causal by itself): stages exchange nothing but hidden
    states. `seq_scale`: sequence parallelism hands each rank 1/tp of the sequence between layers.
    """

    def __init__(self, model, layers: List[int], embedding: bool, head: bool, seq_scale: int = 1):
        super().__init__()
        inner = model.model
        self.embed_tokens = inner.embed_tokens if embedding else None
        # Keyed by the model's layer index, so a layer keeps its name in every stage split.
        self.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in layers})
        self.norm = inner.norm if head else None
        self.lm_head = model.lm_head if head else None
        self.rotary_emb = copy.deepcopy(inner.rotary_emb)
        self.seq_scale = seq_scale

    def forward(self, x, positions=None):
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        if positions is None:
            seq = x.shape[1] * self.seq_scale
            positions = torch.arange(seq, device=x.device).unsqueeze(0)
        rotary = self.rotary_emb(x, positions)
        for layer in self.layers.values():
            x = layer(x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x
