"""`gbmw compare` on a job whose settings some targets cannot run (precision fp8, bf16 gradients, TP communication
overlap): those rows say "refused" and why, once per reason, and the rows that can run it are still compared.
Before: the first refusing row (the runtime's) ended the whole comparison with its error."""

from __future__ import annotations

import pytest

import gbmw
from gbmw.cli.compare import compare_jobs
from gbmw.cli.report import comparison_to_json, print_comparison
from gbmw.space.targets import get_target

JOB = "model: gpt3-15b\ncluster: h100-80g-x64\nprecision: bf16\ntp_comm_overlap: true\nglobal_batch: 512\n"


@pytest.fixture(scope="module")
def rows_and_job(tmp_path_factory):
    path = tmp_path_factory.mktemp("compare") / "gpt3-15b-tpoverlap_h100-80g-x64.yaml"
    path.write_text(JOB)
    job = gbmw.load_job(path)
    return compare_jobs([job]), job


def test_rows_whose_target_cannot_run_the_job_are_refused_and_the_others_searched(rows_and_job):
    rows, job = rows_and_job
    for row in rows:
        target = row.name if row.kind == "target" else "runtime"
        refusal = get_target(target).precision_refusal(job.precision, job.gradient_reduce_dtype, job.tp_comm_overlap)
        (cell,) = row.cells
        assert cell.refusal == refusal, row.name
        assert (cell.plan is None) == (refusal is not None), row.name  # catches a refused row searched anyway
    assert any(cell.plan is not None for row in rows for cell in row.cells)
    assert [entry.get("refused") for entry in comparison_to_json(rows)] == [row.cells[0].refusal for row in rows]


def test_each_reason_is_printed_once_with_the_rows_it_refuses(rows_and_job, capsys):
    rows, job = rows_and_job
    print_comparison(rows, job)
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("refused (") == len({row.cells[0].refusal for row in rows if row.cells[0].refusal})
    assert "refused (ddp, megatron-tp, gpipe, fsdp, deepspeed-3d" in out
    assert "tp_comm_overlap: --target runtime does not run Transformer Engine's TP communication overlap" in out
