"""The MLXBATCH_* switches read as booleans, one way: 1/true/yes/on, 0/false/no/off/empty, any
case; any other value is one line naming the variable and exit 2, before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxbatch.errors import UsageError
from mlxbatch.runtime import blas, flags


@pytest.mark.parametrize(
    "raw, on",
    [
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("OFF", False),
        ("", False),
    ],
)
def test_every_switch_reads_the_same_words(monkeypatch, raw, on):
    for name in flags.SWITCHES:
        monkeypatch.setenv(name, raw)
        assert flags.flag(name) is on


def test_an_unset_switch_has_its_default(monkeypatch):
    for name, default in flags.SWITCHES.items():
        monkeypatch.delenv(name, raising=False)
        assert flags.flag(name) is default


def test_no_fast_blas_0_keeps_the_fast_blas(monkeypatch):
    monkeypatch.delenv(flags.NO_FAST_BLAS, raising=False)
    chosen = blas.plan()
    if chosen is None:
        pytest.skip("no faster BLAS on this machine")
    monkeypatch.setenv(flags.NO_FAST_BLAS, "0")
    assert blas.plan() == chosen
    monkeypatch.setenv(flags.NO_FAST_BLAS, "yes")
    assert blas.plan() is None


def test_host_kernels_off_turns_them_off(monkeypatch):
    import mlx.core as mx

    from mlxbatch.model import hostops

    if mx.default_device() != mx.cpu:
        pytest.skip("the host kernels serve the CPU device")
    monkeypatch.setenv(flags.HOST_KERNELS, "off")
    assert not hostops.available(mx.float32)
    monkeypatch.setenv(flags.HOST_KERNELS, "true")
    assert hostops.available(mx.float32)


def test_another_value_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(flags.HOST_KERNELS, "maybe")
    with pytest.raises(UsageError, match="MLXBATCH_HOST_KERNELS='maybe'"):
        flags.flag(flags.HOST_KERNELS)
    assert "MLXBATCH_HOST_KERNELS" in blas.startup_problem()


@pytest.mark.parametrize("name", sorted(flags.SWITCHES))
def test_the_cli_refuses_a_switch_it_cannot_read(name):
    r = subprocess.run(
        [sys.executable, "-m", "mlxbatch", "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, name: "2"},
        timeout=300,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {name}='2'"), lines[0]
