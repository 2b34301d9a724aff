"""Each Megatron-LM export recipe (and its CPU stand-in) runs its generated megatron_args.sh as far as Megatron's
own argument and config validation goes without CUDA: the script runs for real up to its launcher (a
recording `torchrun` on PATH), and the command line and environment it hands to pretrain_gpt.py are then
validated as Megatron-LM would: megatron.core's TransformerConfig / ModelParallelConfig built from that
command line (their __post_init__ checks), and validate_args's world, batch and device-connection rules
(megatron/training is not in the pip package) over the launcher's world and the script's environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.engines import megatron_lm
from tests.unit.engines.megatron_core_config import transformer_config

RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*megatron*.yaml"))
# A launcher that records what the script hands it: the environment variable validate_args reads, then argv.
RECORDING_TORCHRUN = ('#!/bin/sh\nprintf "CUDA_DEVICE_MAX_CONNECTIONS=%s\\n" "${CUDA_DEVICE_MAX_CONNECTIONS:-}"\n'
                      'for a in "$@"; do printf "%s\\n" "$a"; done\n')


def run_script(run_dir: Path) -> Tuple[Dict[str, str], List[str]]:
    """(the script's environment for Megatron, the launcher's argv), from running megatron_args.sh."""
    bin_dir = run_dir / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(RECORDING_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/megatron", "NODE_RANK": "0", "MASTER_ADDR": "h",
           "MASTER_PORT": "1"}  # fmt: skip
    proc = subprocess.run(["bash", str(run_dir / megatron_lm.SCRIPT_FILE)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").split("\n")
    return dict([lines[0].split("=", 1)]), lines[1:]


def typed_flags(argv: List[str], rendered: Dict[str, Any]) -> Dict[str, Any]:
    """pretrain_gpt.py's flags read back from its argv, each typed as megatron_args.json types it."""
    flags: Dict[str, Any] = {}
    for index, token in enumerate(argv):
        if token.startswith("--"):
            has_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
            flags[token] = argv[index + 1] if has_value else True
    for flag, value in rendered.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and flag in flags:
            flags[flag] = type(value)(flags[flag])
    return flags


def validate_args(flags: Dict[str, Any], world: int, env: Dict[str, str]) -> None:
    """megatron/training/arguments.py::validate_args (core_r0.16), the rules that need no CUDA."""
    tp, pp = flags["--tensor-model-parallel-size"], flags["--pipeline-model-parallel-size"]
    cp, ep = flags["--context-parallel-size"], flags["--expert-model-parallel-size"]
    assert world % (tp * pp * cp) == 0, "world size is not divisible by tp * pp * cp"
    dp = world // (tp * pp * cp)
    assert (dp * cp) % ep == 0, "expert parallel size must divide dp * cp"
    assert flags["--global-batch-size"] % (flags["--micro-batch-size"] * dp) == 0, "global batch vs micro x dp"
    if "--num-layers-per-virtual-pipeline-stage" in flags:  # interleaving: whole rounds of micro-batches
        assert flags["--global-batch-size"] // flags["--micro-batch-size"] // dp % pp == 0
        assert flags["--num-layers"] % (pp * flags["--num-layers-per-virtual-pipeline-stage"]) == 0
    if ep > 1 and tp > 1:
        assert flags.get("--sequence-parallel"), "expert parallelism with tensor parallelism needs sequence parallel"
    if tp > 1 or cp > 1:  # before Blackwell; the export sets it whatever the GPU
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1", "CUDA_DEVICE_MAX_CONNECTIONS must be 1"


@pytest.mark.parametrize("standin", [False, True], ids=["recipe", "standin"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_generated_script_passes_megatrons_validation(recipe, standin, tmp_path):
    cfg = compose_run_config([f"recipes={recipe}", *(["standin=cpu"] if standin else [])])
    megatron_lm.render(cfg, tmp_path)
    rendered = json.loads((tmp_path / megatron_lm.ARGS_FILE).read_text())["flags"]
    env, argv = run_script(tmp_path)
    script_at = argv.index("/megatron/pretrain_gpt.py")
    launcher = dict(zip(argv[:script_at:2], argv[1:script_at:2]))
    world = int(launcher["--nnodes"]) * int(launcher["--nproc_per_node"])
    flags = typed_flags(argv[script_at + 1:], rendered)
    assert {flag: flags.get(flag, False) for flag in rendered} == rendered  # every flag arrives, typed as written
    validate_args(flags, world, env)
    config = transformer_config(flags)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (cfg.layout.tp, cfg.layout.pp, cfg.layout.cp, cfg.layout.ep)
    assert config.num_layers == cfg.model.hf_config["num_hidden_layers"]
    if cfg.layout.pp_virtual_stages > 1:
        assert config.virtual_pipeline_model_parallel_size == cfg.layout.pp_virtual_stages


def test_megatrons_own_checks_refuse_what_the_script_must_not_pass(tmp_path):
    """The validation above is not vacuous: a device-connection count and a head split Megatron refuses."""
    cfg = compose_run_config([f"recipes={RECIPES[0]}"])
    flags = megatron_lm.megatron_flags(cfg)
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        validate_args(flags, cfg.cluster.nodes * cfg.cluster.accelerators_per_node, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    with pytest.raises((AssertionError, ValueError)):
        transformer_config({**flags, "--num-query-groups": 3})
