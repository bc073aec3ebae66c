"""Fine-tuning from the command line: the method options, a cluster file over a preset, and a
full fine-tune refused for host RAM (exit 3, the host bytes in the message)."""

import json

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()


def test_qlora_65b_plans_on_one_48gb_gpu_and_says_what_is_free() -> None:
    """The QLoRA paper's headline (Dettmers et al. 2023): a 65B model fine-tunes on one 48 GB GPU
    (LoRA r=64 on every linear layer, alpha 16, gradient checkpointing)."""
    r = runner.invoke(app, ["plan", "--model", "llama-65b", "--cluster", "l40s-pcie-8", "--gpus", "1", "--seq-len", "512",
                            "--global-batch", "16", "--method", "qlora", "--lora-rank", "64", "--lora-alpha", "16",
                            "--framework", "fsdp"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "Method qlora: frozen nf4_double base (0.5159 bytes per linear weight), LoRA rank 64 (alpha 16)" in out
    assert "799,539,200 trainable and 65,285,660,672 frozen parameters" in out
    assert "GiB free)" in out


def test_full_fine_tune_of_the_same_model_does_not_fit_there() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-65b", "--cluster", "l40s-pcie-8", "--gpus", "1", "--seq-len", "512",
                            "--global-batch", "16", "--framework", "fsdp"])
    assert r.exit_code == 3, r.output
    assert "No layout fits" in r.stdout


def test_method_fields_outside_their_method_are_refused_by_name() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--global-batch", "16", "--quant-format", "nf4", "--method", "lora", "--json"])
    assert r.exit_code == 2 and "quant_format applies to method qlora, not lora" in r.output
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--global-batch", "16", "--method", "lora", "--lora-targets", "q_proj,w9", "--json"])
    assert r.exit_code == 2 and "unknown module name(s) ['w9']" in r.output


def test_evaluate_reports_trainable_and_frozen_parameters() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
                            "16", "--method", "lora", "--lora-targets", "attention", "--zero", "3", "--framework", "fsdp",
                            "--json"])
    assert r.exit_code == 0, r.output
    training = json.loads(r.stdout)["training"]
    # q, k, v, o of 32 layers at rank 16: 16 x (4096+4096 + 4096+1024 + 4096+1024 + 4096+4096) x 32
    assert training["trainable_params"] == training["adapter_params"] == 16 * 26624 * 32
    assert training["frozen_params"] == 8_030_261_248
    assert training["lora"]["modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]  # what this model has


def test_host_ram_refusal_from_a_cluster_file_over_a_preset(tmp_path) -> None:
    path = tmp_path / "a100-small-host.yaml"
    path.write_text("preset: dgx-a100-80g\nhost_memory: 64 GiB\n")
    r = runner.invoke(app, ["plan", "--model", "llama3-70b", "--cluster", str(path), "--gpus", "8", "--seq-len", "4096",
                            "--global-batch", "64", "--framework", "fsdp"])
    assert r.exit_code == 3, r.output
    out = " ".join(r.stdout.split())
    assert "dgx-a100-80g-custom" in out
    assert "fit in GPU memory but not in the node's host RAM" in out
    assert "1051.3 GiB of host RAM per node (8 ranks)" in out and "bytes over the 60.8 GiB usable" in out


def _plan(*args: str) -> str:
    r = runner.invoke(app, ["plan", "--seq-len", "2048", "--global-batch", "16", *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_lora_and_qlora_plan_in_a_stack_on_24_48_and_8x80_gb_and_the_cli_names_it() -> None:
    """A fine-tuning plan runs in a stack that runs its method (HF Trainer + PEFT by default), and the CLI
    says which stack and which techniques it chose; its export is the stack's file."""
    import yaml

    for args in (["--model", "llama3-8b", "--cluster", "rtx4090-pcie-8", "--gpus", "1", "--method", "qlora"],
                 ["--model", "llama3-8b", "--cluster", "l40s-pcie-8", "--gpus", "1", "--method", "lora"],
                 ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8", "--method", "lora"]):
        out = _plan(*args)
        line = next(x for x in out.splitlines() if x.startswith("stack: "))
        assert line.startswith("stack: hf (Hugging Face Trainer / accelerate + PEFT) on fsdp") and "techniques: " in line
        exported = yaml.safe_load(_plan(*args, "--export", "hf"))
        assert {"model", "lora_config", "training_arguments", "accelerate_config"} <= set(exported)
        assert ("bitsandbytes_config" in exported) == ("qlora" in args)
    tt = _plan("--model", "llama3-8b", "--cluster", "rtx4090-pcie-8", "--gpus", "1", "--method", "qlora", "--stack", "torchtune",
               "--export", "torchtune")
    cfg = yaml.safe_load(tt)
    assert cfg["model"]["quantize_base"] is True and cfg["model"]["_component_"] == "torchtune.models.llama3_1.lora_llama3_1"


def test_a_stack_refuses_what_it_cannot_run_by_name() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                            "--method", "lora", "--stack", "hf", "--optimizer-in-backward", "--zero", "3", "--json"])
    assert r.exit_code == 2
    assert "optimizer_in_backward" in json.loads(r.stdout)["error"]
