"""recd as a user gets it: a wheel built from this checkout, installed into a fresh venv, runs
a shipped pipeline by name from a directory outside the checkout.

No network: the wheel is built with ``pip wheel --no-build-isolation`` (the build backend of
the running ``.venv``) from a copy of the sources (the checkout gets no ``build/`` or
``*.egg-info``), and installed with ``pip install --no-index --no-deps``. The ``cpu`` extra's
requirements (torch, fbgemm-gpu-cpu, ...) are not downloaded again: a ``.pth`` file in the
fresh venv puts the running venv's site-packages after its own, and the test checks that every
requirement of the installed recd's metadata (base + ``cpu``) is satisfied there. ``pip check``
is not used: torchrec is installed with ``--no-deps`` by design (its metadata asks for the CUDA
fbgemm-gpu; README "Installing"), so pip check reports it on every setup.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from recd.pipelines import SHIPPED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "recd")

# Run by the fresh venv's interpreter: where recd comes from, and its unmet requirements.
PROBE = """
import importlib.metadata as md, json, recd
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
problems = []
for text in md.requires("recd") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": "cpu"}):
        continue  # another extra
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(version, prereleases=True):
        problems.append(f"{req}: {version} installed")
dist = md.distribution("recd")
print(json.dumps({"file": recd.__file__, "dist": str(dist.locate_file("")),
                  "version": dist.version, "problems": problems}))
"""


def _why_not() -> str | None:
    """Why this environment cannot build and install a wheel offline (None: it can)."""
    for module in ("venv", "ensurepip"):
        if importlib.util.find_spec(module) is None:
            return f"the interpreter has no {module} module (Debian: apt install python3-venv)"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in requires:
        req = Requirement(text)
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return f"build requirement {req} is not installed in {sys.prefix} (offline build)"
        if not req.specifier.contains(version, prereleases=True):
            return f"build requirement {req}: {version} installed in {sys.prefix}"
    return None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "RECD_PROGRESS": "0", "PYTHONNOUSERSITE": "1", "PIP_NO_INDEX": "1"}


def _run(argv: list[str | Path], *, cwd: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return done


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", dist, src],
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("recd-*.whl")
    return wheel


def test_wheel_installs_into_a_fresh_venv_and_runs_a_shipped_pipeline(tmp_path: Path) -> None:
    reason = _why_not()
    if reason is not None:
        pytest.skip(f"cannot build and install a wheel offline here: {reason}")

    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in SHIPPED.values():
        for file in shipped.files:
            assert f"recd/pipelines/{file}" in names, f"{file} is not in {wheel.name}"
    assert {"recd/profiles/small.toml", "recd/cli/init.py"} <= names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, timeout=300)
    python = venv / "bin" / "python"
    _run(
        [python, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
         "-q", wheel],
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    # Only now (pip must not see the checkout's editable recd while it installs): the running
    # venv's packages after the fresh venv's own, for the dependencies.
    site = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=tmp_path,
            timeout=60,
        ).stdout.strip()
    )
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "recd-test-deps.pth").write_text("".join(f"{p}\n" for p in ours))

    outside = tmp_path / "user"  # cwd outside the checkout: it cannot be imported from here
    outside.mkdir()
    probe = json.loads(_run([python, "-c", PROBE], cwd=outside, timeout=300).stdout)
    assert Path(probe["file"]).is_relative_to(venv), probe
    assert Path(probe["dist"]).resolve() == site.resolve(), probe
    assert probe["problems"] == [], probe
    package = Path(probe["file"]).parent
    assert not package.is_relative_to(ROOT)
    before = sorted(
        p.relative_to(package) for p in package.rglob("*") if "__pycache__" not in p.parts
    )

    recd = venv / "bin" / "recd"
    listed = _run([recd, "init", "--list"], cwd=outside, timeout=120).stdout
    assert [line.split()[0] for line in listed.splitlines()] == list(SHIPPED)

    done = _run([recd, "run", "--config", "small"], cwd=outside, timeout=600)
    work = outside / "runs" / "small"
    assert f"shipped small ({package / 'pipelines' / 'small.toml'})" in done.stdout
    assert (work / "train" / "step_000300.bin").is_file(), done.stdout[-3000:]
    report = json.loads((work / "report.json").read_text())
    assert Path(report["config"]["config_dir"]) == (package / "pipelines").resolve()
    assert report["train"]["steps"] == 300
    after = sorted(
        p.relative_to(package) for p in package.rglob("*") if "__pycache__" not in p.parts
    )
    assert after == before, "recd run wrote into the installed package"
