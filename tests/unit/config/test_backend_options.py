"""A generation backend owns the `actors` keys only it takes: vllm and sglang an engine's (EngineOptions), hf its
device (HFOptions), declared beside each backend in actors/backends/specs.py. They are written as they always
were (`actors.tensor_parallel_size=2`), parsed by the named backend's Struct, and refused where another backend
is named and they would do nothing; the launcher reads them through the capability each comes with."""

from __future__ import annotations

import pytest

from streamrl import config
from streamrl.actors.backends.specs import EngineOptions, HFOptions, options
from streamrl.config import ConfigError
from streamrl.registry import BACKENDS


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_an_engines_keys_parse_into_engine_options_for_vllm_and_sglang(backend):
    cfg = config.load(None, [f"actors.backend={backend}", "actors.tensor_parallel_size=2",
                             "actors.gpu_memory_fraction=0.4", "actors.update_bucket_bytes=40"])
    assert cfg.actors.options_for(BACKENDS) == EngineOptions(tensor_parallel_size=2, gpu_memory_fraction=0.4,
                                                             update_bucket_bytes=40)
    assert options(cfg.actors, EngineOptions).tensor_parallel_size == 2  # what the backend reads
    assert (cfg.actors.engine_gpus(), cfg.actors.engine_memory_fraction()) == (2, 0.4)  # what the launcher reads
    assert cfg.actors.tensor_parallel_size == 2  # read flat, as a file writes it
    written = config.to_dict(cfg)["actors"]
    assert (written["tensor_parallel_size"], written["update_bucket_bytes"]) == (2, 40) and "device" not in written
    assert config.load(None, config.overrides_for(cfg)) == cfg


def test_hfs_device_parses_into_hf_options():
    cfg = config.load(None, ["actors.device=cpu"])
    assert cfg.actors.options_for(BACKENDS) == HFOptions(device="cpu")
    assert cfg.actors.on_cpu() and not config.load(None, ["actors.device=cuda"]).actors.on_cpu()
    assert "tensor_parallel_size" not in config.to_dict(cfg)["actors"]


ENGINES, HF = "generation backend 'sglang', generation backend 'vllm'", "generation backend 'hf'"


@pytest.mark.parametrize("backend,key,owners,allowed", [
    ("hf", "tensor_parallel_size=2", ENGINES, "its default (1), or that plug-in named (actors.backend=sglang or vllm)"),
    ("hf", "gpu_memory_fraction=0.5", ENGINES,
     "its default (None), or that plug-in named (actors.backend=sglang or vllm)"),
    ("hf", "update_bucket_bytes=40", ENGINES,
     "its default (536870912), or that plug-in named (actors.backend=sglang or vllm)"),
    ("vllm", "device=cuda", HF, "its default ('auto'), or that plug-in named (actors.backend=hf)"),
    ("sglang", "device=cpu", HF, "its default ('auto'), or that plug-in named (actors.backend=hf)"),
])
def test_a_backends_key_set_while_another_backend_is_named_fails_naming_the_key_its_backend_and_what_is_allowed(
        backend, key, owners, allowed):
    with pytest.raises(ConfigError) as e:
        config.load(None, [f"actors.backend={backend}", f"actors.{key}"])
    msg = str(e.value)
    name, _, value = key.partition("=")
    assert msg.startswith(f"config error: actors.{name}=") and value in msg
    assert f"an option of {owners}, which this run does not name (actors names generation backend '{backend}')" in msg
    assert msg.endswith(f"it would do nothing. Allowed: {allowed}")


def test_a_backends_key_at_its_default_is_left_unread_while_another_backend_is_named():
    cfg = config.load(None, ["actors.backend=vllm", "actors.device=auto"])
    assert cfg.actors.options_for(BACKENDS) == EngineOptions()
    cfg = config.load(None, ["actors.tensor_parallel_size=1", "actors.gpu_memory_fraction=null"])
    assert cfg.actors.options_for(BACKENDS) == HFOptions()


def test_tensor_parallelism_is_refused_for_a_backend_without_the_capability():
    assert not BACKENDS.can("hf", "tensor_parallel")
    with pytest.raises(ConfigError, match=r"actors.tensor_parallel_size=4: an option of .*'vllm', which this run "
                                          r"does not name \(actors names generation backend 'hf'\)"):
        config.load(None, ["actors.tensor_parallel_size=4"])
    assert config.load(None, []).actors.engine_gpus() == 1  # hf generates on one GPU


def test_a_backend_built_beside_another_backends_run_reads_its_own_defaults():
    """`streamrl eval` comparisons build an hf sampler with a vLLM run's config: it must not read vLLM's keys."""
    vllm = config.load(None, ["actors.backend=vllm", "actors.tensor_parallel_size=2"]).actors
    assert options(vllm, HFOptions) == HFOptions() and options(vllm, EngineOptions).tensor_parallel_size == 2
    assert options(config.load(None, ["actors.device=cpu"]).actors, EngineOptions) == EngineOptions()
