"""streamrl.registry.Registry: one name, one item; a bad name lists the valid ones."""

from __future__ import annotations

import pytest

from streamrl.registry import Registry


def _registry() -> Registry:
    reg: Registry = Registry("widget")
    reg.register("alpha")(lambda: "a")
    reg.register("beta")(lambda: "b")
    return reg


def test_registered_items_come_back_by_name():
    reg = _registry()
    assert reg.get("alpha")() == "a"
    assert reg.get("beta")() == "b"
    assert "alpha" in reg and "gamma" not in reg
    assert reg.names() == ["alpha", "beta"]


def test_register_returns_the_item_unchanged():
    reg: Registry = Registry("widget")

    def f():
        return 1

    assert reg.register("f")(f) is f


def test_registry_refuses_a_duplicate_name():
    reg = _registry()
    original = reg.get("alpha")
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.register("alpha")(lambda: "other")
    assert reg.get("alpha") is original


def test_a_bad_name_error_lists_the_kind_and_the_valid_names():
    reg = _registry()
    with pytest.raises(KeyError) as e:
        reg.get("gamma")
    msg = str(e.value)
    assert "unknown widget 'gamma'" in msg
    assert "valid: alpha, beta" in msg
    assert reg.unknown("gamma") == "unknown widget 'gamma'; valid: alpha, beta"
