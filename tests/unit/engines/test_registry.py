"""Every engine is complete: a registry entry per EngineName, an option dataclass, config group files, a
capability row, state conventions for every precision, a launch side and (unless export only) a rank side
that keep the engine contract. An engine that lacks any of these fails here, naming what is missing."""

from __future__ import annotations

import pytest

from harness.config.schema import ENGINE_OPTIONS, EngineName, Precision, allowed
from harness.engines import contract, registry
from harness.engines.registry import ENGINES, Engine, registry_problems
from harness.plan.conventions import STATE_CONVENTIONS
from harness.plan.support import ENGINE_SUPPORT


def test_the_registry_and_every_table_keyed_by_engine_agree():
    assert registry_problems() == []


def test_every_table_holds_exactly_the_registry_engines():
    names = set(allowed(EngineName))
    assert set(ENGINES) == names
    assert {str(name) for name in ENGINE_OPTIONS} == names
    assert set(ENGINE_SUPPORT) == names
    assert {key[0] for key in STATE_CONVENTIONS} == names


def test_each_side_keeps_the_contract():
    for entry in ENGINES.values():
        assert isinstance(entry.launch_side(), contract.LaunchSide), entry.name
        if entry.export_only:
            with pytest.raises(ValueError, match="no rank side"):
                entry.rank_side()
        else:
            assert isinstance(entry.rank_side(), contract.RankSide), entry.name


def test_an_engine_without_a_row_a_group_a_convention_or_a_session_fails():
    """A new engine registered and nothing else: each missing piece is named."""
    engines = {**ENGINES, "newengine": Engine("newengine", "harness.engines.nd", None, ("newengine",))}
    problems = registry_problems(engines)
    for missing in ("not a value of harness.config.schema.EngineName",
                    "no capability row in harness.plan.support.ENGINE_SUPPORT",
                    "no rank-side session module",
                    "no config group file engine/newengine.yaml"):  # fmt: skip
        assert f"engine newengine: {missing}" in "\n".join(problems), missing
    for precision in allowed(Precision):
        assert (f"engine newengine: no state convention for precision {precision} in "
                "harness.plan.conventions.STATE_CONVENTIONS") in problems


def test_an_engine_missing_from_one_table_fails(monkeypatch):
    """One engine loses its capability row, another its fp16 convention, a third its rank side."""
    monkeypatch.delitem(ENGINE_SUPPORT, "fsdp")
    monkeypatch.delitem(STATE_CONVENTIONS, ("nd", "fp16"))
    engines = {**ENGINES, "deepspeed": Engine("deepspeed", "harness.engines.deepspeed", "harness.engines.deepspeed",
                                              ("deepspeed",))}  # fmt: skip
    problems = registry_problems(engines)
    assert "engine fsdp: no capability row in harness.plan.support.ENGINE_SUPPORT" in problems
    assert ("engine nd: no state convention for precision fp16 in harness.plan.conventions.STATE_CONVENTIONS"
            in problems)
    assert ("engine deepspeed: harness.engines.deepspeed does not provide the engine contract's RankSide"
            in problems)


def test_a_name_without_an_entry_and_a_group_without_an_engine_fail(tmp_path):
    engines = {name: entry for name, entry in ENGINES.items() if name != "nd"}
    for entry in ENGINES.values():
        for group in entry.config_groups:
            (tmp_path / f"{group}.yaml").write_text(f"name: {entry.name}\n")
    (tmp_path / "fsdp.yaml").write_text("name: nd\n")
    problems = registry_problems(engines, config_dir=tmp_path, import_sessions=False)
    assert "EngineName.nd has no registry entry" in problems
    assert f"{tmp_path.name}/nd.yaml belongs to no registry entry" in problems
    assert f"engine fsdp: {tmp_path.name}/fsdp.yaml selects name='nd', not 'fsdp'" in problems


def test_lookups_name_the_known_engines():
    known = r"\['deepspeed', 'fsdp', 'megatron_lm', 'nd'\]"
    with pytest.raises(ValueError, match=rf"engine.name='nope' is not one of {known}"):
        registry.launch_side("nope")
    assert registry.engine("megatron_lm").export_only
    assert registry.engine("fsdp").options() is ENGINE_OPTIONS[EngineName.fsdp]
    assert registry.engine("nd").support() is ENGINE_SUPPORT["nd"]
