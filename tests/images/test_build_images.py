"""scripts/build-images.sh (tools/build_images.py): recipe hashes, the skip when nothing
changed, the rebuild when something did, and what the images hold, run in real containers."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest
from oci_images import BUILD, REPO, _env, ensure_images, image_refs

RUN = ["podman", "--runtime", "runc", "run", "--rm", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


@pytest.fixture
def builder_module(monkeypatch):
    """A fresh copy of the builder module: its hash memo and image table are per test."""
    spec = importlib.util.spec_from_file_location("build_images_under_test", REPO / "tools" / "build_images.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=timeout, check=False)


def label(ref: str) -> str:
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", '{{index .Labels "gpufleet.io/recipe-hash"}}', ref],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_recipe_change_rehashes_that_image_and_the_ones_built_on_it(builder_module, tmp_path):
    bi = builder_module
    shutil.copytree(REPO / "images", tmp_path / "images")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    bi.RECIPES, bi.REPO = tmp_path / "images", tmp_path
    before = {n: bi.recipe_hash(n) for n in bi.IMAGES}
    assert bi.ref("examples") == f"localhost/gpufleet/examples:{before['examples'][:12]}"

    req = tmp_path / "images" / "python" / "requirements.txt"
    req.write_text(req.read_text() + "# a comment is a change too\n")
    bi._hashes.clear()
    after_python = {n: bi.recipe_hash(n) for n in bi.IMAGES}
    changed = {n for n in bi.IMAGES if after_python[n] != before[n]}
    assert changed == {"python", "pytorch", "examples"}

    # The examples' code is part of the examples image; their manifests are not.
    bi._hashes.clear()
    (tmp_path / "examples" / "training" / "train.py").write_text("print('changed')\n")
    (tmp_path / "examples" / "training" / "pytorchjob.yaml").write_text("# edited\n")
    after_code = {n: bi.recipe_hash(n) for n in bi.IMAGES}
    assert {n for n in bi.IMAGES if after_code[n] != after_python[n]} == {"examples"}


def test_requirements_must_be_pinned(builder_module, tmp_path):
    bad = tmp_path / "requirements.txt"
    bad.write_text("numpy>=2\n")
    with pytest.raises(builder_module.BuildError, match=r"'numpy>=2' is not pinned as name==version"):
        builder_module.pinned(bad)
    bad.write_text("Typing-Extensions==4.16.0  # comment\n\n")
    assert builder_module.pinned(bad) == {"typing_extensions": "4.16.0"}


def test_the_example_manifests_name_the_current_examples_image():
    current = image_refs()["examples"]
    named = {}
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for tag in re.findall(r"localhost/gpufleet/examples:\S+", path.read_text()):
            named[f"{path.relative_to(REPO)}: {tag}"] = tag
    assert named, "no example manifest names the examples image"
    stale = [where for where, tag in named.items() if tag != current]
    assert not stale, f"these name an old examples image; run scripts/build-images.sh --pin-examples: {stale}"


def test_a_second_run_builds_nothing():
    refs = ensure_images("busybox", "python")
    proc = subprocess.run(
        ["bash", str(BUILD), "busybox", "python"], capture_output=True, text=True, timeout=300, env=_env(), check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 ready, 0 built" in proc.stdout, proc.stdout
    for ref in refs.values():
        assert f"{ref} is up to date" in proc.stdout


def test_a_changed_recipe_is_rebuilt_and_the_old_image_removed(builder_module, tmp_path):
    bi = builder_module
    repository = "localhost/gpufleet-test/busybox-rebuild"
    bi.IMAGES["busybox"] = bi.Image("busybox", repository, "1", None, "rebuild test")
    shutil.copytree(REPO / "images", tmp_path / "images")
    bi.RECIPES = tmp_path / "images"
    ref = f"{repository}:1"
    try:
        first = bi.Builder(tmp_path / "cache").ensure("busybox")
        assert first.built and label(ref) == bi.recipe_hash("busybox")
        again = bi.Builder(tmp_path / "cache").ensure("busybox")
        assert not again.built

        (tmp_path / "images" / "busybox" / "www" / "index.html").write_text("changed\n")
        bi._hashes.clear()
        old_id = _image_id(ref)
        rebuilt = bi.Builder(tmp_path / "cache").ensure("busybox")
        assert rebuilt.built and label(ref) == bi.recipe_hash("busybox")
        assert _image_id(ref) != old_id
        assert subprocess.run(["podman", "image", "exists", old_id], check=False).returncode == 1
        out = run(ref, "cat", "/www/index.html")
        assert out.stdout == "changed\n", out.stderr
    finally:
        subprocess.run(["podman", "rmi", ref], capture_output=True, check=False)


def _image_id(ref: str) -> str:
    return subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_every_image_carries_its_recipe_hash(builder_module):
    refs = ensure_images("busybox", "python")
    for name, ref in refs.items():
        assert label(ref) == builder_module.recipe_hash(name)


def test_the_python_image_runs_as_app_with_numpy_and_aiohttp():
    ref = ensure_images("python")["python"]
    probe = (
        "import json, os, sys, numpy, aiohttp; "
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'home': os.environ['HOME'], "
        "'cwd': os.getcwd(), 'python': sys.executable, 'version': sys.version_info[:2], "
        "'numpy': numpy.__version__, 'aiohttp': aiohttp.__version__}))"
    )
    proc = run(ref, "python", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {
        "uid": 1000, "gid": 1000, "home": "/home/app", "cwd": "/workspace", "python": "/opt/venv/bin/python",
        "version": [3, 11], "numpy": "2.4.6", "aiohttp": "3.14.5",
    }  # fmt: skip
    tools = run(ref, "sh", "-c", "command -v ps ip python3 && test -w /workspace && test -s /etc/ssl/certs/ca-certificates.crt")
    assert tools.returncode == 0, tools.stdout + tools.stderr


@pytest.mark.timeout(1500)
def test_the_examples_image_trains_with_ddp_on_gloo():
    # A cold build of the PyTorch image (a minute or two) may land here.
    ref = ensure_images("examples")["examples"]
    proc = run(
        "--init", ref,
        "python", "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "examples/training/train.py", "--steps", "20", "--log-every", "10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "done step=20 world_size=2 rank=0" in proc.stdout, proc.stdout
    version = run(ref, "python", "-c", "import torch; print(torch.__version__, torch.cuda.is_available())")
    assert version.stdout.split() == ["2.13.0+cpu", "False"], version.stderr
