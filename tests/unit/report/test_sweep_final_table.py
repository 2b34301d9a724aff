"""A sweep's final table shows what each run measured (tokens/s, MFU, memory) beside its state."""

from harness.launch.status import MEASURED_HEADERS, print_status, refresh
from harness.report.table import measured_cells, summary_frame
from harness.rundir import run_dirs


def test_final_table_carries_tokens_mfu_and_memory(sweep_dir, capsys):
    frame = summary_frame([sweep_dir])
    cells = measured_cells(frame)
    completed = frame[frame["status"] == "COMPLETED"].iloc[0]
    tokens, mfu, memory = cells[completed["run"]]
    assert tokens == f"{completed['tokens_per_s']:,.0f}" and mfu == f"{completed['mfu']:.1%}"
    assert memory.endswith(("MiB", "GiB"))
    pruned = frame[frame["status"] == "PRUNED"].iloc[0]
    assert cells[pruned["run"]] == ("-", "-", "-")

    print_status(str(sweep_dir), refresh(run_dirs(sweep_dir), query_slurm=False), measured=cells)
    out = capsys.readouterr().out
    assert all(header in out for header in MEASURED_HEADERS)
    assert tokens in out and mfu in out and memory in out
