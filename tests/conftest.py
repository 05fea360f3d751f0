"""Test-wide environment: no hub access, and a private QVL_HOME so tests never touch ~/.cache."""

from __future__ import annotations

import os
import signal
import tempfile

# Ctrl-C as a terminal gives it: a test run started in the background (`pytest &` in a script, some CI steps)
# inherits SIGINT ignored, and then neither this process nor any qvl it starts would see the Ctrl-C the tests send
# (Python installs its KeyboardInterrupt handler only when SIGINT is not ignored; exec resets a caught signal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["QVL_HOME"] = tempfile.mkdtemp(prefix="qvl-test-home-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="qvl-test-hf-cache-")  # empty: no model is "cached" by chance
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist hands its workers COLUMNS (the controller's width, 80 off a terminal); qvl's human output is
    # tested as a user's pipe sees it (no COLUMNS: the wide pipe width), which a serial run also gives
    os.environ.pop("COLUMNS", None)

# Hypothesis: a fixed seed by default, so CI sees the same examples on every run and a failure reproduces;
# every counterexample found so far is pinned with @example. QVL_PROPERTY_RANDOM=1 (with QVL_PROPERTY_SCALE
# where a file honours it) searches fresh random examples: a deep run, by hand.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("qvl-fixed", derandomize=True)
_hypothesis_settings.register_profile("qvl-random", derandomize=False)
_hypothesis_settings.load_profile("qvl-random" if os.environ.get("QVL_PROPERTY_RANDOM") else "qvl-fixed")


import pytest  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """A short private base folder for tmp_path: human output wraps at the terminal's width, and a long
    temporary path (pytest-of-USER/pytest-N/popen-gwK/...) must not decide where a test's table row breaks.
    Private (mkdtemp), so two suites running at once never clear each other's folders."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="qvl-t", dir="/tmp" if os.path.isdir("/tmp") else None)
        config.stash[_OWN_BASETEMP] = config.option.basetemp


_OWN_BASETEMP = pytest.StashKey[str]()

# The per-test limit (pyproject: timeout) counts a test's setup, so the first test to use a session fixture that
# compiles an artifact or starts the engine pays for it; such tests get a larger bound, not a budget: the engine's
# own start bound (engine_server.START_S, 420 s) plus a compile under load.
LONG_FIXTURES_S = {"engine_artifact": 1800, "tiny_rbln": 1200}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test without its own timeout marker that uses a slow session fixture gets that fixture's limit."""
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        limits = [s for name, s in LONG_FIXTURES_S.items() if name in getattr(item, "fixturenames", ())]
        if limits:
            item.add_marker(pytest.mark.timeout(max(limits)))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the private base folder again (pytest's own default keeps the last three runs instead)."""
    own = config.stash.get(_OWN_BASETEMP, None)
    if own:
        import shutil

        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def own_qvl_home(tmp_path, monkeypatch):
    """A QVL_HOME of the test's own: no load another test recorded ($QVL_HOME/load-times.json) turns a stated
    startup figure into a measured one or stands in for a load-check report (the deploy tests use it)."""
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))


@pytest.fixture
def no_model_load(monkeypatch):
    """Bad input must be refused before any model is loaded (nothing half-done)."""
    from qwenvl_rbln.inference import reference

    def boom(*a, **k):
        raise AssertionError("a model was loaded for a request that should have been refused")

    monkeypatch.setattr(reference, "load_reference", boom)


# ------------------------------------------------------------------- optimum-rbln's real code on the emulator


@pytest.fixture(autouse=True)
def _emulator_left_as_found():
    """A test that runs `qvl ... --emulate` in-process leaves the emulator served as ``rebel`` (the CLI never needs
    to undo it: its process ends). Off again after each test that found it off, so a later test in the same worker
    never meets an emulator it did not ask for (a module that keeps it on, tests/test_emulator.py, found it on)."""
    from qwenvl_rbln.backends import emulator

    was = emulator.is_active()
    yield
    if not was and emulator.is_active():
        emulator.deactivate()


@pytest.fixture
def emulated():
    """qvl's CPU emulator served as ``rebel`` for one test, so optimum-rbln's real code runs on it; removed again
    afterwards unless it was on before (tests/emulated_rbln.py: emulator_on)."""
    from tests.emulated_rbln import emulator_on, optimum_rbln_installed

    if not optimum_rbln_installed():
        pytest.skip("optimum-rbln is not installed")
    with emulator_on():
        yield


@pytest.fixture
def rbln_calls(emulated, monkeypatch):
    """The emulator on, and optimum-rbln's entry points recorded (tests/emulated_rbln.py: record_rbln)."""
    from tests.emulated_rbln import record_rbln

    return record_rbln(monkeypatch)


@pytest.fixture(scope="session")
def tiny_model():
    """The offline tiny Qwen3-VL (qvl:tiny), created once under the tests' QVL_HOME."""
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def tiny_rbln(tmp_path_factory):
    """`qvl compile --preset cpu-tiny-rbln --emulate` once per session: tiny model, flash attention, batch 2 with
    decoder_batch_sizes [1, 2], ViT buckets 256/1024/4096, placement 0/0. Read-only: copy it to change it. Later
    compiles of the same graphs (another placement too) are cache hits, tests/test_vit_packing_e2e.py's as well."""
    from tests.emulated_rbln import compile_emulated, optimum_rbln_installed

    if not optimum_rbln_installed():
        pytest.skip("optimum-rbln is not installed")
    return compile_emulated(tmp_path_factory.mktemp("tiny-rbln") / "cpu-tiny-rbln")


# ------------------------------------------------------------- the real engine (tests/test_engine_*.py)


@pytest.fixture(scope="session")
def engine_artifact(tmp_path_factory):
    """The tiny Qwen3-VL the engine tests serve (tests/engine_server.py: compile_artifact). They never skip: vLLM and
    vllm-rbln are part of `make install`, so a missing engine is a failure that says so."""
    from tests import engine_server

    assert engine_server.installed() is None, f"{engine_server.installed()}: the engine tests never skip"
    return engine_server.compile_artifact(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="session")
def engine_media(tmp_path_factory):
    """The images and videos the engine tests send (tests/engine_server.py: write_media)."""
    from tests import engine_server

    return engine_server.write_media(tmp_path_factory.mktemp("engine-media"))
