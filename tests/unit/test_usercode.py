"""rlft.usercode: loading user `module.fn` code from the working directory, with errors that say the fix."""

from __future__ import annotations

import sys

import pytest

from rlft.usercode import UserCodeError, import_user_module, load_user_function


def load_error(dotted: str) -> UserCodeError:
    with pytest.raises(UserCodeError) as caught:
        load_user_function(dotted)
    return caught.value


def test_loads_a_function_from_the_working_directory(workdir, tmp_path):
    workdir("rlft_uc_ok", "def reward(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    fn, module_file = load_user_function("rlft_uc_ok.reward")
    assert fn(["a", "b"]) == [1.0, 1.0]
    assert module_file == str(tmp_path / "rlft_uc_ok.py")
    assert sys.path.count(str(tmp_path)) == 1 and sys.path[0] == str(tmp_path)
    load_user_function("rlft_uc_ok.reward")
    assert sys.path.count(str(tmp_path)) == 1  # inserted once
    assert import_user_module("rlft_uc_ok").reward is fn


def test_a_file_written_after_a_first_import_attempt_is_found(workdir):
    assert load_error("rlft_uc_late.f").reason == "no_module"
    workdir("rlft_uc_late", "def f():\n    return 1\n")
    assert load_user_function("rlft_uc_late.f")[0]() == 1


def test_missing_module_says_where_it_looked(workdir, tmp_path):
    error = load_error("rlft_uc_nowhere.reward")
    assert error.reason == "no_module" and error.module_name == "rlft_uc_nowhere"
    message = str(error)
    assert message.startswith("'rlft_uc_nowhere.reward': no module 'rlft_uc_nowhere'")
    assert "rlft_uc_nowhere.py" in message and str(tmp_path) in message and "`file_name.function_name`" in message
    with pytest.raises(UserCodeError) as caught:
        import_user_module("rlft_uc_nowhere")
    assert caught.value.reason == "no_module" and str(caught.value).startswith("no module 'rlft_uc_nowhere'")
    for malformed in ("plainname", ".f", "module."):
        assert load_error(malformed).reason == "no_module"
    assert "is not `module.fn`" in str(load_error("plainname"))


def test_module_whose_own_import_fails(workdir, tmp_path):
    workdir("rlft_uc_needs_dep", "import surely_not_installed_pkg_xyz\ndef f(**kwargs):\n    return []\n")
    error = load_error("rlft_uc_needs_dep.f")
    assert error.reason == "import_failed" and error.module_file == str(tmp_path / "rlft_uc_needs_dep.py")
    message = str(error)
    assert "rlft_uc_needs_dep.py" in message and "failed to import" in message
    assert "Install the missing package `surely_not_installed_pkg_xyz`" in message

    workdir("rlft_uc_syntax", "def f(**kwargs)\n    return []\n")
    error = load_error("rlft_uc_syntax.f")
    assert error.reason == "import_failed"
    assert "SyntaxError" in str(error) and "python -c 'import rlft_uc_syntax'" in str(error)

    workdir("rlft_uc_raises", "raise RuntimeError('no API key')\n")
    with pytest.raises(UserCodeError, match="RuntimeError: no API key") as caught:
        import_user_module("rlft_uc_raises")
    assert caught.value.reason == "import_failed"


def test_missing_function_suggests_a_close_match(workdir):
    workdir("rlft_uc_funcs", "LIMIT = 3\ndef exact(**kwargs):\n    pass\ndef transform(cfg):\n    pass\n")
    error = load_error("rlft_uc_funcs.exactt")
    assert error.reason == "no_function" and error.attr == "exactt"
    assert str(error) == (f"'rlft_uc_funcs.exactt': module rlft_uc_funcs ({error.module_file}) has no function 'exactt'. "
                          "Did you mean rlft_uc_funcs.exact? It defines: exact, transform.")
    error = load_error("rlft_uc_funcs.py")
    assert error.reason == "no_function" and "Write `file_name.function_name`, not the file name." in str(error)
    assert "Did you mean" not in str(load_error("rlft_uc_funcs.zzz"))


def test_not_callable(workdir):
    workdir("rlft_uc_funcs2", "LIMIT = 3\n")
    error = load_error("rlft_uc_funcs2.LIMIT")
    assert error.reason == "not_callable" and error.attr == "LIMIT"
    assert "rlft_uc_funcs2.LIMIT in" in str(error) and "is a int, not a function" in str(error)
