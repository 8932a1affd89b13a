"""Checkpoints are complete or never chosen; RNG state survives a resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.learner import checkpoints


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
    from streamrl.run import checkpoints as reader

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
    from streamrl.run import checkpoints as reader

    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        reader.checkpoint_of(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        reader.run_dir_of(tmp_path)


def test_load_policy_rebuilds_the_trained_model_from_a_run_directory(tmp_path):
    from streamrl import config
    from streamrl.models import model as model_lib
    from streamrl.run import checkpoints as reader

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


def _torch_model_states(directory: str, tag: str) -> None:
    """Stands in for DeepSpeed's save_checkpoint with a real PyTorch file (a zip archive), as DeepSpeed writes."""
    d = Path(directory) / tag
    d.mkdir(parents=True, exist_ok=True)
    torch.save({"module": {"w": torch.zeros(64)}}, d / "mp_rank_00_model_states.pt")


class _Engine:
    """Records which tags were loaded; DeepSpeed's own load is what test_fault_tolerance exercises."""

    def __init__(self, fail_on=()):
        self.loaded, self.fail_on = [], set(fail_on)

    def load(self, directory: str, tag: str) -> None:
        if tag in self.fail_on:
            raise RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")
        self.loaded.append(tag)


def _two_checkpoints(tmp_path):
    for step in (3, 6):
        checkpoints.save(tmp_path, f"step-{step}", _torch_model_states, {"step": step, "version": step},
                         {"w": torch.full((256,), float(step))})


@pytest.mark.parametrize("damage", ["truncated_policy", "truncated_model_states", "missing_model_states",
                                    "deepspeed_cannot_load"])
def test_resume_skips_a_damaged_checkpoint_names_the_file_and_falls_back(tmp_path, damage, caplog):
    _two_checkpoints(tmp_path)
    bad = tmp_path / "step-6"
    if damage == "truncated_policy":
        data = (bad / checkpoints.POLICY).read_bytes()
        (bad / checkpoints.POLICY).write_bytes(data[: len(data) // 2])
        named = bad / checkpoints.POLICY
    elif damage == "truncated_model_states":
        data = (bad / "mp_rank_00_model_states.pt").read_bytes()
        (bad / "mp_rank_00_model_states.pt").write_bytes(data[:100])
        named = bad / "mp_rank_00_model_states.pt"
    elif damage == "missing_model_states":
        (bad / "mp_rank_00_model_states.pt").unlink()
        named = bad
    else:
        named = bad
    engine = _Engine(fail_on={"step-6"} if damage == "deepspeed_cannot_load" else ())
    with caplog.at_level("WARNING"):
        tag, state = checkpoints.resume(engine, tmp_path)
    assert (tag, state["step"], engine.loaded) == ("step-3", 3, ["step-3"])
    assert f"skipping step-6: {named}" in caplog.text


def test_resume_refuses_to_start_afresh_when_no_checkpoint_is_usable(tmp_path):
    _two_checkpoints(tmp_path)
    for tag in ("step-3", "step-6"):
        (tmp_path / tag / "mp_rank_00_model_states.pt").write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="no usable checkpoint.*step-6.*step-3"):
        checkpoints.resume(_Engine(), tmp_path)
    assert checkpoints.resume(_Engine(), tmp_path / "none") is None  # no checkpoint at all: a fresh start


def test_a_full_disk_during_a_save_removes_the_partial_checkpoint_and_says_so(tmp_path):
    from streamrl.run import storage

    checkpoints.save(tmp_path, "step-1", _torch_model_states, {"step": 1, "version": 1}, {"w": torch.zeros(2)})

    def disk_fills(directory: str, tag: str) -> None:  # what torch.save says when the disk fills mid-file
        _torch_model_states(directory, tag)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 896") from \
            OSError(28, "No space left on device")

    with pytest.raises(storage.DiskFull) as e:
        checkpoints.save(tmp_path, "step-2", disk_fills, {"step": 2, "version": 2}, {"w": torch.ones(2)})
    message = str(e.value)
    assert message.startswith("disk full (No space left on device) writing checkpoint")
    assert str(tmp_path / "step-2") in message and "newest complete one is step-1" in message
    assert not (tmp_path / "step-2").exists() and checkpoints.newest_complete(tmp_path)[0] == "step-1"


def test_a_truncated_policy_file_is_a_one_line_error_that_names_it(tmp_path):
    from streamrl.run import checkpoints as reader

    checkpoints.save(tmp_path, "step-1", write_model, {"step": 1, "version": 1}, {"w": torch.zeros(64)})
    policy = tmp_path / "step-1" / checkpoints.POLICY
    policy.write_bytes(policy.read_bytes()[:-10])
    with pytest.raises(ValueError, match=f"{policy}: truncated"):
        reader.load_weights(torch.nn.Linear(1, 1), policy)


# Checkpoints carry a manifest of SHA-256 sums, written last; resume, eval and export check it and fall back.

def _run_with_two_checkpoints(tmp_path, extra=None):
    """A run directory (config.yaml of a small model) with complete checkpoints at steps 3 and 6, the weights of
    each different, as the learner writes them (DeepSpeed's file stood in for by a real PyTorch zip)."""
    from streamrl import config
    from streamrl.models import model as model_lib

    cfg = config.load(None, ["model.hidden_size=16", "model.intermediate_size=16", "eval.prompts=2",
                             "eval.samples=1", "eval.ks=[1]"])
    (tmp_path / "config.yaml").write_text(config.dump(cfg))
    trained, _ = model_lib.build(cfg)
    for step in (3, 6):
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(0.01 * step)
        checkpoints.save(tmp_path / "checkpoints", f"step-{step}", _torch_model_states,
                         {"step": step, "version": step}, trained.state_dict(), extra)
    return tmp_path / "checkpoints"


def _flip_a_byte_of_tensor_data(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x20  # the last tensor's bytes: the header and the length still check out
    path.write_bytes(bytes(data))


def test_every_file_of_a_checkpoint_is_in_its_manifest_written_after_streamrl_json(tmp_path):
    from streamrl.run import manifest

    ckpts = _run_with_two_checkpoints(tmp_path, extra=lambda folder: (folder / "data_cursor.json").write_text("{}"))
    files = json.loads((ckpts / "step-6" / manifest.MANIFEST).read_text())["files"]
    assert set(files) == {checkpoints.POLICY, checkpoints.STATE, "data_cursor.json", "mp_rank_00_model_states.pt"}
    assert files[checkpoints.POLICY]["sha256"] == manifest.sha256(ckpts / "step-6" / checkpoints.POLICY)
    assert json.loads((ckpts / "step-6" / checkpoints.STATE).read_text())["manifest"] == manifest.MANIFEST


def test_a_flipped_byte_of_tensor_data_makes_resume_eval_and_export_fall_back_naming_the_file(tmp_path, caplog):
    from streamrl.commands import cli
    from streamrl.run import checkpoints as reader
    from streamrl.run import export

    ckpts = _run_with_two_checkpoints(tmp_path)
    bad = ckpts / "step-6" / checkpoints.POLICY
    _flip_a_byte_of_tensor_data(bad)
    assert reader.policy_problem(bad) is None  # whole by its header and length: only the sums see it
    named = f"skipping step-6: {bad}: its SHA-256 differs from the manifest's"
    with caplog.at_level("WARNING"):
        tag, state = checkpoints.resume(_Engine(), ckpts)
    assert (tag, state["step"]) == ("step-3", 3) and named in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert reader.checkpoint_of(tmp_path) == ckpts / "step-3" / checkpoints.POLICY  # what eval and uplift load
        assert cli.main(["eval", str(tmp_path)]) == 0
    assert named in caplog.text and "using step-3" in caplog.text
    assert json.loads((tmp_path / "eval.json").read_text())["step"] == 3
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert export.export(tmp_path, tmp_path / "out").step == 3
    assert named in caplog.text
    with pytest.raises(export.ExportError, match="SHA-256 differs"):  # the damaged one asked for by name: refused
        export.export(tmp_path, tmp_path / "out6", step=6)
    with pytest.raises(ValueError, match="SHA-256 differs"):
        reader.checkpoint_of(ckpts / "step-6")


@pytest.mark.parametrize("manifest_too", [True, False], ids=["with_manifest", "older_checkpoint_without"])
def test_a_truncated_data_cursor_in_the_newest_checkpoint_makes_resume_fall_back(tmp_path, caplog, manifest_too):
    from streamrl.run import manifest

    ckpts = _run_with_two_checkpoints(tmp_path, extra=lambda f: (f / "data_cursor.json").write_text('{"epoch": 0}'))
    cursor = ckpts / "step-6" / "data_cursor.json"
    cursor.write_text('{"epo')
    if not manifest_too:  # as an older version wrote it: no manifest, the JSON check still sees it
        for step in (3, 6):
            state = json.loads((ckpts / f"step-{step}" / checkpoints.STATE).read_text())
            del state["manifest"]
            (ckpts / f"step-{step}" / checkpoints.STATE).write_text(json.dumps(state))
            (ckpts / f"step-{step}" / manifest.MANIFEST).unlink()
    with caplog.at_level("WARNING"):
        tag, _ = checkpoints.resume(_Engine(), ckpts)
    assert tag == "step-3" and f"skipping step-6: {cursor}" in caplog.text
    assert ("before checkpoints carried a manifest" in caplog.text) == (not manifest_too)


def test_a_checkpoint_whose_manifest_never_got_written_is_skipped_and_one_from_before_manifests_accepted(tmp_path,
                                                                                                        caplog):
    from streamrl.run import manifest

    ckpts = _run_with_two_checkpoints(tmp_path)
    (ckpts / "step-6" / manifest.MANIFEST).unlink()  # the learner stopped between streamrl.json and the manifest
    with caplog.at_level("WARNING"):
        assert checkpoints.resume(_Engine(), ckpts)[0] == "step-3"
    assert f"skipping step-6: {ckpts / 'step-6' / manifest.MANIFEST}: missing" in caplog.text
    state = json.loads((ckpts / "step-6" / checkpoints.STATE).read_text())
    del state["manifest"]  # an older version's checkpoint: accepted, said
    (ckpts / "step-6" / checkpoints.STATE).write_text(json.dumps(state))
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert checkpoints.resume(_Engine(), ckpts)[0] == "step-6"
    assert "step-6 was written before checkpoints carried a manifest" in caplog.text
