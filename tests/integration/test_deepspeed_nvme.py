"""DeepSpeed ZeRO-3 offloading to NVMe (a local folder) on 2 CPU processes: the single-process fp32 losses, the
device bytes the planner predicts, and the bytes really written to the swap folder.

DeepSpeed swaps through its async_io op (JIT-built against libaio, Debian `libaio-dev`) and swaps a tensor only
when it holds at least max(1 MiB, aio block_size) bytes; smaller ones stay in host memory. tiny_llama's tensors
are all smaller, so the vocabulary is raised to 16384: the embedding and the LM head become 16384 x 64 fp32
tensors, a 2 MiB partition on each rank, and they are what goes to NVMe.
"""

import json
import subprocess
import time

import pytest

from harness import REPO_ROOT

from tests.integration.test_deepspeed import FP32_RTOL, REFERENCE, _grid

pytestmark = [
    pytest.mark.integration,
    pytest.mark.jit_ops,
]

VOCAB, HIDDEN, DP = 16384, 64, 2  # hidden: tiny_llama's
MODEL = [f"model.hf_config.vocab_size={VOCAB}", "layout.precision=fp32"]
BIG_PARTITION_BYTES = VOCAB * HIDDEN * 4 // DP  # embedding or LM head, fp32, one rank's partition (2 MiB)
VARIANTS = {
    "params_and_optimizer": ["layout.offload_params=nvme", "layout.offload_optimizer=nvme"],
    # model.init=auto builds inside zero.Init once parameters go to NVMe (the other two variants rely on it);
    # with only the optimizer there, it is asked for so that all three start from the reference's weights.
    "optimizer_only": ["layout.offload_optimizer=nvme", "model.init=meta"],
    "params_only": ["layout.offload_params=nvme"],
}
# Swap files per big tensor: with the optimizer offloaded its fp32 master partition, both Adam moments and its
# fp32 gradient; with the parameters offloaded the parameter partition.
SWAPPED_STATES = {"params_and_optimizer": 5, "optimizer_only": 4, "params_only": 1}


@pytest.fixture(scope="module")
def async_io_op():
    """DeepSpeed's async_io op, built (or loaded from TORCH_EXTENSIONS_DIR) once, before any run: a first build
    takes minutes on a 2-core machine and is reported here rather than spent inside a run's timeout."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    builder = AsyncIOBuilder()
    if not builder.is_compatible(verbose=False):
        # Installed the way the Slurm tests install Slurm (apt-get); a machine that cannot is a failure, not a skip.
        install = subprocess.run([str(REPO_ROOT / "tools" / "install_libaio.sh")], capture_output=True, text=True)
        if install.returncode != 0 or not AsyncIOBuilder().is_compatible(verbose=False):
            pytest.fail(f"libaio-dev is missing and tools/install_libaio.sh could not install it "
                        f"(exit {install.returncode}): {install.stderr.strip()[-500:]}")
        builder = AsyncIOBuilder()
    start = time.monotonic()
    builder.load(verbose=False)  # builds / loads the pin_memory op first
    print(f"async_io op ready in {time.monotonic() - start:.1f} s")


@pytest.fixture(scope="module")
def fp32_reference_large_vocab(results_root, async_io_op):
    # NVMe parameter offload builds inside zero.Init (model.init=auto, harness.plan.construction), whose
    # weights differ from a whole build's: the reference is one process building the same way.
    (result,) = _grid(results_root, "ds_nvme_ref_fp32",
                      [*REFERENCE, "layout.zero_stage=3", "model.init=meta", *MODEL]).values()
    return result["measured"]["losses"]


@pytest.fixture(scope="module")
def nvme_runs(results_root, async_io_op):
    runs = {}
    for variant, offload in VARIANTS.items():
        swap = results_root / f"nvme_swap_{variant}"
        args = ["layout.zero_stage=3", *offload, f"layout.nvme_path={swap}", *MODEL]
        (result,) = _grid(results_root, f"ds_nvme_{variant}", args).values()
        (plan_file,) = (results_root / f"ds_nvme_{variant}").rglob("plan.json")
        runs[variant] = (result, json.loads(plan_file.read_text()), swap)
    return runs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_nvme_offload_matches_single_process_fp32(nvme_runs, fp32_reference_large_vocab, variant):
    result, _, _ = nvme_runs[variant]
    assert result["measured"]["losses"] == pytest.approx(fp32_reference_large_vocab, rel=FP32_RTOL)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_bytes_are_predicted(nvme_runs, variant):
    result, _, _ = nvme_runs[variant]
    measured, predicted = result["measured"], result["predicted"]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert measured[key] == predicted[key], (key, measured[key], predicted[key])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_swap_files_hold_the_big_tensors_states(nvme_runs, variant):
    result, _, swap = nvme_runs[variant]
    expected = SWAPPED_STATES[variant] * 2 * BIG_PARTITION_BYTES
    for rank in range(DP):
        files = [f for f in (swap / "zero_stage_3").rglob(f"rank{rank}/*.swp")]
        assert sum(f.stat().st_size for f in files) == expected, sorted(f.name for f in files)
        assert result["measured"]["per_rank"][rank]["nvme_bytes"] == expected


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_host_and_nvme_bytes_are_predicted(nvme_runs, variant):
    result, plan, _ = nvme_runs[variant]
    for record in result["measured"]["per_rank"]:
        assert record["nvme_bytes"] == plan["memory"]["nvme_bytes"]
        assert record["host_bytes"] == plan["memory"]["host_bytes"]
