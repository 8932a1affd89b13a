"""streamrl.config: every shipped YAML loads, overrides apply, errors say key/value/allowed."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import msgspec
import pytest

from streamrl import config, registry
from streamrl.config import ConfigError, from_dict, load, to_dict

REPO = Path(__file__).resolve().parents[3]
CONFIG_FILES = sorted((REPO / "configs").rglob("*.yaml"))


def test_the_configs_folder_holds_yaml_files():
    assert config.DEFAULT_CONFIG in CONFIG_FILES


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_shipped_config_loads(path):
    cfg = load(path)
    assert isinstance(cfg, config.Config)
    # and survives the round trip `streamrl run` uses to hand it to child processes
    assert load(None, config.overrides_for(cfg)) == cfg


def test_the_defaults_are_the_tiny_job():
    assert config.to_dict(load(config.DEFAULT_CONFIG)) == config.to_dict(load(None))
    assert load(config.DEFAULT_CONFIG) == load(None)


def test_defaults_are_corpo_async_with_bounded_staleness():
    cfg = load(None)
    assert cfg.advantage.estimator == "corpo"
    assert cfg.on_policy == "async" and not cfg.strict
    assert cfg.max_staleness == 2
    assert cfg.transport.host == "127.0.0.1"
    assert cfg.model.path is None


def test_overrides_apply():
    cfg = load(None, ["advantage.estimator=grpo", "max_staleness=1", "learner.batch_groups=8"])
    assert cfg.advantage.estimator == "grpo"
    assert cfg.max_staleness == 1 and cfg.learner.batch_groups == 8


def test_strict_resolves_the_staleness_bound_to_zero_once_for_every_reader():
    cfg = load(None, ["on_policy=strict", "max_staleness=1"])
    assert cfg.on_policy == "strict" and cfg.strict
    assert cfg.max_staleness == 0  # strict means lag 0 whatever max_staleness says; gate, throttle and gauge read it
    assert from_dict(to_dict(cfg)).max_staleness == 0  # the run's saved config says the same


def test_overrides_apply_on_top_of_a_file_and_keep_its_other_values(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: mine\nactors:\n  group_size: 4\n  num: 3\n")
    cfg = load(f, ["actors.group_size=6", "optim.betas=[0.5, 0.6]", "model.path=null"])
    assert cfg.name == "mine" and cfg.actors.num == 3 and cfg.actors.group_size == 6
    assert cfg.optim.betas == (0.5, 0.6)


def test_a_bare_yaml_on_or_off_reads_as_the_mode_it_names(tmp_path):
    """YAML 1.1 reads `on`/`off` as booleans: transport's on/off/auto switches take them as their words."""
    f = tmp_path / "c.yaml"
    f.write_text("transport:\n  weights_delta: on\n  weights_host_copy: off\n")
    t = load(f, []).transport
    assert (t.weights_delta, t.weights_host_copy) == ("on", "off")
    assert load(None, []).transport.weights_host_copy == "auto"


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(None, list(overrides))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_a_bad_key_names_the_key_and_the_valid_keys():
    msg = _error("advantage.estimatr=grpo")
    assert "advantage.estimatr" in msg
    assert "did you mean 'advantage.estimator'" in msg
    assert "estimator, r_min_correct, std_normalize" in msg


def test_a_bad_top_level_key_lists_the_top_level_keys():
    msg = _error("stepz=3")
    assert "'stepz'" in msg and "steps" in msg and "max_staleness" in msg


def test_a_bad_value_type_names_key_value_and_allowed():
    msg = _error("steps=abc")
    assert "steps='abc'" in msg
    assert "allowed: int > 0" in msg


def test_an_out_of_range_value_names_key_value_and_allowed():
    msg = _error("actors.group_size=1")
    assert "actors.group_size=1" in msg
    assert "allowed: int ≥ 2" in msg
    msg = _error("loss.clip_low=1.5")
    assert "loss.clip_low=1.5" in msg and "allowed: float ≥ 0 and < 1" in msg


def test_a_bad_enum_names_key_value_and_allowed():
    msg = _error("on_policy=sometimes")
    assert "on_policy='sometimes'" in msg and "async, strict" in msg
    msg = _error("actors.backend=tgi")
    assert "actors.backend='tgi'" in msg and "allowed: hf" in msg


def test_a_bad_estimator_name_names_key_value_and_allowed():
    msg = _error("advantage.estimator=ppo")
    assert "advantage.estimator='ppo'" in msg
    assert "corpo, grpo, static" in msg


def test_a_bad_task_or_loss_name_names_key_value_and_allowed():
    msg = _error("task.name=sort")
    assert "task.name='sort'" in msg and "code_verifier, copy, dataset, lookup, math, openenv, reasoning_gym, repeat_first, reverse, skyrl_gym" in msg
    msg = _error("loss.name=dpo")
    assert "loss.name='dpo'" in msg and "token_pg" in msg


def test_a_value_for_a_section_is_refused():
    msg = _error("learner=3")
    assert "'learner'" in msg and "section" in msg and "batch_groups" in msg


def test_strict_mode_requires_publishing_every_step():
    msg = _error("on_policy=strict", "learner.publish_every=2")
    assert "learner.publish_every=2" in msg and "strict" in msg


def test_inflight_updates_are_refused_in_strict_mode_and_on_backends_that_cannot_pause():
    assert "strict forbids it" in _error("on_policy=strict", "actors.inflight_updates=true")
    assert "need actors.backend=hf or vllm" in _error("actors.backend=sglang", "actors.inflight_updates=true")
    assert load(None, ["actors.backend=vllm", "actors.inflight_updates=true"]).actors.inflight_updates
    assert load(None, ["actors.inflight_updates=true"]).actors.inflight_updates


def test_num_heads_must_divide_hidden_size_and_the_error_names_the_key_typed():
    msg = _error("model.num_heads=3")
    assert "model.num_heads=3" in msg and "hidden_size (64)" in msg


def test_an_override_that_is_not_key_value_is_refused():
    assert "not key=value" in _error("estimator")
    assert "not key=value" in _error("=3")


def test_a_missing_or_malformed_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(broken)


def _section_classes(tree: ast.Module) -> list[ast.ClassDef]:
    sections = {"_Section", "PluginSection", "Options"}  # config sections, and plug-ins' options (streamrl.registry)
    found = []
    for node in tree.body:  # in source order, so subclasses of subclasses count too
        if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in sections for b in node.bases):
            sections.add(node.name)
            found.append(node)
    return found


def _undocumented_fields(source: str) -> list[str]:
    tree = ast.parse(source)
    missing = []
    for cls in _section_classes(tree):
        body = cls.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                ok = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                      and isinstance(nxt.value.value, str) and nxt.value.value.strip()
                      and "\n" not in nxt.value.value.strip())
                if not ok:
                    missing.append(f"{cls.name}.{stmt.target.id}")
    return missing


def test_the_docstring_checker_catches_a_missing_docstring():
    src = ("class _Section: pass\nclass A(_Section):\n    x: int = 1\n    'doc'\n    y: int = 2\n"
           "    z: int = 3\n    'two\\nlines'\n")
    assert _undocumented_fields(src) == ["A.y", "A.z"]


def test_every_config_field_has_a_one_line_docstring():
    files = [*sorted((REPO / "streamrl" / "config").glob("*.py")), REPO / "streamrl" / "tasks" / "options.py",
             REPO / "streamrl" / "algo" / "loss_specs.py", REPO / "actors" / "backends" / "specs.py"]
    sources = [p.read_text() for p in files]
    classes = [c for source in sources for c in _section_classes(ast.parse(source))]
    assert {c.name for c in classes} >= {"ModelConfig", "TaskConfig", "AdvantageConfig", "LossConfig", "OptimConfig",
                                         "LearnerConfig", "ActorConfig", "TransportConfig", "Config",
                                         "VerifiersOptions", "PPOOptions", "EngineOptions", "HFOptions"}
    assert [name for source in sources for name in _undocumented_fields(source)] == []


def test_every_section_of_config_is_a_field_of_config():
    """A section module whose Struct no field of Config names would be a section no file can set."""
    used = {f.type for f in msgspec.structs.fields(config.Config)}
    sections = {v for v in vars(config).values() if isinstance(v, type) and issubclass(v, config._Section)}
    assert sections - used - {config.Config, config._Section} == set()


@pytest.mark.parametrize("overrides", [
    [],
    ["advantage.estimator=grpo", "advantage.std_normalize=true", "on_policy=strict", "seed=-3"],
    ["optim.betas=[0.5, 0.6]", "optim.lr=1e-10", "reward.bucket_edges=[0.5]",
     "reward.bucket_values=[0, 0.30000000000000004]", "advantage.r_min_correct=0.30000000000000004"],
    ["model.path=/some/where", "model.dtype=bfloat16", "actors.backend=hf", "actors.throttle=false"],
])
def test_overrides_for_rebuilds_an_equal_config(overrides):
    cfg = load(None, overrides)
    assert load(None, config.overrides_for(cfg)) == cfg


@pytest.mark.parametrize("text", ["null", "yes", "123", "1e3", "a b", "a: b", "#x", "[1]", "", "~", "...",
                                  "x=y", "it's", "é", "a\nb", "x" * 200])
def test_overrides_for_keeps_strings_that_look_like_other_yaml(text):
    name = text or "empty"  # an empty run name is refused (test_a_run_name_must_be_one_folder_name)
    cfg = msgspec.structs.replace(load(None), name=name, run_dir=text)
    back = load(None, config.overrides_for(cfg))
    assert back.name == name and back.run_dir == text


@pytest.mark.parametrize("name", ["", ".", "..", "../escape", "a/b", "/abs", "a\\b"])
def test_a_run_name_must_be_one_folder_name(name):
    with pytest.raises(config.ConfigError, match="must be one folder name"):
        load(None, [f"name={name}"])


def test_dump_is_yaml_that_loads_back(tmp_path):
    cfg = load(None, ["advantage.estimator=static", "steps=5"])
    f = tmp_path / "resolved.yaml"
    f.write_text(config.dump(cfg))
    assert load(f) == cfg


def test_a_config_extends_another_section_by_section(tmp_path):
    (tmp_path / "base.yaml").write_text("steps: 7\noptim:\n  lr: 0.5\n  weight_decay: 0.1\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\noptim:\n  weight_decay: 0.0\n")
    cfg = config.load(tmp_path / "child.yaml")
    assert (cfg.steps, cfg.optim.lr, cfg.optim.weight_decay) == (7, 0.5, 0.0)


def test_an_extends_loop_or_missing_base_is_a_clear_error(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(config.ConfigError, match="loops back"):
        config.load(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(config.ConfigError, match=r"nowhere.yaml' not found \(extended by"):
        config.load(tmp_path / "c.yaml")


def test_paper_configs_follow_the_paper():
    for estimator in ("grpo", "static", "corpo"):
        cfg = config.load(REPO / "configs" / "paper" / f"{estimator}.yaml")
        assert cfg.advantage.estimator == estimator and cfg.strict
        assert (cfg.actors.group_size, cfg.learner.batch_groups * cfg.actors.group_size) == (8, 512)
        assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.weight_decay) == (1e-6, 10, 0.1)
        assert (cfg.loss.kl_coef, cfg.loss.entropy_coef, cfg.actors.temperature, cfg.actors.top_p) == (0, 0, 1, 1)
        assert cfg.actors.filter_zero_variance and cfg.task.scale_steps == 10 and cfg.task.reward_form == "bce"
        assert cfg.advantage.r_min_correct == math.log(0.6)
        assert cfg.model.max_seq_len == 16384  # the paper's cap is on the whole sequence
        assert (cfg.eval.prompts, cfg.eval.samples, cfg.eval.ks) == ("all", 16, [1, 16])
        four = config.load(REPO / "configs" / "paper" / f"{estimator}-4step.yaml")
        assert len(four.reward.bucket_edges) == 3 and four.advantage.r_min_correct == math.log(2 / 3)
        assert four.optim.weight_decay == 0.1
        assert config.load(REPO / "configs" / "paper" / f"{estimator}-4step-wd0.yaml").optim.weight_decay == 0
        filtered = config.load(REPO / "configs" / "paper" / f"{estimator}-4step-filtered.yaml")
        rollouts = config.load(REPO / "configs" / "paper" / f"{estimator}-4step-filtered-rollouts.yaml")
        assert filtered.task.data == rollouts.task.data != cfg.task.data
        assert (filtered.actors.rollout_factor, rollouts.actors.rollout_factor) == (1, 5)
        assert filtered.reward == rollouts.reward == four.reward


def test_every_paper_config_names_its_table_cell_or_says_it_is_a_comparison_run():
    paper = sorted((REPO / "configs" / "paper").glob("*.yaml"))
    assert len(paper) == 3 + 4 + 8   # Table 1: 3 cells; Tables 2-3: 4 CoRPO cells, and 8 GRPO/static comparisons
    cells, comparisons = [], []
    for path in paper:
        first = path.read_text().splitlines()[0]
        if cell := re.match(r'# Table ([123]), row "[^"]+", column "(GRPO|static|CoRPO)"', first):
            cells.append(path.name)
            assert cell[1] == "1" or cell[2] == "CoRPO", path.name   # Tables 2-3 report CoRPO only
            est = cell[2]
        else:
            comparison = re.match(r'# Comparison run, not a cell of Tables 2–3 \(they report CoRPO only\): '
                                  r'(GRPO|static) at the setting of Table [23], row "[^"]+"', first)
            assert comparison, path.name
            comparisons.append(path.name)
            est = comparison[1]
        est = {"GRPO": "grpo", "static": "static", "CoRPO": "corpo"}[est]
        assert config.load(path).advantage.estimator == est and path.name.startswith(est)
    assert len(cells) == 7 and len(comparisons) == 8


def test_lr_schedule_warms_up_then_decays_by_cosine_to_zero():
    from streamrl.learner.stepsize import lr_factor

    assert [lr_factor(s, 4, 10, "constant") for s in (0, 3, 9)] == [0.25, 1.0, 1.0]
    cosine = [lr_factor(s, 2, 10, "cosine") for s in range(10)]
    assert cosine[:2] == [0.5, 1.0] and cosine[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a > b for a, b in zip(cosine[1:], cosine[2:]))   # strictly decreasing after warm-up
    assert lr_factor(5, 0, 10, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.6)))


def test_mgrpo_paper_config_follows_the_paper():
    cfg = config.load(REPO / "configs" / "mgrpo" / "qwen2.5-math-7b.yaml")
    assert cfg.mgrpo.enabled and cfg.model.path.endswith("Qwen2.5-Math-7B") and cfg.task.name == "math"
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.warmup_ratio, cfg.loss.kl_coef) == (5e-7, "cosine", 0.03, 0.001)
    assert (cfg.actors.max_new_tokens, cfg.actors.group_size, cfg.learner.batch_groups) == (8196, 8, 32)
    assert cfg.actors.temperature == cfg.eval.temperature == 0.7
    assert cfg.model.max_seq_len == 4096   # the paper's context
    assert (cfg.eval.prompts, cfg.eval.samples, cfg.eval.ks) == ("all", 1, [1])   # whole benchmarks, accuracy


def test_the_paper_configs_set_every_open_choice_to_what_the_recipe_page_says():
    cfg = config.load(REPO / "configs" / "paper" / "grpo.yaml")
    assert cfg.advantage.std_normalize is False
    assert (cfg.task.bce_floor, cfg.task.rounding, cfg.model.max_prompt_tokens) == (1e-3, "half_up", 4096)
    page = (REPO / "docs" / "guides" / "paper-recipe.md").read_text()
    for key in ("advantage.std_normalize", "task.bce_floor", "task.rounding", "model.max_prompt_tokens"):
        assert f"`{key}`" in page, key


def test_eval_ks_above_the_sample_count_are_refused_with_the_key_and_the_limit():
    msg = _error("eval.samples=4", "eval.ks=[1, 8]")
    assert "eval.ks=[1, 8]" in msg and "samples=4" in msg
    assert "eval.ks" in _error("eval.ks=[]")
    assert "allowed: int > 0" in _error("eval.ks=[0]")
    assert load(None, ["eval.samples=4", "eval.ks=[1, 4]"]).eval.ks == [1, 4]


def test_optional_and_list_fields_say_what_is_allowed():
    assert "allowed: int > 0 or None" in _error("eval.max_new_tokens=0")
    assert "allowed: str or None" in _error("model.path=3")
    assert "allowed: list of int > 0" in _error("eval.ks=3")


def test_difficulty_band_needs_low_below_high():
    msg = _error("difficulty.low=0.5", "difficulty.high=0.4")
    assert "difficulty.low=0.5" in msg and "high (0.4)" in msg


def test_ipc_and_collective_weight_sync_are_taken_by_every_backend_and_refused_with_what_an_engine_cannot_keep():
    for sync in ("collective", "ipc"):
        for backend in ("hf", "vllm", "sglang"):
            cfg = load(None, [f"actors.backend={backend}", f"transport.weight_sync={sync}"])
            assert cfg.transport.weight_sync == sync
        # the engines load each version themselves: no host copy for adapters or an evaluation's version
        for extra in ("lora.rank=8", "eval.every=5"):
            for backend in ("vllm", "sglang"):
                msg = _error(f"actors.backend={backend}", f"transport.weight_sync={sync}", extra)
                assert f"transport.weight_sync={sync} with actors.backend={backend}: its engine loads each version " \
                       "itself" in msg and extra.split("=")[0] in msg
        assert load(None, ["transport.weight_sync=" + sync, "lora.rank=8"]).lora.rank == 8  # hf keeps its copy
    assert load(None, []).transport.weight_sync == "zmq"  # the default stays


def test_an_empty_yaml_file_is_refused_rather_than_running_the_default_job(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here yet\n")
    with pytest.raises(config.ConfigError, match="empty.yaml: the file is empty"):
        config.load(empty)


def test_a_yaml_error_names_its_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\n  name: x\n")
    with pytest.raises(config.ConfigError, match=r"bad.yaml:2:7: not valid YAML: mapping values are not allowed"):
        config.load(bad)


def test_inflight_updates_with_lora_on_vllm_are_refused_naming_why():
    msg = _error("actors.backend=vllm", "actors.inflight_updates=true", "lora.rank=8")
    assert "lora.rank > 0 on vllm" in msg and "LoRARequest" in msg


def test_the_off_policy_objectives_and_their_knobs_load_and_a_knob_out_of_range_is_named():
    cfg = load(None, ["loss.name=icepop", "loss.mis_low=0.7", "loss.mis_high=3"])
    assert (cfg.loss.name, cfg.loss.mis_low, cfg.loss.mis_high) == ("icepop", 0.7, 3.0)
    assert load(None, ["loss.name=m2po", "loss.m2po_tau=0.01"]).loss.m2po_tau == 0.01
    msg = _error("loss.name=mis", "loss.mis_low=2")
    assert "loss.mis_low=2" in msg and "allowed: float ≥ 0 and ≤ 1" in msg
    msg = _error("loss.name=tis", "loss.tis_cap=0.5")
    assert "loss.tis_cap=0.5" in msg and "≥ 1" in msg
    assert "m2po" in _error("loss.name=m2p")


def test_levels_take_fractions_as_users_write_them_and_a_tolerance_below_half_their_gap(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "answer": "a"}\n')
    task = ["task.name=dataset", f"task.data={tmp_path / 'd.jsonl'}", "task.reward=math:sqrt"]
    cfg = load(None, [*task, "task.reward_levels=[0, 1/3, 2/3, 1]", "advantage.r_min_correct=2/3"])
    assert cfg.task.reward_levels == [0.0, 1 / 3, 2 / 3, 1.0] and cfg.advantage.r_min_correct == 2 / 3
    with pytest.raises((ConfigError, ValueError), match="reward_level_tolerance=0.2: must be below half"):
        load(None, [*task, "task.reward_levels=[0, 1/3, 2/3, 1]", "advantage.r_min_correct=1",
                    "task.reward_level_tolerance=0.2"])
    with pytest.raises((ConfigError, ValueError), match="reward_levels"):
        load(None, [*task, "task.reward_levels=[0, one third, 1]", "advantage.r_min_correct=1"])


def test_a_key_of_a_plug_in_the_run_does_not_name_is_refused_unless_it_holds_that_plug_ins_default():
    msg = _error("loss.m2po_tau=0.01")  # the run's objective is token_pg: the key would do nothing
    assert "loss.m2po_tau=0.01: an option of loss 'm2po', which this run does not name" in msg
    # At its default it is left unread (a file extending tiny.yaml keeps the symbol tasks' keys).
    assert "m2po_tau" not in load(None, ["loss.m2po_tau=0.04"]).loss.objective_knobs()
    assert "task.verifiers_env='x': an option of task 'verifiers'" in _error("task.verifiers_env=x")


def test_each_plug_ins_own_keys_reach_it_typed_and_are_written_back_among_the_sections_keys():
    cfg = load(None, ["task.name=code_verifier", "task.scale_steps=5", "advantage.r_min_correct=0",
                      "loss.name=tis", "loss.tis_cap=1"])
    assert type(cfg.task.options_for(registry.TASKS)).__name__ == "VerifierOptions" and cfg.task.scale_steps == 5
    assert cfg.loss.objective_knobs() == {"kl_coef": 0.0, "entropy_coef": 0.0, "aggregation": "token", "tis_cap": 1.0}
    written = config.to_dict(cfg)
    assert written["task"]["scale_steps"] == 5 and written["loss"]["tis_cap"] == 1.0 and "opts" not in written["task"]
