"""What a training script's fork server may import before the script runs: the library modules
the script imported, never its own files, and none imported after it changed the environment."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from autotune.search.isolation import run_isolated
from autotune.target import Script
from autotune.trial.protocol import ProbeSettings, TrialRequest, TrialStatus
from autotune.trial.script.preload import import_modules, recording_imports
from tests.conftest import need

# Standard-library modules nothing here imports otherwise, so each test imports them anew.
FIRST, SECOND = "wave", "colorsys"


@pytest.fixture
def unimported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (FIRST, SECOND, "users_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_library_modules_are_recorded_and_the_users_own_never(
        unimported: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "users_helper.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with recording_imports() as imports:
        importlib.import_module(FIRST)
        importlib.import_module("users_helper")
    modules = imports.modules()
    assert FIRST in modules and "users_helper" not in modules
    assert not any(name.split(".")[0] == "autotune" for name in modules)
    assert imports.changed == []


def test_imports_after_the_script_changes_the_environment_are_its_own(
        unimported: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_TEST_FLAG", raising=False)
    with recording_imports() as imports:
        importlib.import_module(FIRST)
        monkeypatch.setenv("AUTOTUNE_TEST_FLAG", "1")
        importlib.import_module(SECOND)
    modules = imports.modules()
    assert FIRST in modules and SECOND not in modules
    assert imports.changed == ["AUTOTUNE_TEST_FLAG"]


def test_a_module_that_imports_on_a_missing_attribute_is_read_without_importing(
        unimported: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.1 leaves aliases of moved modules in sys.modules whose module-level
    __getattr__ imports (PEP 562): reading what the script imported must not call it (it
    recursed through the recorder until Python's limit, and run_clm.py failed at import)."""
    lazy = ModuleType("autotune_test_lazy")

    def imports_on_access(name: str) -> object:
        return importlib.import_module(f"autotune_test_absent_{name.strip('_')}")

    lazy.__getattr__ = imports_on_access  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "autotune_test_lazy", lazy)
    monkeypatch.delenv("AUTOTUNE_TEST_FLAG", raising=False)
    with recording_imports() as imports:
        importlib.import_module(FIRST)
        monkeypatch.setenv("AUTOTUNE_TEST_FLAG", "1")
        importlib.import_module(SECOND)
    assert FIRST in imports.modules() and SECOND not in imports.modules()
    assert imports.changed == ["AUTOTUNE_TEST_FLAG"]


def test_a_module_that_will_not_import_is_left_to_the_trial(unimported: None) -> None:
    imported, failed = import_modules([FIRST, "no_such_module_anywhere"])
    assert imported == 1 and failed == ["no_such_module_anywhere"]
    assert FIRST in sys.modules


@pytest.mark.slow
def test_a_scripts_probe_says_which_modules_its_trials_may_import_ahead(
        tmp_path: Path) -> None:
    """transformers' Trainer is among them; a script that sets a variable before importing
    transformers keeps transformers to its own trials."""
    need("transformers", "examples")
    body = '''
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        class Sequences(torch.utils.data.Dataset):
            def __len__(self):
                return 32

            def __getitem__(self, i):
                ids = torch.arange(8) % 64
                return {"input_ids": ids, "labels": ids}

        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                           n_positions=8))
        Trainer(model=model, args=TrainingArguments(output_dir=OUT, report_to="none"),
                train_dataset=Sequences()).train()
        '''
    probes = {}
    for name, first_lines in (("plain", ""),
                              ("sets_env", "import os\nos.environ['MY_SCRIPT_FLAG'] = '1'\n")):
        script = tmp_path / f"{name}.py"
        script.write_text(first_lines + f"OUT = {str(tmp_path / 'out')!r}\n" +
                          textwrap.dedent(body))
        result = run_isolated(TrialRequest(Script(str(script)), config={}, device="cpu",
                                           settings=ProbeSettings(candidates={})),
                              300, tmp_path / f"{name}.log")
        assert result.status == TrialStatus.OK, (tmp_path / f"{name}.log").read_text()[-3000:]
        probes[name] = result.probe
    assert "transformers.trainer" in probes["plain"].script_imports
    # its own run, as its Trainer counts it: 3 epochs of 32 samples in batches of 8
    assert probes["plain"].script_run_steps == 12
    assert probes["plain"].script_environment_changed == []
    assert not any(m.startswith("transformers") for m in probes["sets_env"].script_imports)
    assert "torch" in {m.split(".")[0] for m in probes["sets_env"].script_imports}
    assert probes["sets_env"].script_environment_changed == ["MY_SCRIPT_FLAG"]
    assert not (tmp_path / "out").exists()
    assert os.environ.get("MY_SCRIPT_FLAG") is None
