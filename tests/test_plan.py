"""The plan (trainer/plan/): GPU table, accounting, the fit decision, --plan, the gpu_check dry run, and
the predicted peak against a real 2-rank CPU step at cpu_scale (within 10%). That step runs with
train.grad_accum=3 on both sides, measured and predicted: memory differs only on the first, a middle and the
last micro-step (trainer/plan/memory.py micro_steps), which 3 has, so more would only repeat the middle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.loop.profiling import BF16_DENSE_PEAK_FLOPS
from trainer.plan import estimate
from trainer.plan.gpus import GPU_KINDS, UnknownGpu, gpu_kind, match_device_name

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "model.pretrained": "",
    "model.dim": 48,
    "model.heads": 4,
    "model.depth": 2,
    "model.ffn_dim": 96,
    "model.text_dim": 32,
    "model.latent_channels": 8,
    "model.latent_size": 8,
    "model.attn_block": 32,
    "data.frames": 4,
    "data.actions_per_frame": 2,
    "data.text_length": 16,
    "train.grad_accum": 3,
}


# the traced plans' claims hold for any micro-step count: one traces each candidate once, not 3 times
ONE_MICRO = {"train.grad_accum": 1}


def tiny(**more):
    return load_config("furniture_train", cpu_scale=False, overrides={**TINY, **more})


@pytest.mark.fast
def test_gpu_table_has_sources_and_feeds_the_mfu_table():
    for required in ("B200", "H200", "H100", "A100"):
        kind = gpu_kind(required.lower())
        assert kind.bf16_dense_flops > 1e14 and kind.memory_bytes > 4e10 and kind.link_bytes_per_s > 1e10
        assert "data sheet" in kind.source
    assert dict(BF16_DENSE_PEAK_FLOPS) == {k.name: k.bf16_dense_flops for k in GPU_KINDS}
    assert match_device_name("NVIDIA GB200").name == "GB200"
    assert match_device_name("NVIDIA H100 80GB HBM3").name == "H100"
    assert match_device_name("NVIDIA H100 NVL").name == "H100 NVL"
    assert match_device_name("Tesla V100") is None
    with pytest.raises(UnknownGpu, match="B200"):
        gpu_kind("V100")


@pytest.mark.fast
def test_grace_nodes_name_the_aarch64_platform_in_the_plan():
    from trainer.plan.report import format_plan

    for name in ("GB200", "GH200"):
        assert gpu_kind(name).platform == "linux-aarch64"
    for name in ("B200", "H200", "H100", "A100"):
        assert gpu_kind(name).platform == "linux-64"
    assert match_device_name("NVIDIA GH200 480GB").name == "GH200"  # not H200
    plan = estimate.Plan(
        "furniture_train", 2, 1, "cuda", "flex", "bf16", "full", 10, 10, 100, 1, 1, 1, 0.1,
        {"total": 2**30}, "traced", 1.0, 1.0, 1.0, 1, 1, 1.0, 1, 0.0,
    )  # fmt: skip
    plan.kinds = [estimate.KindPlan(gpu_kind(n).name, 1e11, 9e10, True, 1.0, 1.0, 1.0, 1.0, "", "")
                  for n in ("GH200", "B200")]  # fmt: skip
    text = format_plan(plan)
    assert "env platform: linux-64, linux-aarch64" in text
    assert "GH200 nodes have a Grace CPU: platform linux-aarch64" in text
    assert "--platform linux-aarch64" in text and "B200 nodes" not in text


@pytest.mark.fast
def test_comm_bytes_follow_the_fsdp2_settings():
    cfg = tiny()
    counts = (1000, 900, 800, 760, 0.0)  # all, trained, in blocks, trained in blocks
    gathered, reduced, wire = estimate.comm_bytes(cfg, counts, 2, 2)
    assert (gathered, reduced) == (2 * 1000, 4 * 900)  # one all-gather pass, one reduce-scatter per step
    assert wire == (2000 + 3600) / 2
    cfg.train.keep_params_gathered, cfg.train.grad_sync = False, "every"
    gathered, reduced, _ = estimate.comm_bytes(cfg, counts, 4, 2)
    assert gathered == 2 * (800 * 2 * 3 + 200 * 3) and reduced == 4 * 900 * 3
    assert estimate.comm_bytes(cfg, counts, 1, 2) == (0, 0, 0.0)


@pytest.mark.fast
def test_candidate_changes_name_set_flags():
    cfg = tiny(**{"model.activation_checkpointing": "none", "train.batch_size": 2})
    described = [c[0] for c in estimate.candidate_changes(cfg, 2)]
    assert "--set model.activation_checkpointing=full" in described
    assert "--set train.keep_params_gathered=false" in described
    assert "--set train.grad_sync=every" in described
    assert "--set train.batch_size=1 --set train.grad_accum=6" in described
    assert described[-1].startswith("4 ranks")


@pytest.mark.fast
def test_lower_bound_is_compute_or_comm_whichever_is_slower():
    plan = estimate.Plan(
        config="x", world_size=2, nnodes=1, target="cuda", attention="flex", mixed_precision="bf16",
        activation_checkpointing="full", parameters=10, trained_parameters=10, tokens_per_micro_batch=1,
        batch_size=1, grad_accum=1, steps=100, margin=0.1, memory={"total": 90}, memory_method="test",
        flops_per_token=1.0, model_flops_per_step=3e15, executed_flops_per_step=4e15, all_gather_bytes=0,
        reduce_scatter_bytes=0, wire_bytes_per_rank=9e11, checkpoint_bytes=0, trace_seconds=0.0,
    )  # fmt: skip
    b200 = estimate.kind_plan(plan, gpu_kind("B200"))
    assert b200.compute_s == pytest.approx(4e15 / 2.25e15) and b200.comm_s == pytest.approx(1.0)
    assert b200.step_lower_bound_s == b200.compute_s and b200.eta_lower_bound_s == pytest.approx(
        100 * b200.compute_s
    )
    a100 = estimate.kind_plan(plan, gpu_kind("A100"))
    assert a100.comm_s == pytest.approx(3.0) and a100.step_lower_bound_s == pytest.approx(4e15 / 312e12)
    plan.nnodes = 2  # between nodes the network is the slowest link
    assert estimate.kind_plan(plan, gpu_kind("B200")).comm_s == pytest.approx(9e11 / 50e9)
    assert estimate.mfu_at(plan, gpu_kind("B200"), 13.3) == pytest.approx(3e15 / (13.3 * 2.25e15))


@pytest.mark.heavy  # traces the tiny model once per candidate change
def test_plan_of_a_tiny_model_and_its_refusal():
    from trainer.plan.gpus import GpuKind
    from trainer.plan.report import format_plan, refusal_message

    cfg = tiny(**ONE_MICRO)
    plan = estimate.make_plan(cfg, 2, 1, [gpu_kind("B200")])
    total = plan.memory["total"]
    assert total > 0 and plan.memory["optimizer_state"] > 0 and plan.kinds[0].fits
    assert plan.model_flops_per_step > 0 and plan.executed_flops_per_step == pytest.approx(
        plan.model_flops_per_step * 4 / 3
    )
    assert "peak memory per rank" in format_plan(plan)
    small = GpuKind("tiny", 1e15, total * 1.05, 1e11, "test link", "test")  # fits raw, not with the margin
    plan.kinds = [estimate.kind_plan(plan, small)]
    assert not plan.kinds[0].fits
    message = refusal_message(cfg, plan, small, 2)
    assert message and "largest:" in message and "plan.allow_overfit=true" in message
    assert "4 ranks" in message  # twice the ranks halves the sharded state: predicted to fit


@pytest.mark.heavy  # a bin/train run (it starts no rank)
def test_plan_command_json(tmp_path):
    sets = [a for k, v in {**TINY, **ONE_MICRO}.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [str(ROOT / "bin" / "train"), "furniture_train", "2", "--plan", "--gpu", "H200", "--json", *sets],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = json.loads(proc.stdout)
    plan = body["plan"]
    assert plan["world_size"] == 2 and plan["kinds"][0]["name"] == "H200"
    assert plan["memory"]["total"] > 0 and plan["checkpoint_bytes"] > 0


@pytest.mark.fast
def test_gpu_check_dry_run_measures_nothing(tmp_path):
    proc = subprocess.run(
        [str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "nothing measured" in proc.stdout
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["status"] == "no_gpu" and "peak_allocated_bytes" not in result and "mfu" not in result
    assert result["parameters"] > 1e8  # the cluster block shapes, a few layers
    table = (tmp_path / "gpu_check.md").read_text()  # the matrix's rows: built and predicted, not run
    assert "candidate defaults" in table and "2026-12-04 config" in table and "| 30 |" in table
    assert table.count("not run (dry run)") == table.count("\n| ") - 1  # every row, none measured


@pytest.mark.heavy
def test_predicted_peak_matches_a_real_two_rank_cpu_step(tmp_path):
    from trainer.plan.memory import traced_peak

    out = tmp_path / "measured.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--log-dir", str(tmp_path / "logs"),
         "--nproc-per-node", "2", "-m", "trainer.plan.measure",
         "--config", "furniture_train", "--cpu-scale", "--set", "train.grad_accum=3", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(out.read_text())["memory"]["total"]
    cfg = load_config("furniture_train", cpu_scale=True, overrides={"train.grad_accum": 3})
    predicted = traced_peak(cfg, 2, "cpu")["total"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)


@pytest.mark.fast
def test_a_plan_leaves_no_fake_tensor_behind_for_a_real_step_in_the_same_process():
    """The plan traces under FakeTensorMode; a table cached during the trace (recipe.sigma_table /
    weight_table) once kept a FakeTensor that the next real step read (on an H200: `CUDA error: an
    illegal memory access`, bench/results/2026-12-04-gpu-check.md). A real forward after a plan in the
    same process equals one before it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from trainer.model import WorldModel
    from trainer.model.attention import SdpaBackend
    from trainer.plan.memory import synthetic_micro_batch, traced_peak
    from trainer.recipe import draws as recipe

    cfg = tiny(**ONE_MICRO)
    recipe._real_tables.cache_clear()
    torch.manual_seed(0)
    model = WorldModel(cfg)
    batch = synthetic_micro_batch(cfg, seed=1)
    model.use_attention_backend(SdpaBackend(), "test")
    before = model(batch)["loss"].item()
    recipe._real_tables.cache_clear()
    assert traced_peak(cfg, 1, "cpu")["total"] > 0
    for shift in (cfg.recipe.video_shift, cfg.recipe.action_shift):
        assert not isinstance(recipe.sigma_table(shift), FakeTensor)
        assert not isinstance(recipe.weight_table(shift), FakeTensor)
    assert model(batch)["loss"].item() == before
