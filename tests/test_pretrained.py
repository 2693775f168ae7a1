"""Released-layout checkpoints: export, strict loading (whole and per FSDP2 shard), dims from config.json.

The folders are written by trainer.model.export_reference from a tiny randomly initialised model (real code,
stand-in weights): the same layout as robbyant/lingbot-va-base's transformer/ and the reference trainer's
checkpoint_step_N/transformer/.
"""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from tests.support.lingbot_tiny import micro_batch, tiny_cfg
from trainer.model import PretrainedError, WorldModel, apply_pretrained_config, export_reference, load_full
from trainer.model.weights import CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME, resolve_transformer_dir

WORLD = 2


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return WorldModel(cfg)


@pytest.fixture
def released(tmp_path):
    """A 'released' folder: root/transformer/{config.json, diffusion_pytorch_model.safetensors} (fp32)."""
    cfg = tiny_cfg()
    model = _model(cfg, seed=1)
    folder = export_reference(model, cfg, tmp_path / "lingbot-va-base", dtype=torch.float32)
    assert folder is not None
    return cfg, model, folder


@pytest.mark.fast
def test_export_writes_the_released_layout(released):
    cfg, model, folder = released
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    conf = json.loads((folder / CONFIG_NAME).read_text())
    assert conf["_class_name"] == "WanTransformer3DModel"
    assert (conf["num_attention_heads"], conf["attention_head_dim"], conf["num_layers"]) == (4, 12, 2)
    assert conf["patch_size"] == [1, 2, 2] and conf["in_channels"] == conf["out_channels"] == 4
    tensors = load_file(folder / WEIGHTS_NAME)
    assert set(tensors) == {n for n, _ in model.named_parameters()}
    assert "blocks.1.ffn.net.0.proj.weight" in tensors and "blocks.0.attn2.norm_k.weight" in tensors


@pytest.mark.fast
def test_bf16_export_is_what_the_reference_trainer_saves(tmp_path):
    cfg = tiny_cfg()
    model = _model(cfg)
    folder = export_reference(model, cfg, tmp_path / "checkpoint_step_7")
    assert folder is not None
    tensors = load_file(folder / WEIGHTS_NAME)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    torch.testing.assert_close(tensors["proj_out.weight"], model.proj_out.weight.detach().bfloat16())


@pytest.mark.fast
def test_strict_load_round_trips_and_dims_come_from_config_json(released):
    _, model, folder = released
    cfg = tiny_cfg()
    for key in ("model.depth", "model.dim", "model.heads", "model.ffn_dim"):  # back to the released defaults
        setattr(cfg.model, key.split(".")[1], getattr(type(cfg.model)(), key.split(".")[1]))
    cfg.model.pretrained = str(folder.parent)  # the root: transformer/ is found below it
    assert apply_pretrained_config(cfg) == folder
    assert (cfg.model.depth, cfg.model.dim, cfg.model.heads, cfg.model.ffn_dim) == (2, 48, 4, 96)
    fresh = _model(cfg, seed=2)
    assert load_full(fresh, folder) == []
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    batch = micro_batch(cfg)
    with torch.no_grad():
        assert torch.equal(model(batch)["loss"], fresh(batch)["loss"])


@pytest.mark.fast
def test_a_conflicting_model_setting_is_an_error(released):
    _, _, folder = released
    cfg = tiny_cfg(**{"model.depth": 3, "model.pretrained": str(folder)})
    with pytest.raises(PretrainedError, match=r"model.depth=3 but .*config.json says 2"):
        apply_pretrained_config(cfg)


def _rewrite(folder, change):
    tensors = load_file(folder / WEIGHTS_NAME)
    change(tensors)
    save_file(tensors, folder / WEIGHTS_NAME)


@pytest.mark.fast
def test_missing_unexpected_and_misshaped_tensors_are_named(released):
    cfg, _, folder = released
    _rewrite(folder, lambda t: t.pop("blocks.1.attn2.to_v.bias"))
    with pytest.raises(PretrainedError, match=r"1 missing tensor\(s\): blocks.1.attn2.to_v.bias"):
        load_full(_model(cfg), folder)
    _rewrite(
        folder,
        lambda t: t.update({"blocks.1.attn2.to_v.bias": torch.zeros(48), "extra.weight": torch.ones(2)}),
    )
    with pytest.raises(PretrainedError, match=r"unexpected tensor\(s\): extra.weight"):
        load_full(_model(cfg), folder)
    _rewrite(folder, lambda t: (t.pop("extra.weight"), t.update({"proj_out.bias": torch.zeros(15)})))
    with pytest.raises(PretrainedError, match=r"proj_out.bias: file \[15\] vs model \[16\]"):
        load_full(_model(cfg), folder)


@pytest.mark.fast
def test_only_the_keys_the_reference_ignores_are_ignored(released):
    cfg, _, folder = released
    _rewrite(folder, lambda t: t.update({"blocks.0.attn2.norm_added_q.weight": torch.ones(48)}))
    assert load_full(_model(cfg), folder) == ["blocks.0.attn2.norm_added_q.weight"]


@pytest.mark.fast
def test_an_index_sharded_folder_loads(released):
    cfg, model, folder = released
    tensors = load_file(folder / WEIGHTS_NAME)
    names = sorted(tensors)
    parts = {"diffusion_pytorch_model-00001-of-00002.safetensors": names[::2]}
    parts["diffusion_pytorch_model-00002-of-00002.safetensors"] = names[1::2]
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, folder / file)
    (folder / WEIGHTS_NAME).unlink()
    weight_map = {k: file for file, keys in parts.items() for k in keys}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    fresh = _model(cfg, seed=5)
    load_full(fresh, folder)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))


@pytest.mark.fast
def test_bad_locations_say_what_to_do(tmp_path):
    with pytest.raises(PretrainedError, match=r"no such directory \(.*absent\); download robbyant"):
        resolve_transformer_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedError, match="neither it nor .*transformer holds config.json"):
        resolve_transformer_dir(tmp_path / "empty")
    (tmp_path / "broken" / "transformer").mkdir(parents=True)
    (tmp_path / "broken" / "transformer" / CONFIG_NAME).write_text("{}")
    (tmp_path / "broken" / "transformer" / WEIGHTS_NAME).write_bytes(b"\x00" * 16)
    cfg = tiny_cfg(**{"model.pretrained": str(tmp_path / "broken")})
    with pytest.raises(PretrainedError, match="missing key 'patch_size'"):
        apply_pretrained_config(cfg)


def _rank_main(rank, init_file, folder, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    from torch.distributed.tensor import DTensor

    from trainer.model.parallel import build_model

    cfg = tiny_cfg(**{"model.pretrained": str(folder), "model.activation_checkpointing": True})
    model = build_model(cfg, torch.device("cpu"))
    files = load_file(folder / WEIGHTS_NAME)
    local_rows = {}
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.device.type == "cpu"
        full = p.full_tensor()
        assert torch.equal(full, files[name.replace("_checkpoint_wrapped_module.", "")]), name
        local_rows[name.replace("_checkpoint_wrapped_module.", "")] = p.to_local().shape[0]
    loss = model(micro_batch(cfg))["loss"].detach()
    export_reference(model, cfg, out_dir / "export", dtype=torch.float32)
    result = {"rank": rank, "loss": float(loss), "rows": local_rows, "ignored": model.pretrained_ignored}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_sharded_loading_under_fsdp2_matches_the_files_and_exports_back(released, tmp_path):
    cfg, model, folder = released
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank_main, args=(tmp_path / "init", folder, tmp_path), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    # each rank holds half the rows of a block's weight: it read only its slice
    assert ranks[0]["rows"]["blocks.0.ffn.net.0.proj.weight"] == 96 // WORLD
    assert ranks[0]["loss"] == ranks[1]["loss"]  # both ranks ran the same batch through one sharded model
    with torch.no_grad():
        expected = float(model(micro_batch(cfg))["loss"])
    assert ranks[0]["loss"] == pytest.approx(expected, rel=1e-5)
    exported = load_file(tmp_path / "export" / "transformer" / WEIGHTS_NAME)
    original = load_file(folder / WEIGHTS_NAME)
    assert set(exported) == set(original) and all(torch.equal(exported[k], original[k]) for k in original)


REFERENCE_CHECK = """
import sys, torch
from safetensors.torch import load_file
from bench.bench_reference import _import_reference
ref_model = _import_reference()[0]
folder = sys.argv[1]
model = ref_model.WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
files = load_file(folder + "/diffusion_pytorch_model.safetensors")
state = model.state_dict()
assert set(state) == set(files), set(state) ^ set(files)
assert all(torch.equal(state[k], files[k].float()) for k in files)
print("loaded", type(model).__name__, model.config.num_layers, len(state))
"""


@pytest.mark.fast
def test_the_reference_from_pretrained_loads_our_export(tmp_path):
    """Run the upstream WanTransformer3DModel.from_pretrained (installed outside the tree) on our export."""
    import subprocess

    from bench.bench_reference import PARITY_PYTHON, REFERENCE_SRC, parity_missing

    missing = parity_missing()
    if missing:
        pytest.skip(missing)
    assert PARITY_PYTHON is not None and REFERENCE_SRC is not None
    cfg = tiny_cfg()
    folder = export_reference(_model(cfg, seed=3), cfg, tmp_path / "checkpoint_step_5")
    assert folder is not None
    repo = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(
        [str(PARITY_PYTHON), "-c", REFERENCE_CHECK, str(folder)],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": repo},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "loaded WanTransformer3DModel 2 83"
