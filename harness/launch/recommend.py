"""`harness recommend`: rank a model's layouts on a cluster, print the top choices part by part and why, and write
them as recipes with a sweep preset in the user's config directory, ready to run on the launcher the cluster needs."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from harness.config.arguments import OneLineParser, refuse_unknown, slug, whole_number
from harness.config.compose import compose_config, compose_run_config, run_config_to_dict, user_config_dir
from harness.config.errors import explain as explain_error
from harness.config.naming import stage_layers_words
from harness.engines import engine_module
from harness.engines.admission import judge, launcher_to_add
from harness.launch.host_profile import measure_host_profile
from harness.launch.prepare import launch_problems
from harness.launch.refusals import Refusals
from harness.plan.planner import GIB, Plan
from harness.plan.recommend import (REGIME_FIELDS, SEARCHED_LAYOUT_FIELDS, TENSOR_PARALLEL_FIELDS, Choice, band_ties,
                                   compare, rank)
from harness.plan.time_limit import local_timeout_problem
from harness.plan.uncertainty import describe, overlaps
from harness.plan.units import format_bytes
from harness.rundir import write_text
from harness.rundir.vocabulary import format_band, format_with_band
from harness.terminal import print_fitted

LAYOUT_FIELDS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "pp_schedule",
                 "pp_virtual_stages", "pp_stage_layers", "offload_optimizer", "offload_params", "micro_batch",
                 "grad_accum", "seq_len", "activation_checkpointing", "precision")
# The groups a written recipe selects by name (the composed run's choices) and the sections it writes whole, so
# that it composes back to the very config that was ranked (command-line values included).
CHOSEN_GROUPS = ("model", "engine", "cluster", "launcher", "data", "tracking")
WRITTEN_SECTIONS = ("engine", "cluster", "launcher", "bench", "data")


def admit(cfg: Any, plan: Plan) -> Sequence[str]:
    """The recommender's validity rule is the one every command uses (harness.engines.admission.judge), and a
    local run's wall-clock limit: a layout the local launcher would stop at launcher.timeout_s is no
    recommendation (`harness run` leaves that limit to the watchdog, which ends such a run TIMEOUT)."""
    errors = judge(cfg, plan).errors
    if errors:
        return errors
    local = local_timeout_problem(cfg, plan)
    return [local] if local else []


def ranked(cfg: Any, global_batch: int, top_k: int, constraint: Optional[Dict[str, str]] = None,
           pinned: Sequence[str] = (), refusals: Optional[Refusals] = None) -> Tuple[List[Choice], int]:
    """The top `top_k` choices among the layouts judge admits (and, given a constraint, whose layout fields
    have its values: `{"tp": "8"}`), and how many it admits; `pinned` regime fields keep the config's value;
    `refusals`, when given, collects why the others were refused.
    A cluster timed by this host's profile (cluster.profile=host) has it measured first when it is missing or
    stale, as a run does: without it no layout has a predicted time to rank by."""
    measure_host_profile(cfg)

    def admit_constrained(point: Any, plan: Plan) -> Sequence[str]:
        unmatched = unmet(plan.layout, constraint) if constraint else []
        if refusals is not None and constraint:
            refusals.saw({k: str(_plain(getattr(plan.layout, k))) for k in constraint})
        if unmatched:
            return unmatched
        reasons = admit(point, plan)
        if refusals is not None:
            refusals.add(plan, reasons)
        return reasons

    return rank(cfg, global_batch, admit_constrained, top_k, pinned)


def no_layout_message(prog: str, refusals: Refusals, global_batch: int,
                      constraint: Optional[Dict[str, str]] = None) -> str:
    """Why the search admitted nothing: the refusals' reasons, or that no candidate was there to judge (one that
    has the `--constrain` values, naming those no candidate has)."""
    missing = refusals.never_seen(constraint) if constraint else {}
    if not refusals.candidates and missing:
        return f"{prog}: no layout fits: " + "; ".join(
            f"no candidate has --constrain {k}={v} (the search's candidates have {k} "
            f"{', '.join(sorted(refusals.values[k], key=_natural))})" for k, v in missing.items())
    if not refusals.candidates:
        has = "has the --constrain values and " if constraint else ""
        return (f"{prog}: no layout fits: no candidate layout {has}makes --global-batch {global_batch} sequences as "
                "data-parallel degree x micro-batch x accumulation")
    first, *rest = refusals.summary(label)
    return "\n".join([f"{prog}: no layout fits: {first}", *rest])


def _natural(text: str) -> Tuple[int, Any]:
    """Numbers in numeric order, before words."""
    return (0, int(text)) if text.isdigit() else (1, text)


def pinned_regime(overrides: Sequence[str]) -> Tuple[str, ...]:
    """The regime and tensor-parallel option fields (harness.plan.recommend.REGIME_FIELDS, TENSOR_PARALLEL_FIELDS)
    the command line sets: the search keeps them."""
    keys = {item.partition("=")[0].lstrip("+~") for item in overrides}
    return tuple(field for field in REGIME_FIELDS + TENSOR_PARALLEL_FIELDS if field in keys)


# The layout fields `--constrain` takes: those the search sets, and the precision it varies (regimes).
CONSTRAINABLE = (*SEARCHED_LAYOUT_FIELDS, "precision")


def unmet(layout: Any, constraint: Dict[str, str]) -> List[str]:
    """The constraint's fields this layout does not have, one message each."""
    return [f"layout.{k}={_plain(getattr(layout, k))} is not the constraint's {k}={v}"
            for k, v in constraint.items() if str(_plain(getattr(layout, k))) != v]


def parse_constraint(items: Sequence[str]) -> Dict[str, str]:
    """`--constrain tp=8 --constrain pp=4` (layout fields; a `layout.` prefix is allowed) -> {"tp": "8", "pp": "4"}:
    fields the search sets (and precision, which it varies), each value checked by the layout's own schema and
    written as the layout holds it (`tp=08` is tp=8)."""
    constraint = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.removeprefix("layout.")
        if not sep or key not in LAYOUT_FIELDS:
            raise ValueError(f"--constrain {item}: expected FIELD=VALUE with FIELD one of {', '.join(CONSTRAINABLE)}")
        if key not in CONSTRAINABLE:
            raise ValueError(f"--constrain {item}: the search does not vary layout.{key}; set layout.{key}={value} "
                             "on the command line instead")
        held = getattr(compose_run_config([f"layout.{key}={value}"]).layout, key)  # the schema's own check
        constraint[key] = str(_plain(held))
    return constraint


def recommend_overrides(overrides: Sequence[str]) -> Tuple[List[str], Optional[str]]:
    """The user's overrides plus the launcher the cluster needs (harness.engines.admission.launcher_to_add)
    where the user chose none; (overrides, the launcher added or None). A layout field the search sets
    (SEARCHED_LAYOUT_FIELDS) is refused, naming the --constrain that keeps it: it was silently ignored."""
    searched = [item for item in overrides if item.lstrip("+~").startswith("layout.")
                and item.lstrip("+~")[len("layout."):].partition("=")[0] in SEARCHED_LAYOUT_FIELDS]
    if searched:
        constrain = " ".join(f"--constrain {item.lstrip('+~')[len('layout.'):]}" for item in searched)
        raise ValueError(f"{', '.join(searched)}: the search sets {'this field' if len(searched) == 1 else 'these'}"
                         f" for every candidate and would ignore the value; `harness recommend {constrain}` ranks "
                         "only layouts that have it")
    launcher = launcher_to_add(overrides, compose_run_config(list(overrides)))
    return ([*overrides, f"launcher={launcher}"] if launcher else list(overrides)), launcher


def label(plan: Plan) -> str:
    """The layout in one short line."""
    l = plan.layout
    sched = f" {l.pp_schedule}x{l.pp_virtual_stages}" if l.pp > 1 else ""
    if l.pp > 1 and l.pp_stage_layers:  # the uneven split the layout needs (pp x virtual stages not dividing L)
        sched += f" split={stage_layers_words(l.pp_stage_layers)}"
    off = "".join(f" offload_{what}={where}" for what, where in (("optimizer", l.offload_optimizer),
                                                                  ("params", l.offload_params)) if where != "none")
    regime = (" fp8" if l.precision == "fp8" else "") + (" compile" if plan.engine.compile else "")
    return (f"tp{l.tp} cp{l.cp} pp{l.pp}{sched} ep{l.ep} dp{l.dp_replicate}x{l.dp_shard} zero{l.zero_stage} "
            f"mb{l.micro_batch} ga{l.grad_accum} ckpt={l.activation_checkpointing}{off}{regime}")


def breakdown(plan: Plan) -> str:
    """The predicted step by part, in seconds: compute, exposed communication per axis (axes with nothing
    exposed are left out; "offload" is the host-link traffic of each micro-batch), bubble, optimizer, and the
    optimizer offload's traffic once a step (gradients down, parameters up, NVMe)."""
    t = plan.time
    comm = ", ".join(f"{axis} {c['exposed']:.3g} s" for axis, c in t.comm_s.items() if c["exposed"] > 0)
    return (f"step {t.step_time_s:.3g} s: compute {sum(t.compute_s.values()):.3g} s, exposed communication "
            f"{comm or '0 s'}, bubble {t.bubble_s:.3g} s, optimizer {t.optimizer_s:.3g} s, "
            f"optimizer offload {t.offload_s:.3g} s")


def row(index: int, choice: Choice) -> str:
    """One choice: engine and layout, throughput and MFU, the step by part, memory per rank and its margin."""
    plan = choice.plan
    alike = f"  (+{len(choice.alike)} layout(s) the model cannot separate: {_alike(choice)})" if choice.alike else ""
    return (f"#{index} engine={plan.engine.name} {label(plan)}{alike}\n"
            f"   {predicted_rate(plan)}, MFU {plan.predicted_mfu:.1%}, {breakdown(plan)}\n"
            f"   memory {format_bytes(plan.memory.total_bytes)} per rank of {format_bytes(plan.device_memory_bytes)} "
            f"(margin {format_bytes(plan.margin_bytes)})")


def predicted_rate(plan: Plan) -> str:
    """The predicted tokens/s with its band: `48,700 tokens/s (±9%)`."""
    band = plan.prediction_band
    return format_with_band(plan.tokens_per_s, band.half_width if band else None, band.source if band else None,
                            "tokens/s")


def ties_line(top: Sequence[Choice], measure: str) -> str:
    """Which choices the model's band cannot separate from #1, in words, and how to measure them; or that it
    separates them all (harness.plan.recommend.band_ties)."""
    if len(top) < 2:
        return ""
    tied = band_ties(top)
    band = top[0].plan.prediction_band
    width = format_band(band.half_width) if band else "±0%"
    if not tied:
        return (f"#2 to #{len(top)} lie beyond the model's error of #1 (no {width} band overlaps #1's): the "
                "prediction separates them")
    names = _and([f"#{rank}" for rank in tied])
    verb = "is" if len(tied) == 1 else "are"
    # overlapping bands, not one inside the other's: #2 may lie up to two band widths below #1
    return (f"{names} {verb} within the model's error of #1 (the {width} bands overlap): a tie the prediction "
            f"cannot break; measure them ({measure})")


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def band_notes(top: Sequence[Choice]) -> List[str]:
    """What each distinct band of the choices means (harness.plan.uncertainty.describe)."""
    bands = {choice.plan.prediction_band for choice in top if choice.plan.prediction_band is not None}
    return [f"note: {describe(band)}" for band in sorted(bands, key=lambda b: (b.regime, b.half_width))]


def _alike(choice: Choice, shown: int = 2) -> str:
    names = [label(p) for p in choice.alike[:shown]]
    return "; ".join(names) + ("; ..." if len(choice.alike) > shown else "")


def why(title: str, best: Plan, other: Plan) -> str:
    """`best` against `other`, part by part (harness.plan.recommend.compare)."""
    head, *parts = compare(best, other)
    if overlaps(best.tokens_per_s, best.prediction_band, other.tokens_per_s, other.prediction_band):
        width = format_band(best.prediction_band.half_width) if best.prediction_band else ""
        parts.append(f"their {width} bands overlap: a tie on the prediction; the parts above say where "
                     "the model puts the difference, a measurement decides it")
    return f"why #1 over {title}: {head}\n" + "\n".join(f"   {line}" for line in parts)


def against_config(overrides: Sequence[str], name: str) -> Any:
    """`--against NAME`: a recipe (recipes/NAME.yaml, or one the user wrote) or a layout preset
    (hydra_configs/layout/NAME.yaml) composed over the same overrides."""
    try:
        return compose_run_config([*overrides, f"recipes={name}"])
    except Exception:  # not a recipe: a layout preset, or the line naming what is wrong
        return compose_run_config([*overrides, f"layout={name}"])


def recipe(plan: Plan, choices: Dict[str, Any], groups: Dict[str, Any], cfg: Any, name: str,
           note: str) -> Tuple[str, Dict[str, Any]]:
    """(header, body) of one recipe: the composed groups by name, the whole layout, and of the other sections
    the values the ranked config gives that its groups alone (`groups`, as run_config_to_dict) do not: a
    group chosen after the recipe on a command line (`launcher=local`) then takes effect."""
    point = replace(cfg, layout=plan.layout, engine=plan.engine)
    values = run_config_to_dict(point)
    body: Dict[str, Any] = {"defaults": [{f"override /{group}": choices[group]} for group in CHOSEN_GROUPS
                                         if choices.get(group)]}
    body["sweep_name"], body["results_dir"] = cfg.sweep_name, cfg.results_dir
    body["layout"] = {"name": name, **{k: _plain(getattr(plan.layout, k)) for k in LAYOUT_FIELDS}}
    sections = {section: {k: _plain(v) for k, v in values[section].items()
                          if k != "name" and _plain(v) != _plain(groups[section].get(k))}
                for section in WRITTEN_SECTIONS}
    if plan.cluster.accelerator != "cpu" and point.launcher.backend == "slurm":
        sections["launcher"]["gpus_per_node_gres"] = f"gpu:{plan.cluster.accelerators_per_node}"
    body.update({section: fields for section, fields in sections.items() if fields})
    return f"# @package _global_\n# Written by `harness recommend`: {note}\n", body


def preset_files(top: Sequence[Choice], name: str, overrides: Sequence[str], cfg: Any,
                 command: str) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """Files (relative to the user's config directory) of one recipe per choice and a sweep over them."""
    choices = dict(compose_config(list(overrides), return_hydra_config=True).hydra.runtime.choices)
    groups = run_config_to_dict(compose_run_config([f"{group}={choices[group]}" for group in CHOSEN_GROUPS
                                                    if choices.get(group)]))
    cfg = replace(cfg, sweep_name=name)
    files = {}
    for i, choice in enumerate(top, 1):
        plan = choice.plan
        note = (f"choice #{i} of `{command}`, predicted {predicted_rate(plan)}, MFU "
                f"{plan.predicted_mfu:.1%}, {format_bytes(plan.memory.total_bytes)} per rank")
        files[f"recipes/{name}_{i}.yaml"] = recipe(plan, choices, groups, cfg, f"{name}_{i}", note)
    files[f"sweep/{name}.yaml"] = (
        f"# @package _global_\n# Written by `harness recommend`: the top choices of `{command}`.\n",
        {"sweep_name": name, "results_dir": cfg.results_dir,
         "hydra": {"sweeper": {"params": {"recipes": ",".join(f"{name}_{i}" for i in range(1, len(top) + 1))}}}})
    return files


def _plain(value: Any) -> Any:
    """A value as YAML writes it: enums by their value, sequences as lists, mappings as dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def write_preset(files: Dict[str, Tuple[str, Dict[str, Any]]], root: Path) -> List[Path]:
    paths = []
    for rel, (header, content) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, header + yaml.safe_dump(content, sort_keys=False, default_flow_style=None, width=120))
        paths.append(path)
    return paths


def parse_args(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """The options; every other argument is a Hydra override of the model, engine and cluster."""
    parser = OneLineParser(
        prog="harness recommend", epilog="Other arguments are Hydra overrides, e.g. model=llama3_1_8b "
        "cluster=h100_8x8 engine=nd.",
        description="Rank every layout of a model on a cluster by predicted tokens/s; print the top K, grouped "
                    "where the model cannot separate them, and why the first beats the second; write them as "
                    "recipes and a sweep preset in the user config directory.")
    parser.add_argument("--top", type=whole_number, default=5, metavar="K",
                        help="how many of the best choices to print and write (default 5)")
    parser.add_argument("--global-batch", type=whole_number, required=True, metavar="SEQS",
                        help="sequences per optimizer step, the same for every layout ranked")
    parser.add_argument("--name", type=slug, default="recommended", metavar="NAME",
                        help="the preset's name: sweep/NAME.yaml and recipes/NAME_<i>.yaml in the user config "
                             "directory ($HARNESS_CONFIG_DIR, else ~/.config/harness; letters, digits, '.', '_', "
                             "'-'; default recommended)")
    parser.add_argument("--against", default=None, metavar="RECIPE",
                        help="a recipe or layout preset to compare the winner with, part by part")
    parser.add_argument("--constrain", action="append", default=[], metavar="FIELD=VALUE",
                        help="rank only layouts with this layout field's value (repeatable): --constrain tp=8")
    parser.add_argument("--no-write", action="store_true", help="print the ranking only, write no preset")
    args, extra = parser.parse_known_args(list(argv))
    return args, refuse_unknown(parser.prog, extra)


def recommend_main(argv: Sequence[str]) -> int:
    """`harness recommend --global-batch SEQS [--top K] [--name NAME] [--against RECIPE] [--no-write] overrides`."""
    args, overrides = parse_args(argv)
    engines = [item for item in overrides if item.lstrip("+~").startswith("engine=") and "," in item]
    if engines:
        print(f"harness recommend: {engines[0]}: the search ranks within one engine; run it once per engine "
              "(`harness tune engine=A,B` measures the top layouts of several)", file=sys.stderr)
        return 2
    try:
        constraint = parse_constraint(args.constrain)
        overrides, launcher = recommend_overrides(overrides)
        cfg = compose_run_config(overrides)
        other = against_config(overrides, args.against) if args.against else None
    except Exception as error:  # every composition and value error becomes one line
        print(f"harness recommend: {explain_error(error)}", file=sys.stderr)
        return 2
    # The run's own checks (bench steps, tracking) too: a recipe written here must not be pruned downstream; and
    # the engine's rules on the model alone, which would refuse every candidate.
    run_problems = launch_problems(cfg) + engine_module(cfg.engine.name).model_problems(cfg)
    if run_problems:
        print(f"harness recommend: {'; '.join(run_problems)}", file=sys.stderr)
        return 2
    if launcher:
        print(f"cluster.nodes={cfg.cluster.nodes}: ranked for launcher={launcher} (a Slurm job across the nodes)")
    start = time.process_time()
    refusals = Refusals()
    top, admitted = ranked(cfg, args.global_batch, args.top, constraint, pinned_regime(overrides), refusals)
    print(f"{admitted} admitted layouts ranked in {time.process_time() - start:.2f} s CPU")
    if not top:
        print(no_layout_message("harness recommend", refusals, args.global_batch, constraint), file=sys.stderr)
        return 1
    print_fitted("\n".join(row(i, choice) for i, choice in enumerate(top, 1)))
    measure = (f"harness sweep sweep={args.name}" if not args.no_write
               else f"drop --no-write, then harness sweep sweep={args.name}")
    for line in [ties_line(top, measure), *band_notes(top)]:
        if line:
            print_fitted(line)
    if len(top) > 1:
        print_fitted(why("#2", top[0].plan, top[1].plan))
    if other is not None:
        print_fitted(against(top[0].plan, other, args.against))
        for line in replaced_groups(overrides, args.against):
            print_fitted(f"   {line}")
    if not args.no_write:
        write_recommendation(top, args.name, overrides, cfg, argv)
    return 0


def against(best: Plan, other_cfg: Any, name: str) -> str:
    """The winner against the user's own recipe or layout, or every reason that one is refused."""
    verdict = judge(other_cfg)
    if not verdict.admitted:
        return f"--against {name} is refused:\n" + "\n".join(f"   {e}" for e in verdict.errors)
    if verdict.plan.time is None:
        return f"--against {name}: no predicted step time ({'; '.join(verdict.warnings)})"
    return why(name, best, verdict.plan) + "".join(f"\n   {line}" for line in unlike(best, verdict.plan, name))


def unlike(best: Plan, other: Plan, name: str) -> List[str]:
    """What differs between the winner and `--against` beyond the layout: the sequence length and the global
    batch (tokens/s at another batch amortises the step's fixed costs differently) and the regime (FP8,
    compile), each named."""
    lines = []
    best_seq, other_seq = best.layout.seq_len, other.layout.seq_len
    if other_seq != best_seq:
        lines.append(f"{name} runs sequences of {other_seq:,} tokens, #1 {best_seq:,} (layout.seq_len)")
    if other.tokens_per_step // other_seq != best.tokens_per_step // best_seq:
        lines.append(f"{name} runs {other.tokens_per_step // other_seq:,} sequences a step, #1 "
                     f"{best.tokens_per_step // best_seq:,} (--global-batch)")
    if other.tokens_per_step != best.tokens_per_step:
        lines.append(f"{name} runs {other.tokens_per_step:,} tokens a step, #1 {best.tokens_per_step:,}: the parts "
                     "above are scaled to #1's tokens")

    def regime(plan: Plan) -> str:
        return f"{plan.layout.precision} {'compile' if plan.engine.compile else 'eager'}"

    if regime(best) != regime(other):
        lines.append(f"#1 runs {regime(best)}, {name} {regime(other)}: set layout.precision and engine.compile to "
                     f"rank in {name}'s regime")
    return lines


def replaced_groups(overrides: Sequence[str], name: str) -> List[str]:
    """The model and engine of recipe `name` that the command line's replace in `--against` (composed over the
    same overrides, so that both run the same model), one line each; none for a layout preset."""
    try:
        own = compose_run_config([f"recipes={name}"])
    except Exception:  # a layout preset: it has no model or engine of its own
        return []
    composed = compose_run_config([*overrides, f"recipes={name}"])
    return [f"{name} is planned with the command line's {group}={getattr(composed, group).name} (its own: "
            f"{getattr(own, group).name})" for group in ("model", "engine")
            if getattr(composed, group).name != getattr(own, group).name]


def write_recommendation(top: Sequence[Choice], name: str, overrides: Sequence[str], cfg: Any,
                         argv: Sequence[str]) -> None:
    command = "harness recommend " + " ".join(argv)
    root = user_config_dir()
    for path in write_preset(preset_files(top, name, overrides, cfg, command), root):
        print_fitted(f"wrote {path}")
    print_fitted(f"run them with: harness sweep sweep={name}   (one alone: harness run recipes={name}_1)")


# A shipped recipe whose layout is not the recommender's overall choice says so on one line, with the layout
# fields it keeps and why: `# constraint: tp=8 pp=4 -- shows TP8 within a node and PP4 across nodes`.
CONSTRAINT_LINE = "# constraint:"
# A recipe is the recommender's choice when it is predicted within 3% of the best tokens/s (for its engine, at its
# global batch, under its constraint): closer than that is inside the model's resolution (RESOLUTION) with room
# for the choice's representative to be the simplest rather than the fastest of its group.
CHOICE_TOLERANCE = 0.03


@dataclass(frozen=True)
class Standing:
    """A recipe's plan beside the recommender's best for the same model, cluster, engine and global batch."""

    recipe: str
    plan: Plan
    best: Optional[Choice]
    constraint: Dict[str, str]
    reason: str

    @property
    def ratio(self) -> Optional[float]:
        """The recipe's predicted tokens/s over the fastest layout of the best choice."""
        if self.best is None or not self.plan.tokens_per_s:
            return None
        return self.plan.tokens_per_s / max(p.tokens_per_s for p in (self.best.plan, *self.best.alike))


def recipe_constraint(text: str) -> Tuple[Dict[str, str], str]:
    """The constraint line of a recipe's text (its reason may go on over `#   ` lines): ({field: value}, why), or
    ({}, "") without one."""
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if line.startswith(CONSTRAINT_LINE):
            fields, _, reason = line[len(CONSTRAINT_LINE):].partition(" -- ")
            for more in lines[at + 1:]:
                if not more.startswith("#   "):
                    break
                reason += " " + more[1:].strip()
            return parse_constraint(fields.split()), reason.strip()
    return {}, ""


def preset_row(recipe: str) -> str:
    """README's GPU-preset table row of one recipe: its layout, predicted MFU and memory, the engine's best MFU
    without the recipe's constraint, and the constraint kept (`python tools/gpu_preset_table.py` prints all)."""
    found = standing(recipe)
    cfg = compose_run_config([f"recipes={recipe}"])
    overall, _ = ranked(cfg, found.plan.global_batch, 1, pinned=REGIME_FIELDS)
    best = max((overall[0].plan, *overall[0].alike), key=lambda plan: plan.tokens_per_s) if overall else None
    kept = " ".join(f"{k}={v}" for k, v in found.constraint.items()) or "-"
    return (f"| `{recipe}` | {cfg.engine.name} | {cfg.cluster.nodes * cfg.cluster.accelerators_per_node} | "
            f"{label(found.plan)} | {found.plan.predicted_mfu:.1%} | {found.plan.memory.total_bytes / GIB:.1f} GiB | "
            f"{best.predicted_mfu:.1%} | {kept} |" if best else "")


def standing(recipe: str) -> Standing:
    """A recipe judged against the recommender at its own global batch, under its own constraint."""
    from harness import REPO_ROOT

    constraint, reason = recipe_constraint((REPO_ROOT / "recipes" / f"{recipe}.yaml").read_text())
    cfg = compose_run_config([f"recipes={recipe}"])
    plan = judge(cfg).plan
    # Among layouts of the recipe's own regime: precision and compile change the numerics and the start-up,
    # a choice the recipe makes (a GPU recipe in FP8 or compiled says so in its name).
    top, _ = ranked(cfg, plan.global_batch, 1, constraint, pinned=REGIME_FIELDS)
    return Standing(recipe, plan, top[0] if top else None, constraint, reason)
