"""Golden inference parity: turn the upstream session (tests/support/reference_inference.py) into our fixture.

    .venv/bin/python -m tests.support.inference_golden OUT_DIR

reads OUT_DIR/{transformer/, case_<name>.safetensors, summary.json} (the upstream run), loads the tiny
transformer with our strict loader, and writes tests/fixtures/inference_parity.{safetensors,json}: the
weights as our model holds them, each case's inputs and the upstream's outputs, so that
tests/test_inference_parity.py runs without the upstream code. It also prints our max abs differences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainer.config import RunConfig
from trainer.model import WorldModel, load_full
from trainer.model.weights import fields_from_config_json, read_config_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_TENSORS = FIXTURES / "inference_parity.safetensors"
FIXTURE_JSON = FIXTURES / "inference_parity.json"


def tiny_model(config_json: dict, actions_per_frame: int, source: Path) -> WorldModel:
    cfg = RunConfig()
    cfg.model.attention = "sdpa"
    cfg.data.actions_per_frame = actions_per_frame
    for key, value in fields_from_config_json(config_json, source).items():
        setattr(cfg.model, key, value)
    return WorldModel(cfg).eval()


def main(out: Path) -> None:
    from tests.support.inference_run import compare

    summary = json.loads((out / "summary.json").read_text())
    conf = read_config_json(out / "transformer")
    model = tiny_model(conf, summary["actions_per_frame"], out / "transformer")
    if load_full(model, out / "transformer"):
        raise SystemExit(f"{out}/transformer: our strict loader reported problems")
    tensors = {f"weight.{k}": v.contiguous() for k, v in model.state_dict().items()}
    for name in summary["cases"]:
        for key, value in load_file(out / f"case_{name}.safetensors").items():
            tensors[f"{name}.{key}"] = value
    meta = {**summary, "config_json": conf}
    FIXTURES.mkdir(exist_ok=True)
    save_file(tensors, str(FIXTURE_TENSORS))
    FIXTURE_JSON.write_text(json.dumps(meta, indent=1) + "\n")
    for name in summary["cases"]:
        for key, diff in compare(model, meta, tensors, name).items():
            print(f"case {name} {key}: max abs diff {diff:.2e}")
    print(f"wrote {FIXTURE_TENSORS} ({FIXTURE_TENSORS.stat().st_size} bytes), {FIXTURE_JSON}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="the upstream session's output (reference_inference.py)")
    torch.set_num_threads(2)
    main(parser.parse_args().out_dir)
