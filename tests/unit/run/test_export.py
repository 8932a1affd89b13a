"""`streamrl export` on run directories laid out as the learner leaves them (config.yaml, checkpoints/<tag>/ with
policy.safetensors and streamrl.json, `latest`): which checkpoint it picks, the folder it writes (shards, index,
config, tokenizer), that transformers loads it with the learner's logits, and its one-line errors.
A real run's checkpoint, and a release-shaped one, are exported in tests/integration/test_export_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from streamrl import config
from streamrl.commands import cli
from streamrl.models import hf_folder, model
from streamrl.run import export


def _checkpoint(run: Path, step: int, m, complete: bool = True) -> Path:
    folder = run / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    save_file({k: v.contiguous().clone() for k, v in m.state_dict().items()}, str(folder / "policy.safetensors"))
    if complete:
        (folder / "streamrl.json").write_text(json.dumps({"step": step, "version": step}))
        (run / "checkpoints" / "latest").write_text(f"step-{step}")
    return folder


@pytest.fixture
def run(tmp_path):
    """A tiny run with checkpoints at steps 2 and 4 (different weights), `latest` at 4."""
    cfg = config.load(None, ["seed=3"])
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config.dump(cfg))
    m, _ = model.build(cfg)
    _checkpoint(run, 2, m)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _checkpoint(run, 4, m)
    return run


def _logits(m, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return m(torch.tensor([ids])).logits.float()


def _learners(run: Path, step: int):
    from streamrl.run import checkpoints

    m, tok = checkpoints.load_policy(None, run / "checkpoints" / f"step-{step}")
    return m, tok


@pytest.mark.parametrize("step", [None, 2])
def test_the_folder_loads_in_transformers_with_the_learners_logits_for_the_chosen_step(run, tmp_path, step):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    done = export.export(run, tmp_path / "out", step=step)
    want = 4 if step is None else step
    assert done.step == want and done.checkpoint.name == f"step-{want}" and done.kind == "tiny"
    learner, tok = _learners(run, want)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "copy : a b c d ="
    ids = tok(text)["input_ids"]
    assert hf_tok(text)["input_ids"] == ids
    # a chat request reaches the model as the raw prompt streamrl trained it on
    assert hf_tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                      add_generation_prompt=True) == text
    assert (_logits(hf, ids) - _logits(learner, ids)).abs().max() <= 1e-5
    gen = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (tok.eos_token_id, tok.pad_token_id)


def test_a_small_shard_size_splits_the_weights_and_the_index_maps_every_tensor(run, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    done = export.export(run, tmp_path / "out", max_shard_bytes=40_000)
    out = tmp_path / "out"
    index = json.loads((out / hf_folder.INDEX).read_text())
    assert len(done.shards) > 2 and sorted(set(index["weight_map"].values())) == done.shards
    n = len(done.shards)
    assert done.shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    held = {}
    for shard in done.shards:
        with safe_open(str(out / shard), "pt") as f:
            held.update({k: shard for k in f.keys()})
    assert held == index["weight_map"]
    state = _learners(run, 4)[0].state_dict()
    assert set(held) == set(state) and index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in state.values())
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_a_tied_output_layer_is_left_out_of_the_shards(tmp_path):
    tensors = {"model.embed_tokens.weight": torch.ones(3, 2), "lm_head.weight": torch.ones(3, 2)}
    files = hf_folder.write_weights(tmp_path, tensors, tied=True)
    assert json.loads((tmp_path / hf_folder.INDEX).read_text())["weight_map"] == {"model.embed_tokens.weight": files[0]}


def test_a_release_folder_is_copied_but_its_weights_and_config_records_the_trained_dtype(tmp_path):
    src = tmp_path / "release"
    src.mkdir()
    for name, text in [("config.json", '{"torch_dtype": "bfloat16", "tie_word_embeddings": true}'),
                       ("tokenizer_config.json", '{"chat_template": "{{ x }}"}'), ("LICENSE", "Apache-2.0"),
                       ("model.safetensors", "old weights"), (hf_folder.INDEX, "{}"), ("pytorch_model.bin", "old")]:
        (src / name).write_text(text)
    copied = hf_folder.copy_release_files(src, tmp_path / "out", "float32")
    assert copied == ["LICENSE", "config.json", "tokenizer_config.json"]
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {
        "dtype": "float32", "torch_dtype": "float32", "tie_word_embeddings": True}
    assert hf_folder.tied_output_layer(tmp_path / "out")


def test_no_checkpoint_is_a_clear_error(tmp_path):
    run = tmp_path / "runs" / "empty"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config.dump(config.load(None)))
    with pytest.raises(export.ExportError, match=r"checkpoints: no complete checkpoint .*checkpoint_every"):
        export.export(run, tmp_path / "out")
    with pytest.raises(export.ExportError, match="not a run directory"):
        export.export(tmp_path, tmp_path / "out")
    with pytest.raises(export.ExportError, match="no such run directory"):
        export.export(tmp_path / "nowhere", tmp_path / "out")


def test_an_incomplete_checkpoint_is_named_and_never_exported(run, tmp_path):
    _checkpoint(run, 6, _learners(run, 4)[0], complete=False)
    # the newest complete one is still step 4
    assert export.checkpoint_folder(run).name == "step-4"
    with pytest.raises(export.ExportError, match=r"step-6: incomplete checkpoint \(no streamrl.json"):
        export.export(run, tmp_path / "out", step=6)
    with pytest.raises(export.ExportError, match=r"step-6: incomplete checkpoint"):
        export.export(run / "checkpoints" / "step-6", tmp_path / "out")
    with pytest.raises(export.ExportError, match=r"no checkpoint at step 5; complete ones: 2, 4"):
        export.export(run, tmp_path / "out", step=5)
    assert not (tmp_path / "out").exists()


def test_a_truncated_policy_file_is_named_and_the_one_before_exported_unless_asked_for_by_step(run, tmp_path, caplog):
    policy = run / "checkpoints" / "step-4" / "policy.safetensors"
    policy.write_bytes(policy.read_bytes()[:-100])
    with pytest.raises(export.ExportError, match=r"step-4/policy.safetensors: truncated .* export an earlier one"):
        export.export(run, tmp_path / "out", step=4)
    assert not (tmp_path / "out").exists()
    with caplog.at_level("WARNING"):
        assert export.export(run, tmp_path / "out").step == 2  # the newest, damaged: passed over, said
    assert "skipping step-4: " in caplog.text and "step-4/policy.safetensors: truncated" in caplog.text


def test_an_existing_out_is_refused_and_left_alone(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(export.ExportError, match=r"out: already exists; give a new folder"):
        export.export(run, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_failed_export_leaves_nothing_behind(run, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_folder, "write_weights", broken)
    with pytest.raises(OSError, match="No space left"):
        export.export(run, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("text,size", [("5GB", 5 * 10**9), ("200MB", 200 * 10**6), ("64MiB", 64 * 2**20),
                                       ("1000", 1000), ("1.5kb", 1500)])
def test_shard_sizes_read_like_transformers(text, size):
    assert export.parse_size(text) == size


def test_the_command_writes_the_folder_and_says_where(run, tmp_path, capsys):
    assert cli.main(["export", str(run), str(tmp_path / "out"), "--step", "2"]) == 0
    said = capsys.readouterr().out
    assert "wrote step 2 (tiny model" in said and "from_pretrained" in said
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize("argv,message", [
    (["--step", "9"], "no checkpoint at step 9"),
    (["--max-shard-size", "big"], "--max-shard-size='big': give a size like 5GB"),
])
def test_the_command_prints_one_line_and_exits_2_on_bad_input(run, tmp_path, capsys, argv, message):
    assert cli.main(["export", str(run), str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("streamrl export: error:") and len(err.strip().splitlines()) == 1
