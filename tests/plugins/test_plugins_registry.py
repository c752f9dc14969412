"""Registry: validation on register, duplicates, lookups that list what exists."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel, ConfigDict

from speculant.interfaces import UnknownPluginError
from speculant.plugins.registry import PluginSource, RegistrationError, Registry


class LooseOptions(BaseModel):  # allows unknown keys: must be refused
    x: int = 1


class StrictOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int = 1


def test_add_and_get(make_class):
    reg = Registry()
    cls = make_class("proposer", "p1")
    entry = reg.add("proposer", cls, PluginSource(name="src", distribution="dist", version="1.0",
                                                  entry_point="ep", value="mod"))
    assert reg.get("proposer", "p1") is cls
    assert reg.get_proposer("p1") is cls
    assert entry.source.distribution == "dist"
    assert reg.names("proposer") == ["p1"]
    assert reg.names("scorer") == []


def test_unknown_name_lists_available(make_class):
    reg = Registry()
    for name in ("ngram", "draft_model"):
        reg.add("proposer", make_class("proposer", name), PluginSource(name="src"))
    with pytest.raises(UnknownPluginError) as info:
        reg.get("proposer", "ngarm")
    assert isinstance(info.value, KeyError)
    assert str(info.value) == "no proposer named 'ngarm'; available: draft_model, ngram (did you mean 'ngram'?)"


def test_unknown_name_when_kind_is_empty():
    with pytest.raises(UnknownPluginError, match=r"no acceptance method named 'x'; available: none"):
        Registry().get("acceptance", "x")


def test_duplicate_name_names_both_sources(make_class):
    reg = Registry()
    first = PluginSource(name="a:one", distribution="pkg-a", version="1.0", entry_point="one", value="a_mod")
    second = PluginSource(name="b:two", distribution="pkg-b", version="2.0", entry_point="two", value="b_mod")
    reg.add("scorer", make_class("scorer", "same"), first)
    with pytest.raises(RegistrationError) as info:
        reg.add("scorer", make_class("scorer", "same"), second)
    msg = str(info.value)
    assert "scorer name 'same'" in msg
    assert "entry point 'one = a_mod' of distribution pkg-a 1.0" in msg
    assert "rename one of them" in msg


@pytest.mark.parametrize("kind, attrs, expected", [
    ("proposer", {"name": ""}, "name = '': must be a non-empty string"),
    ("proposer", {"name": 3}, "name = 3: must be a non-empty string"),
    ("proposer", {"capabilities": "fast"}, "capabilities = 'fast': must be a speculant.plugin_api."
                                           "ProposerCapabilities instance"),
    ("scorer", {"Options": dict}, "Options = <class 'dict'>: must be a pydantic model"),
    ("acceptance", {"Options": LooseOptions}, "Options does not forbid unknown keys"),
])
def test_invalid_class_attributes(make_class, kind, attrs, expected):
    cls = make_class(kind, "bad")
    for key, value in attrs.items():
        setattr(cls, key, value)
    with pytest.raises(RegistrationError, match=re.escape(expected)):
        Registry().add(kind, cls, PluginSource(name="src"))


def test_wrong_base_class(make_class):
    cls = make_class("scorer", "s")
    with pytest.raises(RegistrationError, match=r"is not a subclass of speculant\.plugin_api\.Proposer"):
        Registry().add("proposer", cls, PluginSource(name="src"))


def test_instance_instead_of_class(make_class):
    with pytest.raises(RegistrationError, match="pass the class, not an instance"):
        Registry().add("proposer", object(), PluginSource(name="src"))


def test_abstract_class_refused():
    from speculant.interfaces import Proposer

    class Half(Proposer):
        name = "half"

    with pytest.raises(RegistrationError, match="leaves abstract methods unimplemented: propose"):
        Registry().add("proposer", Half, PluginSource(name="src"))


def test_strict_options_accepted(make_class):
    reg = Registry()
    reg.add("acceptance", make_class("acceptance", "a", options=StrictOptions), PluginSource(name="src"))
    assert reg.get_acceptance("a").Options is StrictOptions


def test_remove_source_and_filtered(make_class):
    reg = Registry()
    reg.add("proposer", make_class("proposer", "keep"), PluginSource(name="x", value="speculant.plugins.builtin"))
    reg.add("proposer", make_class("proposer", "drop"), PluginSource(name="y"))
    assert reg.filtered(lambda r: r.source.is_builtin).names("proposer") == ["keep"]
    reg.remove_source("y")
    assert reg.names("proposer") == ["keep"]
