"""Fill what a layout leaves open: a data-parallel degree of -1 (torchtitan's convention), and the fields the
`default` layout preset leaves null, from the cluster and the model. Only open fields are filled; a value
the user gives (command line, preset, recipe) is never changed; a preset name of the generated form
(`dp2_zero2`) follows the fields it spells."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Tuple

from harness.config.schema import RunConfig, sharded_zero_stage

FILLABLE = ("dp_replicate", "dp_shard")
FIXED = ("tp", "pp", "cp")
# The layout fields the `default` preset leaves null.
OPEN_FIELDS = ("dp_shard", "zero_stage", "micro_batch", "seq_len", "activation_checkpointing")
# On a CPU cluster the open fields take the CPU toy's values, those of hydra_configs/layout/dp2_zero2.yaml
# (tests/unit/config/test_fill.py holds them equal), so the CPU defaults are what they always were.
CPU_TOY = {"dp_shard": 2, "zero_stage": 2, "micro_batch": 2, "seq_len": 64, "activation_checkpointing": "none"}
CPU_SOURCE = "the CPU toy, as layout=dp2_zero2"
# On accelerators, torchtitan's defaults (torchtitan/models/llama3/train_configs/*.toml): dp_shard=-1 shards
# parameters, gradients and optimizer states over every rank (FSDP FULL_SHARD, i.e. ZeRO-3), one sequence
# per rank per micro-step (local_batch_size = 1), at the model's pre-training length (model.train_seq_len),
# recomputing every block (activation_checkpoint mode = "full", its 70B and 405B setting: at 8,192 tokens a
# 70B model's saved activations alone exceed an 80 GiB H100 without it; `harness recommend` finds faster).
ACCELERATOR_FIXED = {"zero_stage": 3, "micro_batch": 1, "activation_checkpointing": "full"}
# The resolver behind the `default` preset's name (hydra_configs/layout/default.yaml).
NAME_RESOLVER = "harness_default_layout_name"
# The resolver behind run folders' names (hydra_configs/config.yaml: hydra.run.dir, hydra.sweep.subdir).
RUN_NAME_RESOLVER = "harness_run_layout_name"


class DegreeFillError(ValueError):
    """An open layout field that cannot be filled; the message names the fields and the numbers."""


def fill_data_parallel(run: RunConfig) -> RunConfig:
    """`layout.dp_shard=-1` (or dp_replicate) becomes world / (the other degrees), so a sweep over
    tp / pp / cp keeps the cluster's world size. ep borrows ranks from dp_shard x cp and does not count."""
    return fill_layout(run)[0]


def fill_layout(run: RunConfig) -> Tuple[RunConfig, Dict[str, Tuple[Any, str]]]:
    """The run with every open layout field filled, and what was filled: {field: (value, where it came from)}."""
    layout_fields = {key: getattr(run.layout, key) for key in (*FILLABLE, *FIXED, *OPEN_FIELDS[1:])}
    model = {"name": run.model.name, "hub_id": run.model.hub_id, "train_seq_len": run.model.train_seq_len}
    filled = open_field_values(layout_fields, run.cluster.nodes, run.cluster.accelerators_per_node,
                               run.cluster.accelerator, model, sharded_zero_stage(run.engine.name))
    values = {key: value for key, (value, _) in filled.items()}
    if run.layout.name is None or GENERATED_NAME.fullmatch(run.layout.name):
        name = layout_name({**layout_fields, **values})
        if name != run.layout.name:
            values["name"] = name
    if not values:
        return run, {}
    return replace(run, layout=replace(run.layout, **values)), filled


def open_field_values(layout: Mapping[str, Any], nodes: int, per_node: int, accelerator: str,
                      model: Mapping[str, Any], zero_stage_default: int = 3) -> Dict[str, Tuple[Any, str]]:
    """{field: (value, source)} for the layout's open fields: -1 degrees and the `default` preset's nulls. On
    accelerators zero_stage takes the engine's most sharded stage (harness.config.schema.SHARDED_ZERO_STAGE:
    torchtitan's ZeRO-3, or the distributed optimizer of the Megatron-LM export)."""
    filled: Dict[str, Tuple[Any, str]] = {}
    on_cpu = accelerator == "cpu"
    label = None
    if layout["dp_shard"] is None:
        if on_cpu:
            filled["dp_shard"] = (CPU_TOY["dp_shard"], CPU_SOURCE)
        elif layout["dp_replicate"] == -1:  # the given -1 takes the world; the open degree stays 1
            filled["dp_shard"] = (1, "layout.dp_replicate=-1 takes the world")
        else:  # on accelerators an open dp_shard fills the world, as -1 does
            label = "layout.dp_shard (not set)"
        layout = {**layout, "dp_shard": filled["dp_shard"][0] if "dp_shard" in filled else -1}
    degree = _filled_degree(layout, nodes, per_node, label)
    if degree:
        axis, value, used = degree
        filled[axis] = (value, f"all {nodes * per_node} ranks" if used == 1 else f"{nodes * per_node} ranks / {used}")
    for key in OPEN_FIELDS:
        if layout.get(key) is not None or key in filled:
            continue
        if on_cpu:
            filled[key] = (CPU_TOY[key], CPU_SOURCE)
        elif key == "zero_stage" and zero_stage_default != ACCELERATOR_FIXED[key]:
            filled[key] = (zero_stage_default, "the engine's sharded optimizer")
        elif key in ACCELERATOR_FIXED:
            filled[key] = (ACCELERATOR_FIXED[key], "torchtitan's defaults")
        else:
            filled[key] = (_model_seq_len(model), f"model.train_seq_len of {model['name']}")
    return filled


def _model_seq_len(model: Mapping[str, Any]) -> int:
    """The model preset's pre-training length; a hub id or a preset without one must say the length."""
    if model.get("hub_id") or not model.get("train_seq_len"):
        what = f"model.hub_id={model['hub_id']!r}" if model.get("hub_id") else f"model={model['name']}"
        raise DegreeFillError(f"layout.seq_len is not set and {what} gives no pre-training length "
                              "(model.train_seq_len): set layout.seq_len=N")
    return int(model["train_seq_len"])


def _filled_degree(layout: Mapping[str, Any], nodes: int, per_node: int,
                   label: Optional[str] = None) -> Optional[Tuple[str, int, int]]:
    """(axis, world / the other degrees, the other degrees) for the one data-parallel degree given as -1."""
    wildcards = [axis for axis in FILLABLE if layout[axis] == -1]
    if not wildcards:
        return None
    if len(wildcards) > 1:
        raise DegreeFillError("layout.dp_replicate=-1 and layout.dp_shard=-1: only one degree can fill the world")
    world = nodes * per_node
    others = [axis for axis in (*FILLABLE, *FIXED) if axis != wildcards[0]]
    # a size below 1 is its own mistake: named as such, not as a world the fill cannot divide
    for field, value in (("cluster.nodes", nodes), ("cluster.accelerators_per_node", per_node),
                         *((f"layout.{axis}", layout[axis]) for axis in others)):
        if value < 1:
            raise DegreeFillError(f"{field}={value} must be >= 1")
    used = 1
    for axis in others:
        used *= layout[axis]
    factors = " x ".join(f"{axis}={layout[axis]}" for axis in others)
    if used < 1 or world % used:
        raise DegreeFillError(
            f"{label or f'layout.{wildcards[0]}=-1'} fills the world: cluster.nodes={nodes} x "
            f"cluster.accelerators_per_node={per_node} = {world} is not a multiple of {factors} = {used}")
    return wildcards[0], world // used, used


# Name prefixes of the degrees a filled layout's name shows where they are above 1.
NAME_AXES = {"dp_replicate": "dpr", "tp": "tp", "pp": "pp", "cp": "cp"}


# A name of layout_name's own form (a preset such as dp2_zero2) follows the fields it spells: with
# layout.zero_stage=3 the run is dp2_zero3, never a ZeRO-3 run filed as dp2_zero2. Other names are the user's.
GENERATED_NAME = re.compile(r"dp\d+(_(dpr|tp|pp|cp)\d+)*_zero\d")


def layout_name(layout: Mapping[str, Any]) -> str:
    """`dp2_zero2`, `dp8_tp8_zero3`: data parallel always, the other degrees above 1, and the ZeRO stage."""
    parts = [f"dp{layout['dp_shard']}"]
    parts += [f"{label}{layout[axis]}" for axis, label in NAME_AXES.items() if layout[axis] not in (1, -1)]
    return "_".join([*parts, f"zero{layout['zero_stage']}"])


def default_layout_name(*, _root_: Any) -> str:
    """The `default` preset's name, resolved from the composed config so that run folders carry it too;
    `default` where the layout cannot be filled (the same fill then refuses it with the reason)."""
    cluster, layout, model = _root_.cluster, _root_.layout, _root_.model
    fields = {key: layout[key] for key in (*FILLABLE, *FIXED, *OPEN_FIELDS[1:])}
    try:
        filled = open_field_values(fields, cluster.nodes, cluster.accelerators_per_node, cluster.accelerator,
                                   {"name": model.name, "hub_id": model.hub_id,
                                    "train_seq_len": model.get("train_seq_len")},
                                   sharded_zero_stage(_root_.engine.name))
    except DegreeFillError:
        return "default"
    return layout_name({**fields, **{key: value for key, (value, _) in filled.items()}})


def run_layout_name(*, _root_: Any) -> str:
    """The layout's name as a run folder shows it: a name of layout_name's own form follows the fields as
    fill_layout renames the run's (recipes=cpu_zero2 layout.zero_stage=3 is dp2_zero3, not a dp2_zero2 folder
    beside a dp2_zero3 layout), another name is the user's."""
    name = _root_.layout.name
    if name is None or GENERATED_NAME.fullmatch(str(name)):
        return default_layout_name(_root_=_root_)
    return str(name)


def fill_note(run: RunConfig, filled: Mapping[str, Tuple[Any, str]]) -> str:
    """One line saying which layout fields were filled, with what, and from where (each source named once)."""
    groups: Dict[str, list] = {}
    for key, (value, source) in filled.items():
        groups.setdefault(source, []).append(f"layout.{key}={value}")
    parts = [f"{', '.join(fields)} ({source})" for source, fields in groups.items()]
    cluster = run.cluster
    return (f"[harness] layout not given in full; filled for cluster={cluster.name} ({cluster.ranks} x "
            f"{cluster.accelerator}): {'; '.join(parts)}. Set any of them to override")
