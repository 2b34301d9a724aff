"""Value rules of a composed RunConfig that types alone cannot say: ranges, closed integer sets, slugs, files.

Every rule here reads only the config (and the data file it names); rules between fields that need the
model or the parallel layout live in harness.plan.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from harness.config.data_file import data_file_problem
from harness.config.errors import ConfigRejected, nearest
from harness.config.schema import FSDP_VERSIONS, ZERO_STAGES, BackwardPrefetch, FsdpOptions, RunConfig

Problem = Tuple[str, object, str]

# A name that becomes a path component, a W&B group or a Slurm job name: no separator, no leading dot.
SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SLUG_RULE = "must be a name of letters, digits, '.', '_' and '-' starting with a letter or digit"
SLUG_FIELDS = ("sweep_name", "layout.name", "model.name", "cluster.name")

# Fields that count something: at least one.
AT_LEAST_ONE = (
    "layout.dp_replicate", "layout.dp_shard", "layout.tp", "layout.pp", "layout.cp", "layout.ep",
    "layout.pp_virtual_stages", "layout.micro_batch", "layout.grad_accum", "layout.seq_len",
    "cluster.nodes", "cluster.accelerators_per_node", "bench.steps", "bench.repeats",
    "launcher.array_concurrency",
    "launcher.timeout_s", "tracking.init_timeout_s",
)
# Physical quantities: finite and above zero (or None where the schema allows "take the default").
POSITIVE = ("cluster.host_memory_gib", "cluster.memory_per_accelerator_gib", "bench.lr")
NON_NEGATIVE = ("cluster.memory_allowance_fixed_gib", "cluster.intra_node_gbps", "cluster.inter_node_gbps",
                "bench.weight_decay", "bench.grad_clip", "bench.warmup_steps", "bench.repeat", "bench.seed",
                "data.seed")
# A fraction of device memory kept as head-room: below one, or nothing would be left.
FRACTIONS = ("cluster.memory_allowance_fraction",)

# Model shape fields of a transformers config that count something.
HF_COUNTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions",
             "num_local_experts", "num_experts_per_tok", "head_dim")

# sbatch options the harness writes itself, as (short form, what sets it instead): the job's files, array,
# name and environment (None: the harness alone), and its shape and placement, written from config fields
# (harness.launch.sbatch.resource_directives; slurm/templates/job.sbatch.j2). An `extra_sbatch` line after
# the harness's own would win, and the run would no longer be the layout that was planned. Short forms and
# meanings from sbatch(1), Slurm 23.11.
OwnedOption = Tuple[Optional[str], Optional[str]]
OWNED_SBATCH: Dict[str, OwnedOption] = {
    "--output": ("-o", None), "--error": ("-e", None), "--array": ("-a", None), "--job-name": ("-J", None),
    "--chdir": ("-D", None), "--export": (None, None), "--open-mode": (None, None), "--requeue": (None, None),
    "--nodes": ("-N", "cluster.nodes"),
    "--ntasks": ("-n", "cluster.nodes and cluster.accelerators_per_node (one task per node)"),
    "--ntasks-per-node": (None, "cluster.accelerators_per_node (one task per node starts its ranks)"),
    "--cpus-per-task": ("-c", "cluster.accelerators_per_node"),
    "--mincpus": (None, "cluster.accelerators_per_node"),
    "--gres": (None, "launcher.gpus_per_node_gres"),
    "--gpus": ("-G", "launcher.gpus_per_node_gres"),
    "--gpus-per-node": (None, "launcher.gpus_per_node_gres"),
    "--gpus-per-task": (None, "launcher.gpus_per_node_gres"),
    "--time": ("-t", "launcher.time_limit"),
    "--partition": ("-p", "launcher.partition"),
    "--account": ("-A", "launcher.account"),
    "--qos": ("-q", "launcher.qos"),
    "--constraint": ("-C", "launcher.constraint"),
    "--exclusive": (None, "launcher.exclusive"),
    "--nodelist": ("-w", "launcher.partition and launcher.constraint (Slurm picks the nodes)"),
}
SBATCH_LONG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(=\S*| \S+)?")
SBATCH_SHORT = re.compile(r"-([A-Za-z])(\s*\S+)?")
# NCCL_SOCKET_IFNAME / NCCL_IB_HCA: a comma-separated list of interface or adapter[:port] names, optionally
# prefixed by `^` (exclude) and `=` (exact names), as NCCL's documentation writes them; nothing a shell reads.
NCCL_NAMES = re.compile(r"\^?=?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*")
NCCL_NAME_FIELDS = ("launcher.nccl_socket_ifname", "launcher.nccl_ib_hca")
# A Hugging Face repository id: `name` or `owner/name`, letters, digits and `-_.`, at most 96 characters.
HUB_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def check_run_config(run: RunConfig) -> None:
    """Raise ConfigRejected naming every field that breaks a rule; return quietly otherwise."""
    problems = list(run_config_problems(run))
    if problems:
        raise ConfigRejected.of(problems)


def run_config_problems(run: RunConfig) -> Iterator[Problem]:
    yield from _slug_problems(run)
    yield from _number_problems(run)
    yield from _closed_int_problems(run)
    yield from _model_problems(run)
    yield from sbatch_option_problems(run.launcher.extra_sbatch)
    yield from _launcher_problems(run)
    problem = data_file_problem(run.data, run.layout, run.model.hf_config.get("vocab_size"))
    if problem:
        yield problem


def _value(run: RunConfig, dotted: str):
    node = run
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _slug_problems(run: RunConfig) -> Iterator[Problem]:
    for name in SLUG_FIELDS:
        value = _value(run, name)
        if not isinstance(value, str) or not SLUG.fullmatch(value):
            yield name, value, SLUG_RULE


def _number_problems(run: RunConfig) -> Iterator[Problem]:
    for name in AT_LEAST_ONE:
        if _value(run, name) < 1:
            yield name, _value(run, name), "must be >= 1"
    for name in POSITIVE:
        value = _value(run, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            yield name, value, "must be a finite number > 0"
    for name in NON_NEGATIVE:
        value = _value(run, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            yield name, value, "must be a finite number >= 0"
    for name in FRACTIONS:
        value = _value(run, name)
        if value is not None and not (math.isfinite(value) and 0 <= value < 1):
            yield name, value, "must be a fraction in [0, 1)"
    for index, layers in enumerate(run.layout.pp_stage_layers):  # which stages may hold none: plan/pipeline.py
        if layers < 0:
            yield f"layout.pp_stage_layers[{index}]", layers, "must be >= 0 (a count of decoder layers)"


def _closed_int_problems(run: RunConfig) -> Iterator[Problem]:
    if run.layout.zero_stage not in ZERO_STAGES:
        yield "layout.zero_stage", run.layout.zero_stage, f"must be one of {', '.join(map(str, ZERO_STAGES))}"
    if isinstance(run.engine, FsdpOptions) and run.engine.fsdp_version not in FSDP_VERSIONS:
        yield ("engine.fsdp_version", run.engine.fsdp_version,
               f"must be one of {', '.join(map(str, FSDP_VERSIONS))} (2: fully_shard, 1: FullyShardedDataParallel)")
    if (isinstance(run.engine, FsdpOptions) and run.engine.fsdp_version == 2
            and run.engine.backward_prefetch != BackwardPrefetch.BACKWARD_PRE):
        yield ("engine.backward_prefetch", run.engine.backward_prefetch.value,
               "is an FSDP1 option (engine.fsdp_version=1): FSDP2 gathers the next unit before each backward itself")


def _model_problems(run: RunConfig) -> Iterator[Problem]:
    hf = run.model.hf_config
    for key in HF_COUNTS:
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            yield f"model.hf_config.{key}", value, "must be a whole number >= 1"
    hub_id = run.model.hub_id
    if hub_id is not None and not HUB_ID.fullmatch(hub_id):
        yield ("model.hub_id", hub_id,
               "is not a Hugging Face repository id ('owner/name' of letters, digits, '-', '_', '.')")


def _launcher_problems(run: RunConfig) -> Iterator[Problem]:
    """Launcher settings that cannot work where the run would start, or that a job script could not carry."""
    if run.engine.launcher == "deepspeed" and (run.launcher.backend == "slurm" or run.cluster.nodes > 1):
        # deepspeed/launcher/runner.py (0.19) without a hostfile: raises "Num nodes is >1 but no extra nodes
        # available via hostfile", sets master_addr to 127.0.0.1 and deletes CUDA_VISIBLE_DEVICES.
        where = "launcher.backend=slurm" if run.launcher.backend == "slurm" else f"cluster.nodes={run.cluster.nodes}"
        yield ("engine.launcher", run.engine.launcher,
               f"cannot start the ranks with {where}: without a hostfile DeepSpeed's runner refuses more than one "
               "node, rewrites master_addr to 127.0.0.1 and drops CUDA_VISIBLE_DEVICES; use engine.launcher=torchrun "
               "(the DeepSpeed engine runs the same under torchrun)")
    for name in NCCL_NAME_FIELDS:
        value = _value(run, name)
        if value is not None and not (isinstance(value, str) and NCCL_NAMES.fullmatch(value)):
            yield (name, value, "must be a comma-separated list of interface or adapter names (letters, digits, "
                   "'_.:-'), optionally starting with '^' (exclude) and '=' (exact match)")


def sbatch_option_problems(lines: Sequence[str], owned: Optional[Dict[str, OwnedOption]] = None,
                           field: str = "launcher.extra_sbatch") -> Iterator[Problem]:
    """Each `launcher.extra_sbatch` entry is one sbatch option and sets none the harness owns (`owned`:
    OWNED_SBATCH, or a command's own table).

    sbatch accepts any unique prefix of a long option (`--out=` is `--output`), a long option's value after
    `=` or a space, and a short option with its value attached or apart (`-N8`, `-N 8`), so every spelling is
    matched; `%` patterns are expanded by sbatch in file names, and a second space would let one entry carry
    a second option.
    """
    owned = OWNED_SBATCH if owned is None else owned
    for index, line in enumerate(lines):
        where = f"{field}[{index}]"
        option = _sbatch_option(line, owned)
        if option is None:
            yield where, line, "must be one sbatch option such as '--mem=0' or '--mail-type=END' (one option)"
        elif option in owned:
            instead = owned[option][1]
            yield where, line, (f"sets {option}, which the harness writes from {instead}: set that instead"
                                if instead else f"sets {option}, which the harness writes itself")
        elif "%" in line:
            yield where, line, "may not hold a '%' pattern (sbatch expands it)"


def _sbatch_option(line: str, owned: Dict[str, OwnedOption]) -> Optional[str]:
    """The owned option a line sets (exact name first, then as a unique prefix), the line's own option
    name, or None when malformed."""
    if not isinstance(line, str):
        return None
    long_form = SBATCH_LONG.fullmatch(line)
    if long_form:
        name = "--" + long_form.group(1)
        if name in owned:
            return name
        prefixed = [option for option in owned if option.startswith(name)]
        return prefixed[0] if prefixed else name
    short_form = SBATCH_SHORT.fullmatch(line)
    if short_form and " " not in line.strip()[2:].strip():
        flag = "-" + short_form.group(1)
        matches = [option for option, (short, _) in owned.items() if short == flag]
        return matches[0] if matches else flag
    return None
def unknown_choice(field: str, value: str, choices: Sequence[str], what: str) -> List[Problem]:
    """A value missing from a table, with the nearest entry suggested."""
    if value in choices:
        return []
    return [(field, value, f"is not {what}{nearest(value, choices)}: one of {', '.join(sorted(choices))}")]

