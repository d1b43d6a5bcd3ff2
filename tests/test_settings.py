"""The options table: one resolution order (command line > environment > ini > default), errors that name the source."""

from __future__ import annotations

import pytest

from pytest_cudaopt import settings


def test_the_command_line_wins_over_the_environment_which_wins_over_the_ini_file():
    env = {"CUDAOPT_MIN_SPEEDUP": "1.2"}
    assert settings.resolve("min_speedup", cli="1.3", ini="1.1", env=env) == 1.3
    assert settings.resolve("min_speedup", ini="1.1", env=env) == 1.2
    assert settings.resolve("min_speedup", ini="1.1", env={}) == 1.1
    assert settings.resolve("min_speedup", env={}) == 1.05


def test_an_empty_value_falls_through_to_the_next_source():
    assert settings.resolve("timeout", cli="", env={"CUDAOPT_TIMEOUT": ""}, ini="7") == 7.0


def test_every_option_resolves_in_that_order_through_settings_resolve_all():
    resolved = settings.Settings.resolve_all(
        cli=lambda name: {"seeds": "5"}.get(name),
        ini=lambda name: {"seeds": "2", "profile": "thorough", "atol": "0.5"}.get(name),
        env={"CUDAOPT_PROFILE": "ci", "CUDAOPT_ATOL": "0.25"})
    assert (resolved.seeds, resolved.profile, resolved.atol) == (5, "ci", 0.25)
    assert resolved.rtol == settings.BY_NAME["rtol"].default


@pytest.mark.parametrize("source, kwargs, named", [
    ("command line", {"cli": "nan"}, "--cudaopt-timeout='nan'"),
    ("environment", {"env": {"CUDAOPT_TIMEOUT": "-3"}}, "environment variable CUDAOPT_TIMEOUT='-3'"),
    ("ini file", {"ini": "soon", "env": {}}, "ini option cudaopt_timeout='soon'"),
])
def test_a_bad_value_is_an_error_that_names_where_it_came_from(source, kwargs, named):
    with pytest.raises(settings.SettingError, match=named.replace("(", r"\(").replace(")", r"\)")):
        settings.resolve("timeout", **kwargs)
