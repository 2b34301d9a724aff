"""Value rules of a composed RunConfig that types alone cannot say: ranges, closed integer sets, slugs, files.

Every rule here reads only the config (and the data file it names); rules between fields that need the
model or the parallel layout live in harness.plan.
"""

from __future__ import annotations

import math
import re
from typing import Iterator, List, Optional, Sequence, Tuple

from harness.config.data_file import data_file_problem
from harness.config.errors import ConfigRejected, nearest
from harness.config.schema import FSDP_VERSIONS, ZERO_STAGES, FsdpOptions, RunConfig

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

# sbatch options the harness writes itself (logs, array, job name, working directory, environment).
OWNED_SBATCH = {"--output": "-o", "--error": "-e", "--array": "-a", "--job-name": "-J", "--chdir": "-D",
                "--export": None, "--open-mode": None}
SBATCH_LONG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(=\S*)?")
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
    for index, layers in enumerate(run.layout.pp_stage_layers):
        if layers < 1:
            yield f"layout.pp_stage_layers[{index}]", layers, "must be >= 1 (every stage holds a layer)"


def _closed_int_problems(run: RunConfig) -> Iterator[Problem]:
    if run.layout.zero_stage not in ZERO_STAGES:
        yield "layout.zero_stage", run.layout.zero_stage, f"must be one of {', '.join(map(str, ZERO_STAGES))}"
    if isinstance(run.engine, FsdpOptions) and run.engine.fsdp_version not in FSDP_VERSIONS:
        yield ("engine.fsdp_version", run.engine.fsdp_version,
               f"must be one of {', '.join(map(str, FSDP_VERSIONS))} (2: fully_shard, 1: FullyShardedDataParallel)")


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


def sbatch_option_problems(lines: Sequence[str]) -> Iterator[Problem]:
    """Each `launcher.extra_sbatch` entry is one sbatch option and sets none the harness owns.

    sbatch accepts any unique prefix of a long option (`--out=` is `--output`) and a short option with
    its value attached (`-ofile`), so both spellings are matched; `%` patterns are expanded by sbatch in
    file names, and a space would let one entry carry a second option.
    """
    for index, line in enumerate(lines):
        field = f"launcher.extra_sbatch[{index}]"
        option = _sbatch_option(line)
        if option is None:
            yield field, line, "must be one sbatch option such as '--mem=0' or '-c 4' (one option, no spaces)"
        elif option in OWNED_SBATCH:
            yield field, line, f"sets {option}, which the harness writes itself"
        elif "%" in line:
            yield field, line, "may not hold a '%' pattern (sbatch expands it)"


def _sbatch_option(line: str) -> Optional[str]:
    """The canonical owned option a line sets, the line's own option name, or None when malformed."""
    if not isinstance(line, str):
        return None
    long_form = SBATCH_LONG.fullmatch(line)
    if long_form:
        name = "--" + long_form.group(1)
        owned = [option for option in OWNED_SBATCH if option.startswith(name)]
        return owned[0] if owned else name
    short_form = SBATCH_SHORT.fullmatch(line)
    if short_form and " " not in line.strip()[2:].strip():
        flag = "-" + short_form.group(1)
        owned = [option for option, short in OWNED_SBATCH.items() if short == flag]
        return owned[0] if owned else flag
    return None


def unknown_choice(field: str, value: str, choices: Sequence[str], what: str) -> List[Problem]:
    """A value missing from a table, with the nearest entry suggested."""
    if value in choices:
        return []
    return [(field, value, f"is not {what}{nearest(value, choices)}: one of {', '.join(sorted(choices))}")]

