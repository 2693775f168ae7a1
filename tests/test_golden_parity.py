"""Parity with the upstream reference (58c2ae5): latent_loss, action_loss, outputs and gradients to 1e-4.

Committed part (always runs): tests/fixtures/golden_parity.* hold a tiny model's weights, our micro-batches
and the numbers the reference's forward_train + compute_loss produced on them (fp32, CPU, SDPA; two cases:
B=2 with two camera views and noisy history, B=1 with three views). Live part (runs where a parity run's
files are, $LINGBOT_GOLDEN_DIR; skipped otherwise, the skip naming the commands that make them): our strict
loader reads the reference's own
save_pretrained folder, every random draw of its run is converted to our batch, and every parameter's
gradient is compared too. The committed fixture was made from tests/support/reference_golden.py's run of the
upstream code (its docstring has the two commands); `.venv/bin/python -m tests.support.golden` rebuilds it
from $LINGBOT_GOLDEN_DIR.
"""

import json
import re

import pytest
import torch

from tests.support.golden import (
    FIXTURE_JSON,
    FIXTURE_TENSORS,
    GOLDEN,
    PARITY_SETUP,
    PICKED_GRADS,
    PROVENANCE,
    batch_from_reference,
    golden_cases,
    model_cfg,
    reference_video_tokens,
    run_ours,
)
from trainer.config import RunConfig
from trainer.model import WorldModel, load_full
from trainer.model.weights import fields_from_config_json

pytestmark = pytest.mark.fast

RTOL = ATOL = 1e-4


def _fixture():
    from safetensors.torch import load_file

    if not FIXTURE_TENSORS.is_file():
        pytest.fail(f"{FIXTURE_TENSORS} is missing: run .venv/bin/python -m tests.support.golden")
    return json.loads(FIXTURE_JSON.read_text()), load_file(FIXTURE_TENSORS)


def _fixture_model(meta: dict, tensors: dict, actions_per_frame: int) -> WorldModel:
    cfg = RunConfig()
    cfg.model.attention = "sdpa"
    cfg.data.actions_per_frame = actions_per_frame
    for key, value in fields_from_config_json(meta["config_json"], FIXTURE_JSON).items():
        setattr(cfg.model, key, value)
    model = WorldModel(cfg)
    weights = {k[len("weight.") :]: v for k, v in tensors.items() if k.startswith("weight.")}
    model.load_state_dict(weights, strict=True)
    return model


def test_the_fixtures_provenance_is_reproducible_words_not_a_machines_folder():
    reference = json.loads(FIXTURE_JSON.read_text())["reference"]
    assert reference == PROVENANCE  # what tests/support/golden.py writes
    assert reference["commit"] == "58c2ae5" and "tests/support/reference_golden.py" in reference["command"]
    text = json.dumps(reference)
    assert not re.search(r"(?<![$\w])/(work|home|tmp|root|Users)/", text), text  # no absolute folder


@pytest.mark.parametrize("case", ["a", "b"])
def test_committed_golden_values(case):
    meta, tensors = _fixture()
    expected = meta["cases"][case]
    model = _fixture_model(meta, tensors, expected["actions_per_frame"])
    prefix = f"{case}.batch."
    batch = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    ours = run_ours(model, batch)
    for key in ("latent_loss", "action_loss"):
        torch.testing.assert_close(ours[key], torch.tensor(expected[key]), rtol=RTOL, atol=ATOL, msg=key)
    torch.testing.assert_close(
        ours["total_grad_norm"], torch.tensor(expected["total_grad_norm_preclip"]), rtol=RTOL, atol=ATOL
    )
    for name in ("video_tokens", "action_tokens"):
        torch.testing.assert_close(
            ours[name], tensors[f"{case}.expected.{name}"], rtol=RTOL, atol=ATOL, msg=name
        )
    for name in PICKED_GRADS:
        got = ours[f"grad.{name}"].norm()
        torch.testing.assert_close(
            got, torch.tensor(expected["grad_norms"][name]), rtol=RTOL, atol=ATOL, msg=name
        )


def test_committed_layout_is_the_released_naming():
    meta, tensors = _fixture()
    names = {k[len("weight.") :] for k in tensors if k.startswith("weight.")}
    assert (
        "blocks.1.ffn.net.0.proj.weight" in names
        and "condition_embedder_action.text_embedder.linear_2.bias" in names
    )
    assert meta["config_json"]["num_layers"] == 2 and len(names) == 29 + 2 * 27


@pytest.mark.skipif(
    GOLDEN is None or not (GOLDEN / "expected.json").is_file(),
    reason=f"no parity run: LINGBOT_GOLDEN_DIR is unset or has no expected.json ({PARITY_SETUP})",
)
@pytest.mark.parametrize("case", golden_cases() or ["none"])
def test_live_golden_with_every_gradient(case):
    from safetensors.torch import load_file

    assert GOLDEN is not None
    inputs = load_file(GOLDEN / f"inputs_{case}.safetensors")
    expected = load_file(GOLDEN / f"expected_{case}.safetensors")
    cfg = model_cfg(int(inputs["actions"].shape[3]), GOLDEN / "transformer")
    model = WorldModel(cfg)
    assert load_full(model, GOLDEN / "transformer") == []  # the reference's save_pretrained, strictly
    ours = run_ours(model, batch_from_reference(inputs, cfg.recipe))
    torch.testing.assert_close(ours["latent_loss"], expected["latent_loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours["action_loss"], expected["action_loss"], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(
        ours["video_tokens"],
        reference_video_tokens(expected["latent_pred_seq"], ours["video_tokens"].shape),
        rtol=RTOL,
        atol=ATOL,
    )
    torch.testing.assert_close(ours["action_tokens"], expected["action_pred_seq"], rtol=RTOL, atol=ATOL)
    ref_grads = {k[len("grad.") :]: v for k, v in expected.items() if k.startswith("grad.")}
    our_grads = {k[len("grad.") :]: v for k, v in ours.items() if k.startswith("grad.")}
    assert set(our_grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-4, atol=1e-5, msg=name)
