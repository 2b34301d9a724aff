"""`harness doctor`: one screen of environment facts, each line PASS or WARN, never a traceback."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness import REPO_ROOT

PASS, WARN = "PASS", "WARN"
# Narrowest the wrapped detail of a fact gets, however narrow the terminal.
MIN_DETAIL_WIDTH = 20
LIBRARIES = ("torch", "torchao", "deepspeed", "accelerate", "transformers", "hydra-core", "wandb", "wandb-workspaces",
             "pandas", "rich", "plotly")
# torch.cuda.get_device_name() strings (as nvidia-smi / rocm-smi print them) -> keys of harness/plan/peak.py.
# Order matters: the more specific pattern first (H100 NVL before H100, A100 40GB before A100 SXM).
GPU_NAME_RULES: Sequence[Tuple[str, str]] = (
    (r"A100.*(SXM|HGX).*40\s?GB|A100-SXM4-40GB", "a100_sxm_40gb"),
    (r"A100.*PCIe", "a100_pcie"),
    (r"A100", "a100_sxm"),
    (r"H100.*NVL", "h100_nvl"),
    (r"H100.*PCIe", "h100_pcie"),
    (r"H100", "h100_sxm"),
    (r"H200.*NVL", "h200_nvl"),
    (r"H200", "h200"),
    (r"GB200", "gb200"),
    (r"B200", "b200"),
    (r"L40S", "l40s"),
    (r"MI300X", "mi300x"),
    (r"MI325X", "mi325x"),
    (r"MI355X", "mi355x"),
)


@dataclass(frozen=True)
class Fact:
    status: str
    name: str
    detail: str


def accelerator_key(device_name: str) -> Optional[str]:
    """The peak table's key for a GPU's reported name, or None when the table has no row for it."""
    for pattern, key in GPU_NAME_RULES:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return key
    return None


def pinned_versions(constraints: Path = REPO_ROOT / "constraints.txt") -> Dict[str, str]:
    """`name==version` lines of constraints.txt (the versions the harness is tested with)."""
    pins = {}
    if constraints.exists():
        for line in constraints.read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line.strip())
            if match:
                pins[match.group(1).lower()] = match.group(2)
    return pins


def python_fact() -> List[Fact]:
    version = platform.python_version()
    ok = sys.version_info >= (3, 10)
    return [Fact(PASS if ok else WARN, "python", f"{version} ({sys.executable})" + ("" if ok else ": needs >= 3.10"))]


def library_facts() -> List[Fact]:
    pins, facts = pinned_versions(), []
    for name in LIBRARIES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            facts.append(Fact(WARN, name, "not installed (make setup)"))
            continue
        pin = pins.get(name.lower())
        if pin and pin != version:
            facts.append(Fact(WARN, name, f"{version}, tested with {pin} (constraints.txt)"))
        else:
            facts.append(Fact(PASS, name, version))
    return facts


def torch_facts() -> List[Fact]:
    import torch
    import torch.distributed as dist

    facts = [Fact(PASS if dist.is_gloo_available() else WARN, "gloo",
                  "available (CPU runs)" if dist.is_gloo_available() else "missing: CPU runs cannot start")]
    if not torch.cuda.is_available():
        facts.append(Fact(WARN, "cuda", f"not available (torch {torch.__version__}): CPU runs only, cluster=cpu"))
        return facts
    facts.append(Fact(PASS, "cuda", f"{torch.version.cuda or torch.version.hip}, {torch.cuda.device_count()} device(s)"))
    nccl = dist.is_nccl_available()
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl else ""
    facts.append(Fact(PASS if nccl else WARN, "nccl", version if nccl else "not available: GPU runs need NCCL"))
    names = sorted({torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())})
    for name in names:
        key = accelerator_key(name)
        facts.append(Fact(PASS, "gpu", f"{name} -> cluster.accelerator={key} (harness/plan/peak.py)") if key
                     else Fact(WARN, "gpu", f"{name}: no row in harness/plan/peak.py, MFU unknown"))
    return facts


def deepspeed_facts() -> List[Fact]:
    """Whether each JIT op could build here (DeepSpeed's own is_compatible, its chatter silenced)."""
    from harness.engines.deepspeed_ops import DEEPSPEED_OPS, op_compatible

    facts = []
    for builder in DEEPSPEED_OPS:
        name, ok = op_compatible(builder)
        facts.append(Fact(PASS if ok else WARN, f"deepspeed op {name}",
                          "compatible (JIT-built on first use)" if ok else "not compatible on this machine"
                          + (" (NVMe offload; needs Debian's libaio-dev)" if name == "async_io" else "")))
    return facts


def slurm_facts(timeout_s: float = 5.0) -> List[Fact]:
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return [Fact(WARN, "slurm", "sinfo not found: launcher=slurm_* unavailable (make slurm-up for a local one)")]
    try:
        out = subprocess.run([sinfo, "-h", "-o", "%P %D %t"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Fact(WARN, "slurm", f"sinfo did not answer in {timeout_s:.0f} s")]
    if out.returncode != 0:
        from harness.launch.slurm_commands import unreachable_line

        first = ((out.stderr or out.stdout).strip().splitlines() or [""])[0]
        return [Fact(WARN, "slurm", unreachable_line(out.stderr or "") or f"sinfo failed: {first}")]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    summary = ", ".join(f"{p} ({n} node(s) {s})" for p, n, s in rows) or "no partitions"
    return [Fact(PASS if rows else WARN, "slurm", f"reachable: {summary}")]


# The values wandb's Settings.mode accepts (wandb/sdk/wandb_settings.py, wandb 0.2x: a Literal); wandb.init
# fails on any other WANDB_MODE.
WANDB_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")


def wandb_facts(environ: Optional[Dict[str, str]] = None) -> List[Fact]:
    """Mode and whether an online run could log in; the key is only ever read from the environment."""
    environ = dict(os.environ if environ is None else environ)
    mode = environ.get("WANDB_MODE")
    if mode and mode not in WANDB_MODES:
        facts = [Fact(WARN, "wandb mode", f"WANDB_MODE={mode!r} is not one of {', '.join(WANDB_MODES)}: "
                                          "wandb.init will fail; unset it or pick one")]
    else:
        facts = [Fact(PASS, "wandb mode", mode or "offline (tracking=wandb_offline, the default)")]
    if environ.get("WANDB_API_KEY"):
        facts.append(Fact(PASS, "wandb login", "WANDB_API_KEY is set: tracking=wandb_online can log"))
    else:
        facts.append(Fact(WARN, "wandb login", "WANDB_API_KEY not set: offline runs only; upload later with "
                                               "`harness sync DIR`"))
    return facts


CHECKS: Sequence[Tuple[str, Callable[[], List[Fact]]]] = (
    ("python", python_fact), ("libraries", library_facts), ("torch", torch_facts),
    ("deepspeed", deepspeed_facts), ("slurm", slurm_facts), ("wandb", wandb_facts),
)


def gather(checks: Sequence[Tuple[str, Callable[[], List[Fact]]]] = CHECKS) -> List[Fact]:
    """Every check's facts; a check that raises becomes one WARN line naming the error."""
    facts = []
    for name, check in checks:
        try:
            facts.extend(check())
        except Exception as error:  # a broken install is a fact to report, not a crash
            first = str(error).splitlines()[0] if str(error) else ""
            facts.append(Fact(WARN, name, f"check failed: {type(error).__name__}: {first}"))
    return facts


def fact_lines(facts: Sequence[Fact], width: Optional[int]) -> List[List[str]]:
    """Per fact, `STATUS  name  detail`, the detail wrapped under itself to `width` (None: one line each);
    a word longer than the room left is split across lines, never cut."""
    name_width = max((len(fact.name) for fact in facts), default=0)
    indent = len(PASS) + 2 + name_width + 2
    room = max(width - indent, MIN_DETAIL_WIDTH) if width else None
    out = []
    for fact in facts:
        detail = textwrap.wrap(fact.detail, room) if room and len(fact.detail) > room else [fact.detail]
        out.append([f"{fact.status}  {fact.name:<{name_width}}  {detail[0]}".rstrip(),
                    *(" " * indent + part for part in detail[1:])])
    return out


def doctor_main(args: List[str]) -> int:
    """Print the facts; exit 0 (every line PASS or WARN: the doctor informs, it never blocks)."""
    from rich.console import Console
    from rich.text import Text

    from harness.config.arguments import OneLineParser
    from harness.terminal import terminal_width

    parser = OneLineParser(prog="harness doctor", description="Environment facts, one line each, PASS or WARN: "
                           "versions, CUDA / NCCL, GPUs, DeepSpeed ops, Slurm, W&B. Exit 0: the doctor informs, "
                           "it never blocks.")
    parser.add_argument("--wide", action="store_true", help="each fact on one line, however long")
    options = parser.parse_args(list(args))
    facts = gather()
    width = None if options.wide else terminal_width()
    console = Console(width=100_000, highlight=False)  # lines are already wrapped to the terminal
    for fact, lines in zip(facts, fact_lines(facts, width)):
        for number, line in enumerate(lines):
            text = Text(line)
            if number == 0:
                text.stylize("green" if fact.status == PASS else "yellow", 0, len(fact.status))
            console.print(text, no_wrap=True, overflow="ignore")
    warnings = sum(fact.status == WARN for fact in facts)
    console.print(f"{len(facts) - warnings} pass, {warnings} warn", highlight=False)
    return 0
