"""Fixtures for the plugin tests: fake plugin classes built from capability
flags, plugins registered in-process, and real ``*.dist-info`` directories on
``sys.path`` so that discovery runs through ``importlib.metadata``."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from speculant.interfaces import API_VERSION, PLUGIN_KINDS, NoOptions
from speculant.plugins import hookimpl
from speculant.plugins.manager import ALLOW_LIST_ENV, register_plugin, reset_plugins, unregister_plugin
from speculant.plugins.registry import PluginSource, Registry

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PACKAGE = REPO_ROOT / "examples" / "plugin-package"

def _not_used(self, *args, **kwargs):
    raise NotImplementedError("test plugin class: only its class data is used")


def fake_class(kind: str, name: str, options: type[BaseModel] = NoOptions, **caps) -> type:
    """A concrete subclass of ``kind``'s base with the given name, capability
    flags and options model; its abstract methods raise if called."""
    spec = PLUGIN_KINDS[kind]
    namespace = {m: _not_used for m in getattr(spec.base, "__abstractmethods__", ())}
    namespace.update(name=name, api_version=API_VERSION, capabilities=spec.capabilities(**caps), Options=options,
                     __module__=__name__)
    return type(f"Fake_{kind}_{name}", (spec.base,), namespace)


class FakePlugin:
    """An in-process plugin object registering the given classes."""

    def __init__(self, proposers=(), scorers=(), acceptance=(), backends=()) -> None:
        self.classes = {"proposer": list(proposers), "scorer": list(scorers),
                        "acceptance": list(acceptance), "attention_backend": list(backends)}

    @hookimpl
    def register_proposers(self, register):
        for cls in self.classes["proposer"]:
            register(cls)

    @hookimpl
    def register_scorers(self, register):
        for cls in self.classes["scorer"]:
            register(cls)

    @hookimpl
    def register_acceptance_methods(self, register):
        for cls in self.classes["acceptance"]:
            register(cls)

    @hookimpl
    def register_attention_backends(self, register):
        for cls in self.classes["attention_backend"]:
            register(cls)


class LookupOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_n: int = Field(default=4, ge=1)
    min_n: int = Field(default=1, ge=1)


def standard_fakes() -> dict[str, list[type]]:
    """A small, fully supported set of test plugins (names prefixed ``t_``)."""
    return {
        "proposers": [fake_class("proposer", "t_lookup", options=LookupOptions),
                      fake_class("proposer", "t_heads", needs_target_hidden_states=True,
                                 needs_prompt_hidden_states=True, supports_chunked_prefill=False, draft_probs="full",
                                 max_num_speculative_tokens=3)],
        "scorers": [fake_class("scorer", "t_mqa", needs_multi_token_queries=True)],
        "acceptance": [fake_class("acceptance", "t_exact")],
        "backends": [fake_class("attention_backend", "t_attn")],
    }


@pytest.fixture
def make_class() -> Callable[..., type]:
    return fake_class


@pytest.fixture
def make_registry() -> Callable[..., Registry]:
    """``make_registry(*classes_by_kind)``: a Registry filed by a test source."""
    def build(**by_kind: list[type]) -> Registry:
        reg = Registry()
        source = PluginSource(name="tests")
        for kind, classes in by_kind.items():
            for cls in classes:
                reg.add(kind, cls, source)
        return reg
    return build


@pytest.fixture
def fresh_plugins(monkeypatch) -> Iterator[None]:
    """No cached plugin state and no allow-list, before and after the test."""
    monkeypatch.delenv(ALLOW_LIST_ENV, raising=False)
    reset_plugins()
    try:
        yield
    finally:
        reset_plugins()


@pytest.fixture
def test_plugin(fresh_plugins) -> Iterator[FakePlugin]:
    """``standard_fakes()`` registered in the loaded plugins as ``tests``."""
    fakes = standard_fakes()
    plugin = FakePlugin(**fakes)
    register_plugin(plugin, "tests")
    try:
        yield plugin
    finally:
        unregister_plugin("tests")


class Site:
    """A directory on ``sys.path`` holding modules and real ``*.dist-info``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.module_names: list[str] = []

    def add_module(self, name: str, source: str) -> None:
        (self.root / f"{name}.py").write_text(textwrap.dedent(source))
        self.module_names.append(name)

    def add_dist(self, name: str, version: str, entry_points: dict[str, str]) -> None:
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = "".join(f"{ep} = {target}\n" for ep, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[speculant.plugins]\n{lines}")


@pytest.fixture
def site(tmp_path, monkeypatch, fresh_plugins) -> Iterator[Site]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    s = Site(root)
    try:
        yield s
    finally:
        for name in s.module_names:
            sys.modules.pop(name, None)


@pytest.fixture
def example_installed(site, monkeypatch) -> Iterator[Site]:
    """The example package's source on ``sys.path`` plus a real dist-info for it."""
    monkeypatch.syspath_prepend(str(EXAMPLE_PACKAGE / "src"))
    site.add_dist("speculant-retrieval", "0.1.0", {"retrieval": "speculant_retrieval.plugin"})
    try:
        yield site
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "speculant_retrieval"]:
            del sys.modules[name]


PLUGIN_TEMPLATE = """
from speculant.plugin_api import Proposals, Proposer, ProposerCapabilities, hookimpl


class {cls}(Proposer):
    name = {name!r}
    api_version = "3.0"
    capabilities = ProposerCapabilities(draft_probs="one_hot")

    def propose(self, batch):
        return Proposals.from_lists([[] for _ in batch.decodes])


@hookimpl
def {hook}(register):
    register({cls})
"""


def proposer_plugin_source(name: str, hook: str = "register_proposers") -> str:
    """Source of a plugin module registering one proposer called ``name``."""
    return PLUGIN_TEMPLATE.format(cls=f"Proposer_{name}", name=name, hook=hook)


@pytest.fixture
def plugin_source() -> Callable[..., str]:
    return proposer_plugin_source


@pytest.fixture
def fake_plugin() -> type[FakePlugin]:
    return FakePlugin


@pytest.fixture
def standard_fakes_factory() -> Callable[[], dict[str, list[type]]]:
    return standard_fakes


@pytest.fixture(scope="session")
def kit_models(tmp_path_factory):
    """The conformance kit's tiny models (built once per session)."""
    from speculant.plugin_api.testing import TinyModels

    return TinyModels.build(tmp_path_factory.mktemp("kit-models"))
