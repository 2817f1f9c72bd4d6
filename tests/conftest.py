"""Shared helpers: run the real CLI in a subprocess, write throw-away model files."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from .lanes import Lane, open_lanes, schedule

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = Path(__file__).resolve().parent / "models"
# Short windows: the tests check behaviour, not figures.
FAST = ["--window-steps", "3", "--window-seconds", "0.2", "--window-max-seconds", "1",
        "--warmup-max-seconds", "5", "--profile-steps", "1"]

# torch.compile costs ~30 s a trial on CI's cores: the studies hold it off.
NO_COMPILE = ["--fix", "compile_mode=none"]
# The models/ MLP at a size whose trial takes a second or two here.
TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256", *NO_COMPILE]

# One confirmation round (the default adds rounds until the speedup is known within ±3%), and no
# loss check (three runs of about 3 s more wherever the answer may change the numerics): a test
# of one round checks other behaviour than the answer; tests/end_to_end/test_answer_checks.py
# checks the loss.
CONFIRM_ONCE = ["--confirm-repeats", "1", "--confirm-max-rounds", "1", "--no-loss-check"]

# torch.compile costs ~30 s per model on CI's cores; a cache that outlives the run pays it once.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      str(Path.home() / ".cache" / "autotune-tests" / "inductor"))


def need(module: str, extra: str = "examples") -> None:
    """Skip a test whose optional library is not installed here; CI installs it, so fail there."""
    if importlib.util.find_spec(module) is not None:
        return
    message = f"{module} is not installed (pip install -e '.[{extra}]')"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


LANE = pytest.StashKey["Lane | None"]()


def pytest_configure(config: pytest.Config) -> None:
    open_lanes(config)
    config.stash[LANE] = Lane.of_this_worker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a lane, the files in the order the lanes take them (tests/lanes.py)."""
    if config.stash[LANE] is not None:
        schedule(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """A test in its lane (tests/lanes.py), or on the whole machine where it is marked so."""
    lane = item.config.stash[LANE]
    if lane is None:
        return (yield)
    whole = item.get_closest_marker("whole_machine") is not None
    with lane.whole_machine() if whole else lane.shared():
        return (yield)


@pytest.fixture
def knob_libraries_found(monkeypatch) -> None:
    """torchao and bitsandbytes found whether installed or not, for a test of what a device
    runs rather than of what is installed (.ci/torch_matrix's virtualenvs leave them out)."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return object() if name in ("torchao", "bitsandbytes") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m autotune ARGS` as a user would run it."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def cli(*args: str) -> subprocess.CompletedProcess:
    """`autotune ARGS` in this process, for the commands that only read a study (show, export,
    studies, report) or that end before one starts (bad input): a process of their own would
    import torch again for each."""
    from autotune.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["autotune", *args], code, out.getvalue(),
                                       err.getvalue())


@pytest.fixture
def write_model(tmp_path: Path):
    """Write a model file from source text; returns its path."""
    def write(source: str, name: str = "model.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


TINY_SOURCE = '''
import torch
from torch import nn

BASELINE = {"micro_batch_size": 8}


class Net(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))

    def forward(self, x, y):
        for block in self.blocks:
            x = torch.relu(block(x))
        return nn.functional.mse_loss(x.sum(dim=1), y)


def build_model(dim=8):
    return Net(dim)


def build_dataset(dim=8, size=256):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, dim, generator=g),
                                          torch.randn(size, generator=g))
'''


def _postgres_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or \
        ([shutil.which(name)] if shutil.which(name) else [])
    return found[-1] if found else None


class PostgresServer:
    """A private PostgreSQL server on loopback, started and stopped by the tests themselves."""

    user, password = "autotune", "s3cret-pw"

    def __init__(self, root: Path) -> None:
        initdb, self.pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
        if not (initdb and self.pg_ctl):
            message = "PostgreSQL's server binaries are not installed (.ci/run installs them)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.data = root / "data"
        self.data.mkdir()
        pwfile = root / "pw"
        pwfile.write_text(self.password)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # initdb refuses to run as root: the server runs as Debian's postgres user then.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(root, "postgres")
            for path in (self.data, pwfile):
                shutil.chown(path, "postgres")
        subprocess.run([*self.as_user, initdb, "-D", str(self.data), "-U", self.user,
                        "--auth=md5", f"--pwfile={pwfile}"], check=True, capture_output=True)
        self.start()

    @property
    def url(self) -> str:
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return (f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{database}")

    def new_database(self, name: str) -> str:
        """An empty database on this server; its URL."""
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user,
                                      password=self.password, dbname="postgres")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        connection.close()
        return self.url_of(name)

    def start(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-w", "-l",
                        str(self.data / "server.log"), "-o",
                        f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 "
                        "-c max_connections=400",
                        "start"], check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-w", "-m", "fast",
                        "stop"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    # Not under pytest's tmp root: that is private to root, and the server may run as postgres.
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    server = PostgresServer(root)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)
