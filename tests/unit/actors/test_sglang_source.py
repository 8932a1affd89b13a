"""The SGLang fake against SGLang's released source: a drift of any call the backend makes fails here.

SGLang cannot start without a GPU, and its wheel's dependencies pin CUDA builds, so the wheel is
read, never installed or imported: CI downloads it without dependencies (.ci/run:
`pip download --no-deps sglang==<SGLANG> -d build/wheels`) and this test parses its modules with
`ast`. Without the wheel it skips, unless STREAMRL_REQUIRE_ENGINE_SOURCES=1 (CI) makes that a failure.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import zipfile
from pathlib import Path

import pytest
from fakes import fake_sglang

REPO = Path(__file__).resolve().parents[3]
SGLANG = "0.5.23"  # the release this backend was written and checked against; pyproject's extra pins it


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    folder = Path(os.environ.get("STREAMRL_ENGINE_WHEELS", REPO / "build" / "wheels"))
    found = sorted(folder.glob(f"sglang-{SGLANG}-*.whl"))
    if not found:
        why = (f"no sglang-{SGLANG} wheel in {folder}; get it with "
               f"`pip download --no-deps sglang=={SGLANG} -d {folder}`")
        if os.environ.get("STREAMRL_REQUIRE_ENGINE_SOURCES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return zipfile.ZipFile(found[0])


def _module(wheel: zipfile.ZipFile, path: str) -> ast.Module:
    return ast.parse(wheel.read(path).decode())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _params(fn: ast.FunctionDef) -> list[tuple[str, str | None]]:
    """(name, default as source or None) for every parameter, in order, as inspect.signature lists them."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = list(zip([p.arg for p in positional], defaults))
    if a.vararg:
        out.append((a.vararg.arg, None))
    out += [(p.arg, None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, None))
    return out


def _fake_params(method) -> list[tuple[str, str | None]]:
    return [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in inspect.signature(method).parameters.values()]


def _strings(tree: ast.Module) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


ENGINE = "sglang/srt/entrypoints/engine.py"
USED = ("generate", "begin_weight_update", "end_weight_update", "update_weights_from_tensor", "shutdown",
        "init_weights_update_group", "update_weights_from_distributed")


def test_the_fakes_engine_methods_have_the_released_signatures(wheel):
    real = _methods(_class(_module(wheel, ENGINE), "Engine"))
    for name in USED:
        assert _fake_params(getattr(fake_sglang.Engine, name)) == _params(real[name]), name


def test_weight_calls_answer_a_status_the_engine_passes_through(wheel):
    engine = _methods(_class(_module(wheel, ENGINE), "Engine"))
    mixin = _module(wheel, "sglang/srt/managers/tokenizer_control_mixin.py")
    tokenizer = {n.name: n for n in ast.walk(mixin) if isinstance(n, ast.AsyncFunctionDef)}
    for name in ("begin_weight_update", "end_weight_update", "update_weights_from_tensor", "init_weights_update_group",
                 "update_weights_from_distributed"):
        # Engine.<name> returns self.loop.run_until_complete(self.tokenizer_manager.<name>(obj, None)) ...
        assert f"self.tokenizer_manager.{name}(obj, None)" in ast.unparse(engine[name]), name
        # ... which is a (success, message) tuple, never an exception
        assert ast.unparse(tokenizer[name].returns) == "Tuple[bool, str]", name


def test_updates_outside_a_session_are_refused_with_the_fakes_messages(wheel):
    updater = _module(wheel, "sglang/srt/managers/scheduler_components/weight_updater.py")
    messages = _strings(updater)
    fake = fake_sglang.Engine()
    refused = [fake.update_weights_from_tensor(named_tensors=[]), fake.end_weight_update(),
               fake.update_weights_from_distributed(names=[], dtypes=[], shapes=[])]
    fake.begin_weight_update()
    refused.append(fake.begin_weight_update())
    for success, message in refused:
        assert not success and message in messages, message
    # the refusal is a check of the session, in the method the tensor update reaches
    source = ast.unparse(next(n for n in ast.walk(updater)
                              if isinstance(n, ast.FunctionDef) and n.name == "update_weights_from_tensor"))
    assert re.search(r"if self\._session is None:\s+return UpdateWeightsFromTensorReqOutput\(success=False", source)


def test_the_engine_arguments_the_backend_passes_are_server_args(wheel, monkeypatch):
    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.models import model

    engine_cls = fake_sglang.install(monkeypatch)
    cfg = config.load(None, ["actors.backend=sglang"])
    build("sglang", cfg, *model.build(cfg))
    # ServerArgs is assembled from the field namespaces in sglang/srt/arg_groups/fields/
    fields = {n.target.id for path in wheel.namelist() if re.fullmatch(r"sglang/srt/arg_groups/fields/\w+\.py", path)
              for cls in ast.walk(_module(wheel, path)) if isinstance(cls, ast.ClassDef)
              for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {"model_path", "tp_size", "random_seed"} <= fields  # the namespaces were found
    assert set(engine_cls.instances[-1].kwargs) <= fields


def test_the_log_prob_setting_the_backend_refuses_is_sglangs(wheel):
    sampler = _module(wheel, "sglang/srt/layers/sampler.py")
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" in _strings(sampler)


def test_pyproject_pins_the_checked_release():
    text = (REPO / "pyproject.toml").read_text()
    assert f'sglang = ["sglang=={SGLANG}"]' in text


LORA_USED = ("load_lora_adapter_from_tensors", "unload_lora_adapter")


def test_the_fakes_lora_methods_and_answer_have_the_released_shapes(wheel):
    real = _methods(_class(_module(wheel, ENGINE), "Engine"))
    for name in LORA_USED:
        assert _fake_params(getattr(fake_sglang.Engine, name)) == _params(real[name]), name
    # both return the tokenizer manager's LoRAUpdateOutput (success, error_message, loaded_adapters), never raise
    io = _class(_module(wheel, "sglang/srt/managers/io_struct.py"), "LoRAUpdateOutput")
    fields = [n.target.id for n in io.body if isinstance(n, ast.AnnAssign)]
    assert fields == list(inspect.signature(fake_sglang.LoRAUpdateOutput).parameters)
    mixin = _module(wheel, "sglang/srt/managers/tokenizer_control_mixin.py")
    source = ast.unparse(next(n for n in ast.walk(mixin) if isinstance(n, ast.AsyncFunctionDef)
                              and n.name == "load_lora_adapter_from_tensors"))
    assert "except ValueError as e:" in source and "success=False" in source
    assert "LoRA is not enabled. Please set `--enable-lora` to enable LoRA." in _strings(mixin)
    # generate takes the adapter's name per request
    assert ("lora_path", "None") in _params(real["generate"])


def test_the_lora_engine_arguments_the_backend_passes_are_server_args(wheel, monkeypatch):
    from streamrl import config
    from streamrl.actors.backends import build
    from streamrl.models import model

    engine_cls = fake_sglang.install(monkeypatch)
    cfg = config.load(None, ["actors.backend=sglang", "lora.rank=8"])
    build("sglang", cfg, *model.build(cfg))
    lora_fields = {n.target.id for n in ast.walk(_module(wheel, "sglang/srt/arg_groups/fields/lora.py"))
                   if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    used = {k for k in engine_cls.instances[-1].kwargs if "lora" in k}
    assert used == {"enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch"} <= lora_fields


def test_the_collective_group_and_buckets_are_formed_and_received_as_sglangs_worker_does(wheel):
    """What the learner's end (named_group) and the fake both do, in SGLang's own source: the group's rendezvous and
    prefix, the worker's rank, one uint8 broadcast per flattened bucket, and the messages the fake answers with."""
    common = ast.unparse(next(n for n in ast.walk(_module(wheel, "sglang/srt/utils/common.py"))
                              if isinstance(n, ast.FunctionDef) and n.name == "init_custom_process_group"))
    for step in ("rendezvous(init_method, rank, world_size, timeout=timeout)", "store = PrefixStore(group_name, store)",
                 "_new_process_group_helper(world_size, rank, [], backend, store, group_name=group_name",
                 "_world.pg_group_ranks[pg] = {i: i for i in range(world_size)}"):
        assert step in common, step
    runner = _module(wheel, "sglang/srt/model_executor/model_runner_components/weight_updater.py")
    updater = ast.unparse(runner)
    assert "rank = rank_offset + self.tp_rank" in updater and "init_method=na.to_tcp()" in updater
    assert "if load_format == 'flattened_bucket':" in updater
    assert "bucket = FlattenedTensorBucket.empty(names, dtypes, shapes, self.device)" in updater
    assert "torch.distributed.broadcast(flattened_tensor, src=0, group=self._model_update_group[group_name])" in updater
    bucket = ast.unparse(_module(wheel, "sglang/srt/weight_sync/tensor_bucket.py"))
    assert "flattened_tensor=torch.empty(offset, dtype=torch.uint8, device=device)" in bucket
    messages = _strings(runner) | _strings(_module(wheel, "sglang/srt/managers/scheduler_components/weight_updater.py"))
    assert {"Succeeded to initialize custom process group.", "Succeeded to update parameter online."} <= messages
    scheduler = ast.unparse(_module(wheel, "sglang/srt/managers/scheduler_components/weight_updater.py"))
    assert "success, message = (False, f'Failed to receive weights: {e}')" in scheduler


def test_tensors_given_to_update_weights_from_tensor_reach_the_workers_by_torchs_own_sharing(wheel):
    """weight_sync=ipc hands the engine CUDA tensors (receive_weight_ipc): SGLang pickles them for each tensor-parallel
    rank with torch's ForkingPickler, which shares a CUDA tensor by CUDA IPC rather than copying it through the host
    (and refuses one this process received over IPC itself: the backend sends fresh copies)."""
    engine = ast.unparse(_module(wheel, "sglang/srt/entrypoints/engine.py"))
    assert "serialized_named_tensors = self._serialize_tensors_per_rank(named_tensors, load_format)" in engine
    assert "return [MultiprocessingSerializer.serialize(tensors) for _ in range(get_parallel().tp_size)]" in engine
    common = ast.unparse(_module(wheel, "sglang/srt/utils/common.py"))
    assert "ForkingPickler(buf).dump(obj)" in common
