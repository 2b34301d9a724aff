"""`harness recommend`: rank a model's layouts on a cluster, print the top k and why, write a sweep preset."""

from __future__ import annotations

import argparse
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import yaml

from harness.config.arguments import OneLineParser, refuse_unknown, slug, whole_number
from harness.config.compose import CONFIG_DIR, compose_run_config
from harness.config.errors import explain as explain_error
from harness.plan.planner import Plan
from harness.plan.recommend import explain, rank

LAYOUT_FIELDS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "pp_schedule",
                 "pp_virtual_stages", "pp_stage_layers", "offload_optimizer", "offload_params", "micro_batch",
                 "grad_accum", "seq_len", "activation_checkpointing", "precision")


def label(plan: Plan) -> str:
    """The layout in one short line."""
    l = plan.layout
    sched = f" {l.pp_schedule}x{l.pp_virtual_stages}" if l.pp > 1 else ""
    off = f" offload={l.offload_optimizer}" if l.offload_optimizer != "none" else ""
    return (f"tp{l.tp} cp{l.cp} pp{l.pp}{sched} dp{l.dp_replicate}x{l.dp_shard} zero{l.zero_stage} "
            f"mb{l.micro_batch} ga{l.grad_accum} ckpt={l.activation_checkpointing}{off}")


def row(index: int, plan: Plan) -> str:
    t = plan.time
    comm = sum(c["exposed"] for c in t.comm_s.values())
    return (f"{index}. {label(plan)}\n   {plan.tokens_per_s:,.0f} tokens/s, step {plan.step_time_s:.2f} s, "
            f"MFU {plan.predicted_mfu:.1%}, HFU {plan.predicted_hfu:.1%}, memory {plan.memory.total_bytes / 2**30:.1f} "
            f"GiB (margin {plan.margin_bytes / 2**30:.1f})\n   compute {sum(t.compute_s.values()):.2f} s, exposed "
            f"comm {comm:.2f} s, bubble {t.bubble_s:.2f} s, optimizer {t.optimizer_s:.2f} s, offload {t.offload_s:.2f} s")


def sweep_preset(plans: Sequence[Plan], name: str, model: str, engine: str, cluster: str) -> Dict[str, Any]:
    """Files (relative to hydra_configs/) of one layout preset per plan and a sweep over them."""
    files: Dict[str, Any] = {}
    names = []
    for i, plan in enumerate(plans, 1):
        layout_name = f"{name}_{i}"
        fields = {k: _plain(getattr(plan.layout, k)) for k in LAYOUT_FIELDS}
        files[f"layout/{layout_name}.yaml"] = {"name": layout_name, **fields}
        names.append(layout_name)
    files[f"sweep/{name}.yaml"] = {
        "defaults": [{"override /model": _plain(model)}, {"override /engine": _plain(engine)},
                     {"override /cluster": _plain(cluster)}],
        "sweep_name": name,
        "hydra": {"sweeper": {"params": {"layout": ",".join(names)}}},
    }
    return files


def _plain(value: Any) -> Any:
    """A layout value as YAML writes it: enums by their value, sequences as lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_preset(files: Dict[str, Any], root: Path) -> List[Path]:
    paths = []
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "# @package _global_\n" if rel.startswith("sweep/") else ""
        path.write_text(header + "# Written by `harness recommend`: the top layouts by predicted tokens/s.\n"
                        + yaml.safe_dump(content, sort_keys=False))
        paths.append(path)
    return paths


def parse_args(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """The options; every other argument is a Hydra override of the model, engine and cluster."""
    parser = OneLineParser(
        prog="harness recommend", epilog="Other arguments are Hydra overrides, e.g. model=llama3_1_8b "
        "cluster=h100_8x8 engine=nd.",
        description="Rank every layout of a model on a cluster by predicted tokens/s; print the top K and why "
                    "the first beats the second; write them as a sweep preset.")
    parser.add_argument("--top", type=whole_number, default=5, metavar="K",
                        help="how many of the best layouts to print and write (default 5)")
    parser.add_argument("--global-batch", type=whole_number, required=True, metavar="SEQS",
                        help="sequences per optimizer step, the same for every layout ranked")
    parser.add_argument("--name", type=slug, default="recommended", metavar="NAME",
                        help="the preset's name: hydra_configs/sweep/NAME.yaml and layout/NAME_<i>.yaml "
                             "(letters, digits, '.', '_', '-'; default recommended)")
    parser.add_argument("--no-write", action="store_true", help="print the ranking only, write no preset")
    args, extra = parser.parse_known_args(list(argv))
    return args, refuse_unknown(parser.prog, extra)


def recommend_main(argv: Sequence[str]) -> int:
    """`harness recommend [--top K] [--global-batch SEQS] [--name NAME] [--no-write] overrides...`."""
    args, overrides = parse_args(argv)
    try:
        cfg = compose_run_config(overrides)
    except Exception as error:  # every composition and value error becomes one line
        print(f"harness recommend: {explain_error(error)}", file=sys.stderr)
        return 2
    start = time.process_time()
    top, fitting = rank(cfg, args.global_batch, args.top)
    print(f"{fitting} fitting layouts ranked in {time.process_time() - start:.2f} s CPU")
    if not top:
        print("no layout fits", file=sys.stderr)
        return 1
    for i, plan in enumerate(top, 1):
        print(row(i, plan))
    if len(top) > 1:
        print("why #1 beats #2: " + explain(top[0], top[1]))
    if not args.no_write:
        files = sweep_preset(top, args.name, cfg.model.name, cfg.engine.name, cfg.cluster.name)
        for path in write_preset(files, CONFIG_DIR):
            print(f"wrote {path}")
        print(f"verify with: harness sweep sweep={args.name}")
    return 0
