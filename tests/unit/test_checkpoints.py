"""Checkpoints are complete or never chosen; RNG state survives a resume."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from learner import checkpoints


def write_model(directory: str, tag: str) -> None:
    """Stands in for DeepSpeed's save_checkpoint: the files of one tag."""
    d = Path(directory) / tag
    d.mkdir(parents=True, exist_ok=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"weights")


def crash(directory: str, tag: str) -> None:
    write_model(directory, tag)  # DeepSpeed's files land, then the process dies before streamrl's state
    raise KeyboardInterrupt("killed mid-save")


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert checkpoints.newest_complete(tmp_path / "checkpoints") is None


def test_a_crash_during_a_save_leaves_latest_on_the_previous_complete_checkpoint(tmp_path):
    checkpoints.save(tmp_path, "step-10", write_model, {"step": 10, "version": 10})
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(tmp_path, "step-20", crash, {"step": 20, "version": 20})
    assert (tmp_path / "latest").read_text() == "step-10"
    tag, state = checkpoints.newest_complete(tmp_path)
    assert (tag, state["step"], state["version"]) == ("step-10", 10, 10)


@pytest.mark.parametrize("latest", ["", "step-20", "step-99", None])
def test_a_latest_that_names_no_complete_checkpoint_falls_back_to_the_newest_complete_one(tmp_path, latest):
    checkpoints.save(tmp_path, "step-5", write_model, {"step": 5, "version": 5})
    checkpoints.save(tmp_path, "step-10", write_model, {"step": 10, "version": 10})
    write_model(str(tmp_path), "step-20")  # half-written: no streamrl.json
    if latest is None:
        (tmp_path / "latest").unlink()
    else:
        (tmp_path / "latest").write_text(latest)  # empty (torn write), incomplete, or dangling
    assert checkpoints.newest_complete(tmp_path)[0] == "step-10"


def test_a_corrupt_state_file_makes_its_checkpoint_incomplete(tmp_path):
    checkpoints.save(tmp_path, "step-1", write_model, {"step": 1, "version": 1})
    checkpoints.save(tmp_path, "step-2", write_model, {"step": 2, "version": 2})
    (tmp_path / "step-2" / checkpoints.STATE).write_text('{"step": 2, "vers')
    assert checkpoints.newest_complete(tmp_path)[0] == "step-1"


def test_rng_states_round_trip_through_the_checkpoint(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    checkpoints.save(tmp_path, "step-1", write_model, {"step": 1, "version": 1})
    expected = (torch.rand(3).tolist(), random.random(), np.random.rand())
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    checkpoints.restore_rng(checkpoints.newest_complete(tmp_path)[1]["rng"])
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == expected


def test_a_checkpoint_carries_policy_weights_that_load_without_deepspeed(tmp_path):
    from streamrl import checkpoints as reader

    weights = {"a.weight": torch.randn(3, 2), "b.bias": torch.arange(4.0)}
    weights["tied"] = weights["a.weight"]  # shares memory, as tied embeddings do
    checkpoints.save(tmp_path / "checkpoints", "step-3", write_model, {"step": 3, "version": 3}, weights)
    path = reader.checkpoint_of(tmp_path)  # a run dir: the newest complete checkpoint
    assert path == tmp_path / "checkpoints" / "step-3" / checkpoints.POLICY
    assert reader.checkpoint_of(path.parent) == path  # a checkpoint tag folder
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_a_crash_while_writing_policy_weights_leaves_the_checkpoint_incomplete(tmp_path, monkeypatch):
    checkpoints.save(tmp_path, "step-1", write_model, {"step": 1, "version": 1}, {"w": torch.zeros(2)})

    def die(path, tensors):
        raise KeyboardInterrupt("killed while writing weights")

    monkeypatch.setattr(checkpoints, "write_policy", die)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(tmp_path, "step-2", write_model, {"step": 2, "version": 2}, {"w": torch.ones(2)})
    assert checkpoints.newest_complete(tmp_path)[0] == "step-1"
    assert not (tmp_path / "step-2" / checkpoints.STATE).exists()


def test_a_path_with_no_checkpoint_is_a_clear_error(tmp_path):
    from streamrl import checkpoints as reader

    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        reader.checkpoint_of(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        reader.run_dir_of(tmp_path)


def test_load_policy_rebuilds_the_trained_model_from_a_run_directory(tmp_path):
    from streamrl import checkpoints as reader
    from streamrl import config
    from streamrl import model as model_lib

    cfg = config.load(None, ["model.hidden_size=16", "model.intermediate_size=16"])
    (tmp_path / "config.yaml").write_text(config.dump(cfg))
    trained, _ = model_lib.build(cfg)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # anything but the seeded initial weights
    checkpoints.save(tmp_path / "checkpoints", "step-1", write_model, {"step": 1, "version": 1}, trained.state_dict())
    model, tokenizer = reader.load_policy(None, tmp_path)  # None: the run's config.yaml
    assert len(tokenizer) == model_lib.vocab_size(model)
    got, want = model.state_dict(), trained.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
