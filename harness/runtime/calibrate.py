"""Micro-benchmarks that measure a hardware profile on the ranks a run would use (matmul by shape, memory
bandwidth, per-op latency, optimizer throughput, collectives by size) and write it for the time model."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist

from harness.plan.comm import bus_factor
from harness.plan.hardware import (PROFILE_VERSION, HardwareProfile, cpu_profile_name, load_profile, profile_path,
                                   save_profile)
from harness.runtime.host_state import CoreWaitClock

# Up to 512: the size the runtime's own peak measurement uses (bf16 GEMMs on CPUs without AMX run at well
# under 1 GFLOP/s, so larger shapes cost minutes).
MATMUL_SHAPES = ((64, 64, 64), (128, 64, 128), (128, 64, 256), (256, 256, 256), (512, 512, 512))
COLLECTIVE_BYTES = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)


WINDOW_S = 0.2  # each timing spans several scheduler slices, as a training step does


def best_time(fn: Callable[[], object], repeats: int = 5, inner: int = 0) -> float:
    """Median of `repeats` timings of `inner` calls, per call, each timing at least WINDOW_S long (a step of many
    ops spans several scheduler slices; the median is the typical case rather than the luckiest), less the time
    this thread waited for a core meanwhile (host_state.core_wait_s, where readable). The profile then holds the
    rates of ranks with cores of their own, the same whatever else the host ran while it was measured; a run's
    own wait for a core is measured with the run (host.core_wait_shares; time_model.under_core_wait)."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    inner = inner or max(1, int(WINDOW_S / once))
    times = []
    for _ in range(repeats):
        clock = CoreWaitClock()
        for _ in range(inner):
            fn()
        wall, waited = clock.read()
        own = wall - waited if waited is not None else wall
        times.append(max(own, 1e-9 * wall) / inner)
    return statistics.median(times)


def matmul_rates(dtype: torch.dtype) -> Dict[str, float]:
    """FLOP/s of torch.matmul per (m, k, n) shape."""
    rates = {}
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        rates[f"{m}x{k}x{n}"] = 2.0 * m * k * n / best_time(lambda: torch.matmul(a, b))
    return rates


LINEAR_SHAPES = ((128, 64, 64), (128, 64, 128), (128, 128, 64), (128, 64, 256), (512, 256, 256))


def linear_rate(dtype: torch.dtype) -> float:
    """FLOP/s of nn.functional.linear forward + backward (x @ W^T, then the input and weight gradients)
    as training runs it, median over shapes: on CPUs the transposed and 16-bit products are much slower
    than a plain square matmul of the same size."""
    rates = []
    for tokens, k, n in LINEAR_SHAPES:
        x = torch.randn(tokens, k, dtype=dtype, requires_grad=True)
        w = torch.randn(n, k, dtype=dtype, requires_grad=True)
        grad = torch.randn(tokens, n, dtype=dtype)

        def step():
            torch.nn.functional.linear(x, w).backward(grad)

        rates.append(6.0 * tokens * k * n / best_time(step))
    return statistics.median(rates)


def streaming_bandwidth(dtype: torch.dtype, numel: int = 1 << 20) -> float:
    """Bytes/s of an elementwise op in the compute dtype, with its upcast to fp32 (what norms and
    activations do): a.mul(b) reads two and writes one, .float() reads one and writes a 4-byte copy."""
    a, b = torch.randn(numel, dtype=dtype), torch.randn(numel, dtype=dtype)
    size = a.element_size()
    mul = 3 * size * numel / best_time(lambda: a.mul(b))
    cast = (size + 4) * numel / best_time(lambda: a.float())
    return statistics.median((mul, cast))


def memory_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes/s of a large copy (read + write)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2.0 * nbytes / best_time(lambda: dst.copy_(src))


def op_latency(ops: int = 200) -> float:
    """Seconds one small eager op costs with autograd: forward dispatch plus its backward node, per kernel."""
    x = torch.randn(64, requires_grad=True)

    def chain():
        y = x
        for _ in range(ops):
            y = y * 1.0001
        y.sum().backward()

    return best_time(chain) / (2 * ops)


def adam_rate(numel: int = 1 << 21) -> float:
    """Parameters per second torch's AdamW updates in one flat fp32 tensor."""
    param = torch.nn.Parameter(torch.randn(numel))
    param.grad = torch.randn(numel)
    opt = torch.optim.AdamW([param], lr=1e-3, foreach=False)
    return numel / best_time(opt.step)


def collective_times(sizes: Sequence[int]) -> Dict[str, List[Tuple[int, float]]]:
    """(bytes, seconds) per size of all-reduce, all-gather, reduce-scatter and point-to-point in the current
    process group (every rank calls this at once)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    out: Dict[str, List[Tuple[int, float]]] = {k: [] for k in ("all_reduce", "all_gather", "reduce_scatter", "p2p")}
    for nbytes in sizes:
        full = torch.ones(nbytes // 4)
        part = torch.ones(nbytes // 4 // world)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "all_gather": lambda: dist.all_gather_into_tensor(full, part),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
               "p2p": lambda: _exchange(full, rank, world)}
        for kind, op in ops.items():
            dist.barrier()
            # every rank must issue the same number of calls: a fixed count, not a per-rank window
            out[kind].append((nbytes, best_time(op, repeats=7, inner=20)))
    return out


def _exchange(buf: torch.Tensor, rank: int, world: int) -> None:
    peer = rank ^ 1
    if peer >= world:
        return
    if rank % 2 == 0:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)


def fit_link(samples: Dict[str, List[Tuple[int, float]]], world: int) -> Tuple[float, float]:
    """(latency per algorithm step, bus bandwidth) by least squares on t = steps x alpha + bytes x factor / bw
    over every collective and size (the model comm.ring_time predicts with)."""
    rows = []
    for kind, points in samples.items():
        steps = 1 if kind == "p2p" else (2 * (world - 1) if kind == "all_reduce" else world - 1)
        # a p2p exchange here is a send and a receive: two messages
        count = 2 if kind == "p2p" else 1
        for nbytes, seconds in points:
            rows.append((steps * count, nbytes * bus_factor(kind, world) * count, seconds))
    sxx = sum(a * a for a, _, _ in rows)
    sxy = sum(a * b for a, b, _ in rows)
    syy = sum(b * b for _, b, _ in rows)
    sxt = sum(a * t for a, _, t in rows)
    syt = sum(b * t for _, b, t in rows)
    det = sxx * syy - sxy * sxy
    alpha = (sxt * syy - syt * sxy) / det
    inv_bw = (sxx * syt - sxy * sxt) / det
    return max(alpha, 1e-7), 1.0 / max(inv_bw, 1e-12)


ATTENTION_SEQS = (64, 256)


def attention_rates(dtype: torch.dtype, heads: int = 4, head_dim: int = 16) -> Dict[str, float]:
    """A causal SDPA call, forward and backward (timed on its own, from a kept forward) at two sequence
    lengths, each fitted as heads x (fixed cost per head + FLOPs per head / rate): 4·d·T²/2 forward FLOPs per
    head, the half a causal mask keeps. Returns the forward rate, the backward / forward time ratio at equal
    FLOPs and the two fixed costs."""
    fits = {}
    for name in ("forward", "backward"):
        points = []
        for seq in ATTENTION_SEQS:
            q = torch.randn(1, heads, seq, head_dim, dtype=dtype, requires_grad=True)
            grad = torch.randn(1, heads, seq, head_dim, dtype=dtype)

            def forward():
                return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

            forward_s = best_time(forward)
            both_s = best_time(lambda: forward().backward(grad)) if name == "backward" else forward_s
            seconds = forward_s if name == "forward" else max(both_s - forward_s, 0.0)
            points.append((4.0 * head_dim * seq * seq / 2, seconds / heads))
        (f0, t0), (f1, t1) = points
        per_flop = max((t1 - t0) / (f1 - f0), 1e-15)
        fits[name] = (max(t0 - f0 * per_flop, 0.0), per_flop)
    return {"flops": 1.0 / fits["forward"][1], "backward_ratio": fits["backward"][1] / fits["forward"][1],
            "head_latency_s": fits["forward"][0], "backward_head_latency_s": fits["backward"][0]}


def disk_bandwidth(directory: str, nbytes: int = 32 << 20) -> float:
    """Bytes/s of a synced sequential write: what NVMe offload's swap files see."""
    data = os.urandom(nbytes)
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        start = time.perf_counter()
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return nbytes / (time.perf_counter() - start)


def measure_rank(dtype: torch.dtype) -> Dict[str, object]:
    """Every single-process benchmark, on this rank, while the other ranks run theirs."""
    rates = matmul_rates(dtype)
    return {"matmul": rates, "linear_flops": linear_rate(dtype), "streaming_bandwidth": streaming_bandwidth(dtype),
            "memory_bandwidth": memory_bandwidth(), "op_latency_s": op_latency(),
            "adam_params_per_s": adam_rate(), "attention": attention_rates(dtype),
            "collectives": collective_times(COLLECTIVE_BYTES)}


def profile_from(records: List[Dict[str, object]], world: int, name: str, disk: float, ranks_per_node: int = 0,
                 cores: int = 0) -> Tuple[HardwareProfile, Dict]:
    """One profile from every rank's measurements (medians across ranks); `ranks_per_node` and `cores` of
    the node the ranks ran on (default: all ranks on this host)."""
    def med(key):
        return statistics.median(float(r[key]) for r in records)

    # The reference peak is the runtime's own (a 512^3 matmul, harness.runtime.meter), so predicted and
    # measured MFU share a denominator; GEMMs run at the rate nn.Linear reaches in training.
    peak = statistics.median(r["matmul"]["512x512x512"] for r in records)
    samples = {k: [(n, statistics.median(r["collectives"][k][i][1] for r in records))
                   for i, (n, _) in enumerate(records[0]["collectives"][k])] for k in records[0]["collectives"]}
    alpha, bandwidth = fit_link(samples, world) if world > 1 else (1e-5, med("memory_bandwidth") / 2)
    links = {kind: fit_link({kind: points}, world) for kind, points in samples.items()} if world > 1 else {}
    attention = {key: statistics.median(r["attention"][key] for r in records) for key in records[0]["attention"]}
    profile = HardwareProfile(
        name=name, matmul_efficiency=med("linear_flops") / peak, attention_efficiency_sdpa=attention["flops"] / peak,
        attention_efficiency_flash=attention["flops"] / peak, memory_bandwidth=med("streaming_bandwidth"),
        memory_efficiency=1.0,
        op_latency_s=med("op_latency_s"),
        gpus_per_node=ranks_per_node or world, intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth,
        collective_base_latency_s=0.0, intra_step_latency_s=alpha, inter_step_latency_s=alpha,
        low_latency_protocol=False, overlaps_comm=False, host_link_bandwidth=med("memory_bandwidth") / 2,
        cpu_adam_params_per_s=med("adam_params_per_s"), nvme_bandwidth=disk,
        attention_backward_ratio=attention["backward_ratio"], attention_head_latency_s=attention["head_latency_s"],
        attention_backward_head_latency_s=attention["backward_head_latency_s"], collective_links=links,
        cores_per_node=cores or len(os.sched_getaffinity(0)),
        measured_peak_flops=peak, version=PROFILE_VERSION,
        source=f"measured:{name}:{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    raw = {"matmul_by_shape": {k: statistics.median(r["matmul"][k] for r in records) for k in records[0]["matmul"]},
           "collectives": samples, "ranks": world, "load_average": os.getloadavg(),
           "core_wait_share": max((r["core_wait_share"] for r in records if r.get("core_wait_share") is not None),
                                  default=None)}
    return profile, raw


Records = List[Dict[str, object]]


def _measure_in_group(rank: int, world: int, init_method: str, precision: str,
                      keep: Callable[[Records], None] = lambda records: None) -> Records:
    """Every rank's measurements, taken at once in one gloo group (each rank gets them all); `keep` receives them
    once every rank has passed the barrier, and every rank waits for it to return before the group is torn down."""
    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for several ranks per node
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    clock = CoreWaitClock()
    record = measure_rank(dtype)
    record["core_wait_share"] = clock.share()  # how much the host's other processes slowed its micro-benchmarks
    records: Records = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(records, record)
    dist.barrier()  # no rank tears its gloo pairs down while a peer still reads the gather
    keep(records)
    dist.barrier()  # nor while rank 0 keeps them: a peer dying in teardown would cut the keeping short
    dist.destroy_process_group()
    return records


def _worker(rank: int, world: int, port: int, precision: str, out: str) -> None:
    _measure_in_group(rank, world, f"tcp://127.0.0.1:{port}", precision,
                      keep=lambda records: _write_records(records, out) if rank == 0 else None)


def _write_records(records: Records, out: str) -> None:
    """Whole or not at all: gathered_records reads the file after a peer's death in teardown."""
    Path(out + ".tmp").write_text(json.dumps(records))
    os.replace(out + ".tmp", out)


def gathered_records(out: str, world: int, error: BaseException) -> Records:
    """Rank 0's records when a rank died after the measurement: rank 0 writes them once every rank's record was
    gathered and every rank passed the barrier, before the group's teardown, so a death in that teardown (gloo's
    pairs throw "Connection reset by peer" when a peer exits first, and the uncaught exception aborts:
    pytorch/gloo#168) took nothing from it. Without them, `error` is the calibration's failure."""
    if not os.path.exists(out):
        raise error
    records = json.loads(Path(out).read_text())
    if len(records) != world or any(record is None for record in records):
        raise error
    print(f"[harness] calibration: a rank ended with {error} after every rank's measurements were gathered; "
          "they are kept", file=sys.stderr)
    return records


def measure_local(ranks: int, precision: str = "bf16") -> List[Dict[str, object]]:
    """Run the benchmarks on `ranks` local processes at once (gloo), as a CPU run would."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.json")
        try:
            mp.spawn(_worker, args=(ranks, port, precision, out), nprocs=ranks, join=True)
        except mp.ProcessExitedException as error:
            return gathered_records(out, ranks, error)
        return json.loads(Path(out).read_text())


def write_profile(records: List[Dict[str, object]], world: int, name: str, out: str, ranks_per_node: int = 0,
                  cores: int = 0) -> Path:
    """The profile of these measurements, with them kept under `raw`, at `out` (default: the cache file)."""
    profile, raw = profile_from(records, world, name, disk_bandwidth(tempfile.gettempdir()), ranks_per_node, cores)
    return save_profile(profile, Path(out) if out else profile_path(name), raw)


def calibrate(ranks: int = 2, precision: str = "bf16", name: str = "", out: str = "") -> Path:
    """Measure this host on `ranks` processes and write the profile (default: the host's cache file)."""
    name = name or cpu_profile_name()
    return write_profile(measure_local(ranks, precision), ranks, name, out)


def slurm_task(precision: str, name: str, out: str) -> int:
    """One task of `harness calibrate --slurm`'s job: rank SLURM_PROCID of SLURM_NTASKS, meeting at the
    MASTER_ADDR:MASTER_PORT its script exported; rank 0 writes the profile. The links it measures are those
    of a group spanning every node of the job (across nodes when there are several)."""
    env = os.environ
    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    cores = int(env.get("SLURM_CPUS_ON_NODE") or 0)

    def keep(records: Records) -> None:
        # Written before the group's teardown: a peer dying there (pytorch/gloo#168) makes srun
        # --kill-on-bad-exit end this rank too, and `harness calibrate --slurm` keeps a profile the job wrote.
        path = write_profile(records, world, name, out, ranks_per_node=max(1, world // nodes), cores=cores)
        print(f"profile written to {path}")

    _measure_in_group(rank, world, f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}", precision,
                      keep=keep if rank == 0 else lambda records: None)
    return 0


def main(argv: Sequence[str] = ()) -> int:
    """`harness calibrate [--ranks N] [--precision P] [--name NAME] [--out PATH]`."""
    import argparse

    from harness.config.arguments import OneLineParser, slug, whole_number

    parser = OneLineParser(prog="harness calibrate", description=__doc__)
    parser.add_argument("--ranks", type=whole_number, default=2, help="processes to measure with (default 2)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--name", type=slug, default=None,
                        help="profile name, the file name in the profile cache (default: this host's)")
    parser.add_argument("--out", default="", help="write the profile here instead of the profile cache")
    parser.add_argument("--slurm-task", action="store_true", help=argparse.SUPPRESS)  # inside the --slurm job
    args = parser.parse_args(list(argv))
    check_out(parser, args.out)
    if args.slurm_task:
        return slurm_task(args.precision, args.name or "cluster", args.out)
    path = calibrate(args.ranks, args.precision, args.name or "", args.out)
    print(f"profile written to {path}")
    print(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "raw"}, indent=2))
    return 0


def check_out(parser, out: str) -> None:
    """A profile path that cannot be written is refused before the minute of measuring."""
    from harness.config.arguments import unwritable_file

    problem = unwritable_file(Path(out)) if out else None
    if problem:
        parser.error(f"--out={out!r} {problem}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
