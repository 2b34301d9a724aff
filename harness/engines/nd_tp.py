"""The nd engine's tensor- and sequence-parallel plan of one decoder layer, from transformers' own plan.

transformers gives most decoder families a `base_model_tp_plan` (`layers.*.self_attn.q_proj: colwise`, ...):
which projections split their output features and which their input features. This module translates its
style names into the torch ParallelStyles `nd.apply` builds (`nd_plans.json`'s `layer_plan`) and adds only
what transformers lacks: sequence parallelism (the layer's norms on sequence shards, the attention and MLP
inputs gathered), row-parallel outputs reduce-scattered to sequence shards, and the routed-expert block kept
whole over TP. A family without a plan, or with a style nd cannot apply, is refused with a message naming it.

Plain data, no torch: the layer's module names come from the shape JSON (harness.config.model_shape).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

REPLICATE, SHARD_SEQ = "Replicate()", "Shard(1)"

# transformers' style name -> the torch style and its arguments (transformers.distributed.tensor_parallel
# registers the same layouts under these names). Column-parallel styles split output features; "_rep" and
# "_gather_output" gather them back (e.g. OLMo 2 normalises the whole q and k), their row-parallel partners
# split a replicated input locally.
COLWISE = {"colwise": {}, "colwise_rep": {"output_layouts": REPLICATE},
           "colwise_gather_output": {"output_layouts": REPLICATE}}  # fmt: skip
ROWWISE = {"rowwise": {}, "rowwise_rep": {"input_layouts": REPLICATE},
           "rowwise_split_input": {"input_layouts": REPLICATE}}  # fmt: skip
# A routed-expert block: nd keeps it whole on every TP rank (entries under it are dropped).
EXPERTS = "moe_tp_experts"
# Weights a column-parallel projection feeds per head (Qwen 3's q/k norms): replicated, with their
# gradients summed over the TP group, since each rank's heads see a different part of them.
GRAD_ALLREDUCE = "replicated_with_grad_allreduce"
# nd's own style for GRAD_ALLREDUCE (nd.build_style builds it; not a torch.distributed.tensor.parallel name).
ND_GRAD_ALLREDUCE = "ReplicateWithGradAllReduce"


def _style(style: str, **kwargs: Any) -> Dict[str, Any]:
    return {"style": style, **kwargs}


def family_tp_plan(hf_config: Mapping[str, Any]) -> Tuple[Dict[str, str], str]:
    """The family's per-layer plan keyed by path inside a decoder layer, and its source
    ("transformers", "harness" for what transformers lacks, or "none"), as the model's shape records them."""
    from harness.config.model_shape import model_shape

    shape = model_shape(hf_config)
    return dict(shape["tp_plan"]), shape["tp_plan_source"]


def _layer_modules(hf_config: Mapping[str, Any]) -> Tuple[List[List[str]], List[str]]:
    """Module paths holding parameters, per distinct decoder layer kind, and the layer's own norms."""
    from harness.config.model_shape import model_shape

    shape = model_shape(hf_config)
    kinds = [sorted({row[0].rsplit(".", 1)[0] for row in rows}) for rows in shape["layer_kinds"]]
    norms = [path for path in kinds[0] if "." not in path and "norm" in path]
    return kinds, norms


def _blocks(plan: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """(attention block, routed-expert block): the first path component of the attention entries, and the
    parent of the experts entry."""
    attention = next((p.split(".", 1)[0] for p in plan if "attn" in p.split(".", 1)[0]
                      or "attention" in p.split(".", 1)[0]), None)  # fmt: skip
    moe = next((p.rsplit(".", 1)[0] for p, s in plan.items() if s == EXPERTS and "." in p), None)
    return attention, moe


def tp_plan_problems(hf_config: Mapping[str, Any]) -> List[str]:
    """Why nd cannot split this family over TP (empty when it can)."""
    model_type = hf_config.get("model_type")
    plan, source = family_tp_plan(hf_config)
    if source == "none":
        return [f"model.hf_config.model_type={model_type!r} has no tensor-parallel plan: transformers gives "
                f"the family no base_model_tp_plan and the harness adds none (use tp=1)"]
    attention, moe = _blocks(plan)
    kept = {p: s for p, s in plan.items() if not (moe and (p == moe or p.startswith(moe + ".")))}
    unknown = sorted({s for s in kept.values() if s not in COLWISE and s not in ROWWISE and s != GRAD_ALLREDUCE})
    problems = []
    if unknown:
        problems.append(f"model_type={model_type!r}: transformers' base_model_tp_plan uses "
                        f"{', '.join(unknown)}, which engine=nd cannot apply (it applies "
                        f"{', '.join([*COLWISE, *ROWWISE, GRAD_ALLREDUCE, EXPERTS])})")
    if attention is None:
        problems.append(f"model_type={model_type!r}: base_model_tp_plan splits no attention block")
    kinds, _ = _layer_modules(hf_config)
    if len({tuple(p for p in kept if p in kind) for kind in kinds}) > 1:
        problems.append(f"model_type={model_type!r}: decoder layers differ in which modules the plan splits "
                        f"(e.g. dense-first MoE layers); engine=nd applies one plan to every layer")
    return problems


def _split_entries(kept: Mapping[str, str], sp: bool) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for path, style in kept.items():
        if style in COLWISE:
            out[path] = _style("ColwiseParallel", **COLWISE[style])
        elif style in ROWWISE:
            out[path] = _style("RowwiseParallel", **ROWWISE[style], **({"output_layouts": SHARD_SEQ} if sp else {}))
        else:
            out[path] = _style(ND_GRAD_ALLREDUCE)
    return out


def layer_plan(hf_config: Mapping[str, Any], sequence_parallel: bool) -> Dict[str, Dict[str, Any]]:
    """One decoder layer's plan (module path inside the layer -> style), in the order nd applies it.

    Without sequence parallelism it is transformers' plan translated. With it, the layer's norms run on
    sequence shards (SequenceParallel, handing on plain local shards: OLMo 2's norms come after attention
    and MLP, where their output meets the residual stream), the attention block (called with hidden_states=..., as every
    transformers decoder layer calls it) and the MLP gather their input, and row-parallel projections
    reduce-scatter to sequence shards. A routed-expert block stays whole: with sequence parallelism its
    input is gathered and its output re-sharded, so every TP rank routes the same tokens.
    """
    problems = tp_plan_problems(hf_config)
    if problems:
        raise ValueError("; ".join(problems))
    plan, _ = family_tp_plan(hf_config)
    attention, moe = _blocks(plan)
    kinds, norms = _layer_modules(hf_config)
    kept = {p: s for p, s in plan.items() if p in kinds[0] and not (moe and p.startswith(moe + "."))}
    mlp = moe or next((p.split(".", 1)[0] for p in kept if p.split(".", 1)[0] != attention), None)
    out: Dict[str, Dict[str, Any]] = {}
    seq = sequence_parallel
    if seq:  # the first norm (the pre-attention one, where there is one) ahead of attention, the others after
        out.update({norm: _style("SequenceParallel", use_local_output=True) for norm in norms[:1]})
        out[attention] = _style("PrepareModuleInput", input_kwarg_layouts={"hidden_states": SHARD_SEQ},
                                desired_input_kwarg_layouts={"hidden_states": REPLICATE}, use_local_output=True)
    out.update(_split_entries({p: s for p, s in kept.items() if p.startswith(attention + ".")}, seq))
    if seq:
        out.update({norm: _style("SequenceParallel", use_local_output=True) for norm in norms[1:]})
    if seq and moe:
        out[moe] = _style("PrepareModuleInputOutput",
                          input_layouts=[SHARD_SEQ], desired_input_layouts=[REPLICATE], use_local_input=True,
                          output_layouts=[REPLICATE], desired_output_layouts=[SHARD_SEQ], use_local_output=True)
    elif seq and mlp:
        out[mlp] = _style("PrepareModuleInput", input_layouts=[SHARD_SEQ], desired_input_layouts=[REPLICATE],
                          use_local_output=True)  # fmt: skip
    out.update(_split_entries({p: s for p, s in kept.items() if not p.startswith(attention + ".")}, seq))
    return out


# ------------------------------------------------------------------------------------- torch below
def grad_allreduce_style():
    """ND_GRAD_ALLREDUCE as a torch ParallelStyle: the module's weights become replicated DTensors and its
    input this rank's shard of a DTensor (sharded on dim 0: the module normalises the last dim only, so any
    other dim is exact), so autograd sums the weights' partial gradients over the TP group."""
    from torch.distributed.tensor import DTensor, Shard, distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    def input_fn(module, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Shard(0)], run_check=False) for x in inputs)

    def output_fn(module, output, mesh):
        return output.to_local() if isinstance(output, DTensor) else output

    class ReplicateWithGradAllReduce(ParallelStyle):
        def _apply(self, module, device_mesh):
            return distribute_module(module, device_mesh, None, input_fn, output_fn)

    return ReplicateWithGradAllReduce()
