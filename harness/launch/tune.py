"""`harness tune`: the closed loop. Recommend the top K layouts, run them (as `harness sweep` runs a recommended preset:
locally, or as a Slurm job per point), refit the cluster profile's per-engine efficiency factors from the measured
step times (harness.plan.engine_factors: a pair of factors per engine, never one per layout), write the refitted
profile under a new name, re-rank under it, run the new top when it was not measured yet, and report what was
recommended, what measured best, and the factors with their error before and after. This is the only place where
measurements flow back into a profile."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from harness.config.arguments import OneLineParser, refuse_unknown, slug, whole_number
from harness.config.compose import compose_run_config, user_config_dir
from harness.config.errors import explain as explain_error
from harness.launch.recommend import (label, no_layout_message, preset_files, ranked, recommend_overrides,
                                      write_preset)
from harness.launch.refusals import Refusals
from harness.plan.engine_factors import UNIT, Sample, median_error, parts, refit, relative, scaled
from harness.plan.hardware import PROFILE_VERSION, hardware_profile, profile_path, save_profile
from harness.plan.planner import Plan
from harness.plan.recommend import Choice


@dataclass(frozen=True)
class Space:
    """One engine's search: the overrides that compose it and the composed config."""

    overrides: Tuple[str, ...]
    cfg: Any


@dataclass(frozen=True)
class Measurement:
    step_time_s: float
    tokens_per_s: float


Key = Tuple[str, str]  # (engine, layout label)
# Runs a round of layouts (each with the Space it was ranked in) under a name; returns what each measured (failed
# runs are missing).
Measure = Callable[[Sequence[Tuple[Space, Plan]], str], Dict[Key, Measurement]]


def key(plan: Plan) -> Key:
    return plan.engine.name, label(plan)


def top_k(spaces: Sequence[Space], global_batch: int, k: int,
          refusals: Optional[Refusals] = None) -> List[Tuple[Space, Plan]]:
    """K layouts by predicted tokens/s: each engine's best K // engines (at least one) first, so that every engine
    is measured and gets its own factors, then the rest by predicted tokens/s over all engines (`refusals`, when
    given, collects why the others were refused)."""
    tokens = lambda item: -(item[1].tokens_per_s or 0.0)  # noqa: E731
    per_space = [[(space, choice.plan) for choice in ranked(space.cfg, global_batch, k, refusals=refusals)[0]]
                 for space in spaces]
    quota = max(1, k // max(1, len(spaces)))
    chosen = [item for pool in per_space for item in pool[:quota]]
    rest = sorted((item for pool in per_space for item in pool[quota:]), key=tokens)
    return sorted(chosen + rest[:max(0, k - len(chosen))], key=tokens)


def sweep_measure(results_dir: Path) -> Measure:
    """Run a round as `harness recommend`'s printed command does: recipes and a sweep preset in the user config
    directory, then `harness sweep sweep=NAME`; read each point's metrics.json."""

    def measure(round_: Sequence[Tuple[Space, Plan]], name: str) -> Dict[Key, Measurement]:
        names = {}
        for i, (space, plan) in enumerate(round_, 1):  # one recipe per layout, each in its own engine's space
            files = preset_files([Choice(plan, ())], name, list(space.overrides), space.cfg, "harness tune")
            header, body = files[f"recipes/{name}_1.yaml"]
            body["layout"]["name"] = f"{name}_{i}"
            write_preset({f"recipes/{name}_{i}.yaml": (header, body)}, user_config_dir())
            names[f"{name}_{i}"] = key(plan)
        sweep = {"sweep_name": name, "results_dir": str(results_dir),
                 "hydra": {"sweeper": {"params": {"recipes": ",".join(names)}}}}
        write_preset({f"sweep/{name}.yaml": ("# @package _global_\n# Written by `harness tune`.\n", sweep)},
                     user_config_dir())
        print(f"running {len(names)} layout(s): harness sweep sweep={name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "sweep", f"sweep={name}"],
                              capture_output=True, text=True)
        if proc.returncode:
            tail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            print(f"   the sweep exited {proc.returncode}: {tail}", flush=True)
        found: Dict[Key, Measurement] = {}
        for path in sorted((results_dir / name).glob("**/metrics.json"), key=lambda p: p.stat().st_mtime):
            record = json.loads(path.read_text())
            layout = record.get("layout", {}).get("name")
            measured = record.get("measured") or {}
            if layout in names and measured.get("step_time_s"):
                found[names[layout]] = Measurement(measured["step_time_s"], measured["tokens_per_s"])
        if len(found) < len(names):  # say why: the sweep's lines of its pruned and failed points
            said = [line for line in (proc.stdout + proc.stderr).splitlines() if "PRUNED" in line or "FAILED" in line]
            print("\n".join(f"   {line.strip()}" for line in said[:10]) or "   some layouts measured nothing",
                  flush=True)
        return found

    return measure


@dataclass
class Tuned:
    """What one loop found: the untuned ranking, every measured layout with its prediction, the factors before
    and after, the re-ranked top and the written profile."""

    recommended: List[Plan]
    measured: Dict[Key, Measurement]
    predicted: Dict[Key, Plan]  # under the profile the loop started from
    before: Dict[str, Dict[str, float]]
    after: Dict[str, Dict[str, float]]
    reranked: List[Plan]
    profile: Optional[Path]

    def best(self) -> Optional[Key]:
        """The measured layout of highest measured tokens/s: the loop's pick."""
        return max(self.measured, key=lambda k: self.measured[k].tokens_per_s) if self.measured else None

    def samples(self) -> List[Sample]:
        return [Sample(k[0], *parts(self.predicted[k].time), m.step_time_s) for k, m in self.measured.items()
                if self.predicted[k].time is not None]


def engine_spaces(overrides: Sequence[str]) -> List[List[str]]:
    """The overrides of each engine's search. `engine=deepspeed,fsdp,nd` is Hydra's sweep syntax (as `harness
    sweep` reads it): one override list per engine, in the order given, each with `engine=` naming one engine; any
    other command line is one search as it is. An empty or repeated engine name is refused in one line."""
    at = [i for i, item in enumerate(overrides) if item.startswith("engine=")]
    if not at or "," not in overrides[at[-1]]:
        return [list(overrides)]
    value = overrides[at[-1]].partition("=")[2]
    names = [name.strip() for name in value.split(",")]
    if "" in names:
        raise ValueError(f"engine={value} has an empty engine name (expected e.g. engine=deepspeed,fsdp,nd)")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"engine={value} names {', '.join(twice)} more than once")
    rest = [item for i, item in enumerate(overrides) if i not in at]
    return [[*rest, f"engine={name}"] for name in names]


def new_profile_path(base_name: str, name: str) -> Path:
    """A profile name not taken yet: BASE-NAME, else BASE-NAME-2, -3, ... (a profile is never overwritten)."""
    stem = f"{base_name}-{name}"
    path, n = profile_path(stem), 2
    while path.exists():
        path, n = profile_path(f"{stem}-{n}"), n + 1
    return path


def tune(spaces: Sequence[Space], global_batch: int, k: int, name: str, measure: Measure,
         profile_name: Optional[str] = None, refusals: Optional[Refusals] = None) -> Tuned:
    """The loop (see the module docstring). `spaces` share one cluster and profile; `name` prefixes the rounds'
    presets, `profile_name` (default `name`) suffixes the refitted profile's; with no layout admitted nothing
    runs (`refusals` says why)."""
    recommended = top_k(spaces, global_batch, k, refusals)
    if not recommended:
        return Tuned([], {}, {}, {}, {}, [], None)
    measured = dict(measure(recommended, f"{name}_r1"))
    predicted = {key(plan): plan for _, plan in recommended}
    hw = hardware_profile(spaces[0].cfg.cluster)
    before = {e: dict(f) for e, f in (hw.engine_factors if hw else {}).items()}
    tuned = Tuned([p for _, p in recommended], measured, predicted, before, before, [], None)
    if hw is None or not tuned.samples():
        return tuned
    tuned.after = refit(tuned.samples(), before)
    path = new_profile_path(hw.name, profile_name or name)
    note = f"engine factors fitted by harness tune from {len(tuned.samples())} measured runs"
    save_profile(replace(hw, name=path.stem, engine_factors=tuned.after, version=max(hw.version, PROFILE_VERSION),
                         source=f"{hw.source}; {note}"), path)
    tuned.profile = path
    retuned = [Space((*s.overrides, f"cluster.profile={path}"),
                     compose_run_config([*s.overrides, f"cluster.profile={path}"])) for s in spaces]
    again = top_k(retuned, global_batch, k)
    tuned.reranked = [plan for _, plan in again]
    fresh = [(s, p) for s, p in again[:1] if key(p) not in measured]
    if fresh:
        measured.update(measure(fresh, f"{name}_r2"))
        for _, plan in fresh:  # its prediction under the starting factors, for the error table
            e = plan.engine.name
            predicted[key(plan)] = replace(plan, time=scaled(plan.time, relative(before.get(e, {}),
                                                                                 tuned.after.get(e, {}))))
        tuned.measured = {k: m for k, m in measured.items() if k in predicted}
    return tuned


def report(tuned: Tuned) -> List[str]:
    """The transcript's summary: recommended, measured, factors with their error before and after, the pick."""
    lines = ["untuned ranking:"]
    for i, plan in enumerate(tuned.recommended, 1):
        m = tuned.measured.get(key(plan))
        shown = f"measured {m.tokens_per_s:,.0f} tokens/s ({m.step_time_s:.3f} s/step)" if m else "no measurement"
        lines.append(f"  #{i} {plan.engine.name} {label(plan)}: predicted {plan.tokens_per_s:,.0f} tokens/s "
                     f"({plan.time.step_time_s:.3f} s/step), {shown}")
    samples = tuned.samples()
    for engine in sorted({s.engine for s in samples}):
        mine = [s for s in samples if s.engine == engine]
        old = {**UNIT, **tuned.before.get(engine, {})}
        new = {**old, **tuned.after.get(engine, {})}  # an engine measured only after the refit keeps its factors
        rel = relative(new, old)
        lines.append(f"engine factors {engine}: compute {old['compute']:.3f} -> {new['compute']:.3f}, "
                     f"comm {old['comm']:.3f} -> {new['comm']:.3f}; median |predicted - measured| / "
                     f"measured step time over {len(mine)} run(s): {median_error(mine):.1%} before, "
                     f"{median_error(mine, rel):.1%} after")
    if tuned.profile:
        lines.append(f"wrote profile {tuned.profile} (use it: cluster.profile={tuned.profile})")
    if tuned.reranked:
        top = tuned.reranked[0]
        same = key(top) == key(tuned.recommended[0])
        lines.append(f"re-ranked top: {top.engine.name} {label(top)}, predicted {top.tokens_per_s:,.0f} tokens/s"
                     f" ({'unchanged' if same else 'changed'})")
    best = tuned.best()
    if best is None:
        lines.append("nothing measured: no refit")
    else:
        m = tuned.measured[best]
        lines.append(f"measured best (the pick): {best[0]} {best[1]}: {m.tokens_per_s:,.0f} tokens/s "
                     f"({m.step_time_s:.3f} s/step)")
    return lines


def parse_args(argv: Sequence[str]):
    parser = OneLineParser(
        prog="harness tune", epilog="Other arguments are Hydra overrides, e.g. model=tiny_llama engine=deepspeed "
        "cluster=local_slurm cluster.nodes=2; engine=deepspeed,fsdp,nd searches several engines at once.",
        description="Recommend the top K layouts, run them, refit the cluster profile's per-engine efficiency "
                    "factors from the measured step times, write the refitted profile under a new name, re-rank "
                    "under it, run its new top, and report the recommended and the measured best.")
    parser.add_argument("--top", type=whole_number, default=3, metavar="K",
                        help="how many layouts to run (default 3); over several engines (engine=deepspeed,fsdp,nd) "
                             "each engine's best K // engines come first, at least one each")
    parser.add_argument("--global-batch", type=whole_number, required=True, metavar="SEQS",
                        help="sequences per optimizer step, the same for every layout")
    parser.add_argument("--name", type=slug, default="tuned", metavar="NAME",
                        help="names the presets (tune_NAME_r1, _r2) and the profile (<profile>-NAME; -2, -3, ... "
                             "when taken; default tuned)")
    args, extra = parser.parse_known_args(list(argv))
    return args, refuse_unknown(parser.prog, extra)


def tune_main(argv: Sequence[str]) -> int:
    """`harness tune --global-batch SEQS [--top K] [--name NAME] overrides` (engine=A,B,... for several engines)."""
    args, overrides = parse_args(argv)
    try:
        spaces, launcher = [], None
        for one in engine_spaces(overrides):
            one, launcher = recommend_overrides(one)
            spaces.append(Space(tuple(one), compose_run_config(one)))
    except Exception as error:  # every composition and value error becomes one line
        print(f"harness tune: {explain_error(error)}", file=sys.stderr)
        return 2
    cfg = spaces[0].cfg
    if hardware_profile(cfg.cluster) is None:
        print(f"harness tune: cluster.accelerator={cfg.cluster.accelerator} has no hardware profile to refit "
              "(name one with cluster.profile)", file=sys.stderr)
        return 2
    if launcher:
        print(f"cluster.nodes={cfg.cluster.nodes}: running with launcher={launcher}")
    start = time.monotonic()
    name = f"tune_{args.name}_{time.strftime('%Y%m%d_%H%M%S')}"
    refusals = Refusals()
    tuned = tune(spaces, args.global_batch, args.top, name, sweep_measure(Path(cfg.results_dir)), args.name, refusals)
    if not tuned.recommended:
        print(no_layout_message("harness tune", refusals, args.global_batch), file=sys.stderr)
        return 1
    print("\n".join(report(tuned)))
    print(f"tune took {time.monotonic() - start:.0f} s")
    return 0 if tuned.measured else 1
