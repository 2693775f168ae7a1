"""The model's parameter names and shapes are exactly the released transformer's (all 839 tensors).

tests/fixtures/released_layout.json holds the names/shapes the upstream WanTransformer3DModel (58c2ae5) has at
the released config.json (dumped by the parity run on the meta device): the tensors outside the blocks, one
block's tensors (all 30 blocks are identical), the tensor and parameter counts, the reference's ignore list.
"""

import json
from pathlib import Path

import pytest
import torch

from trainer.config import RunConfig
from trainer.model import WorldModel
from trainer.model.weights import IGNORED_UNEXPECTED, fields_from_config_json

pytestmark = pytest.mark.fast

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "released_layout.json").read_text())


def released_names() -> dict[str, list[int]]:
    names = dict(FIXTURE["outside_blocks"])
    for i in range(FIXTURE["num_blocks"]):
        names.update({f"blocks.{i}.{k}": v for k, v in FIXTURE["per_block"].items()})
    return names


def test_default_model_config_is_the_released_config_json():
    fields = fields_from_config_json(FIXTURE["config"], Path("released/config.json"))
    defaults = RunConfig().model
    assert {k: getattr(defaults, k) for k in fields} == fields


def test_names_and_shapes_match_the_released_transformer_exactly():
    with torch.device("meta"):
        model = WorldModel(RunConfig())
    ours = {n: list(p.shape) for n, p in model.named_parameters()}
    assert ours == released_names()
    assert len(ours) == FIXTURE["num_tensors"] == 839
    assert sum(p.numel() for p in model.parameters()) == FIXTURE["num_params"]
    assert not list(model.buffers())  # no buffers: RoPE tables are computed from positions
    assert tuple(FIXTURE["keys_to_ignore_on_load_unexpected"]) == IGNORED_UNEXPECTED
