"""The console script, driven as a user would (typer's runner, real subcommands)."""

import json

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()


def test_evaluate_json() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "16", "--tp", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"] is True


def test_evaluate_readable_breakdown() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "16", "--tp", "2"])
    assert r.exit_code == 0, r.output
    assert "GiB" in r.stdout and "tokens/s/GPU" in r.stdout


def test_evaluate_invalid_exits_nonzero_with_reason() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--global-batch", "16", "--tp", "3", "--json"])
    assert r.exit_code == 2
    assert "tp x pp x cp = 3 does not divide the 8 GPUs" in json.loads(r.stdout)["error"]


def test_jobs_keeps_order_and_survives_bad_lines(tmp_path) -> None:
    good = {"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8}}
    lines = [json.dumps(good), "{not json", json.dumps({**good, "gpus": -1}), json.dumps(good)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["evaluate", "--jobs", str(path)])
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["ok"] for o in out] == [True, False, False, True]
    assert "line 2: invalid JSON" in out[1]["error"]
    assert out[2]["error"].startswith("gpus:")


def test_jobs_with_several_workers_match_one_worker_line_for_line(tmp_path) -> None:
    good = {"model": "tiny", "cluster": "local-cpu", "training": {"seq_len": 128, "global_batch": 8}}
    lines = []
    for i in range(300):  # more lines than one pool chunk, valid and invalid mixed
        lines.append(json.dumps({**good, "gpus": [1, 2, 4, 8, 3][i % 5], "layout": {"tp": [1, 2][i % 2]}}))
        if i % 37 == 0:
            lines.append("{broken")
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    one = runner.invoke(app, ["evaluate", "--jobs", str(path), "--workers", "1"])
    two = runner.invoke(app, ["evaluate", "--jobs", str(path), "--workers", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    assert two.stdout == one.stdout
    out = [json.loads(x) for x in one.stdout.splitlines()]
    assert len(out) == len(lines) and any(o["ok"] for o in out) and any(not o["ok"] for o in out)


def test_plan_json_and_impossible_job() -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4",
                            "--seq-len", "128", "--global-batch", "8", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    lay = plan["best"]["layout"]
    assert plan["schema_version"] == 1 and lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 4
    r = runner.invoke(app, ["plan", "--model", "llama3-405b", "--cluster", "rtx4090-pcie-8", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "64"])
    assert r.exit_code == 3
    assert "No layout fits" in r.stdout and "bytes" in r.stdout


def test_plan_export_megatron() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                            "--seq-len", "4096", "--global-batch", "64", "--export", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size" in r.stdout


def test_run_dry_run_prints_a_torchrun_line(tmp_path) -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4",
                            "--seq-len", "128", "--global-batch", "8", "--json"])
    plan = tmp_path / "plan.json"
    plan.write_text(r.stdout)
    r = runner.invoke(app, ["run", str(plan), "--dry-run", "--steps", "2"])
    assert r.exit_code == 0, r.output
    line = r.stdout.strip()
    assert "torch.distributed.run --standalone --nproc-per-node=4" in line
    assert line.endswith("--backend auto") and "-m runtime.launch" in line
    r = runner.invoke(app, ["run", str(plan), "--dry-run", "--data", str(tmp_path / "tokens.bin")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"--data {tmp_path / 'tokens.bin'} --data-dtype uint16")
