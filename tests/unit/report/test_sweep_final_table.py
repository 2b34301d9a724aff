"""A sweep's final table shows what each run measured (tokens/s, MFU, memory) beside its state."""

import re

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


GLOO_ERROR = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"


def test_a_reason_with_brackets_is_printed_verbatim_not_as_markup(tmp_path, capsys):
    """A rank's error quotes gloo's source location in brackets: the status and summary tables print it as
    text (rich would read "[/...]" as a closing tag and raise)."""
    from harness.report.table import print_table
    from harness.rundir.states import FAILED
    from harness.rundir.store import write_status

    run_dir = tmp_path / "[bold]sweep" / "run-000"
    run_dir.mkdir(parents=True)
    write_status(run_dir, FAILED, GLOO_ERROR)
    print_status(str(run_dir.parent), refresh(run_dirs(run_dir.parent), query_slurm=False))
    print_table(summary_frame([run_dir.parent]), title=str(run_dir.parent))
    # Folded cells continue on the next line, between box-drawing borders: compare without both.
    out = re.sub(r"[\s\u2500-\u257f]", "", capsys.readouterr().out)
    assert out.count(re.sub(r"\s", "", GLOO_ERROR)) == 2 and out.count("[bold]sweep") == 2
