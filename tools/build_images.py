"""Build the container images gpufleet's examples and tests run in, from Debian packages.

    localhost/gpufleet/debian:bookworm     mmdebstrap: bookworm minbase + images/base/packages.txt
    localhost/gpufleet/python:3.11         Debian's python3, /opt/venv with numpy and aiohttp,
                                           user app (1000:1000), HOME=/home/app, /workspace
    localhost/gpufleet/pytorch:2.13.0-cpu  the Python image + torch 2.13.0 (CPU)
    localhost/gpufleet/examples:<hash>     the PyTorch image + examples/**/*.py in /workspace
    localhost/gpufleet/busybox:1           Debian's busybox-static, every applet, /www/index.html

The recipes live in images/<name>/. Python packages come from wheels downloaded on the host
(`pip download --no-deps` of the pinned requirements.txt) and bound into the build, so
podman build itself needs no network; only mmdebstrap reaches Debian's mirror.

Each image carries the label gpufleet.io/recipe-hash: a hash of everything it is made from
(its Containerfile and files, the pinned requirements, the mmdebstrap options, the busybox
binary, its parent's hash). An image whose label matches its recipe is left alone, so a second
run takes seconds; change a recipe and that image and the ones built on it are rebuilt.

Usage: scripts/build-images.sh [NAME...] [--force] [--refs] [--pin-examples]
  NAME            base, python, pytorch, examples, busybox (default: all)
  --refs          print the image references as JSON (no podman needed) and exit
  --pin-examples  write the current examples tag into examples/**/*.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "images"
LABEL = "gpufleet.io/recipe-hash"
PARENT_LABEL = "gpufleet.io/parent-recipe-hash"
# Bump when the way images are built changes in a way the recipe files do not show.
BUILDER_VERSION = "1"

# This host (cgroup v1, capped rlimits) needs runc and explicit rlimits for RUN steps.
PODMAN_GLOBAL = ["--runtime", "runc"]
# One new layer per image and no layer cache: buildah does not key its cache on what a RUN
# step bind-mounts (the wheels), and the recipe hash already decides what to rebuild.
BUILD_OPTS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull=never", "--layers=false"]

SUITE = "bookworm"
# Part of the base recipe: a change here rebuilds everything.
MMDEBSTRAP_OPTS = [
    "--variant=minbase",
    "--format=tar",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
]
BUSYBOX = Path("/bin/busybox")


@dataclass(frozen=True)
class Image:
    name: str
    repository: str
    tag: str | None  # None: the first 12 characters of the recipe hash
    parent: str | None
    title: str


IMAGES: dict[str, Image] = {
    i.name: i
    for i in [
        Image("base", "localhost/gpufleet/debian", SUITE, None, "Debian bookworm minbase with python3"),
        Image("python", "localhost/gpufleet/python", "3.11", "base", "Python 3.11 (Debian) with numpy, aiohttp"),
        Image("pytorch", "localhost/gpufleet/pytorch", "2.13.0-cpu", "python", "PyTorch 2.13.0 (CPU)"),
        Image("examples", "localhost/gpufleet/examples", None, "pytorch", "gpufleet's examples' code"),
        Image("busybox", "localhost/gpufleet/busybox", "1", None, "Debian's busybox-static"),
    ]
}


class BuildError(Exception):
    pass


# --- recipes and their hashes (pure: files in, hashes out) --------------------------------


def recipe_inputs(name: str) -> list[tuple[str, Path]]:
    """The files an image is made from: (path in the build context, file on this machine)."""
    out = [(p.relative_to(RECIPES / name).as_posix(), p) for p in _files(RECIPES / name)]
    if name == "examples":
        out += [
            ("examples/" + p.relative_to(REPO / "examples").as_posix(), p)
            for p in _files(REPO / "examples")
            if p.suffix == ".py"
        ]
    if name == "busybox":
        if not BUSYBOX.exists():
            raise BuildError(f"{BUSYBOX} is missing: apt-get install busybox-static (scripts/setup.sh does)")
        out.append(("busybox", BUSYBOX))
    return sorted(out)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


_hashes: dict[str, str] = {}


def recipe_hash(name: str) -> str:
    if name not in _hashes:
        img = IMAGES[name]
        h = hashlib.sha256()
        h.update(f"gpufleet-images {BUILDER_VERSION}\n".encode())
        if img.parent:
            h.update(f"parent {recipe_hash(img.parent)}\n".encode())
        if name == "base":
            h.update(("mmdebstrap " + " ".join([*MMDEBSTRAP_OPTS, SUITE]) + "\n").encode())
        for arcname, path in recipe_inputs(name):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            executable = os.access(path, os.X_OK)
            h.update(f"file {arcname} {digest} {'x' if executable else '-'}\n".encode())
        _hashes[name] = h.hexdigest()
    return _hashes[name]


def ref(name: str) -> str:
    img = IMAGES[name]
    return f"{img.repository}:{img.tag or recipe_hash(name)[:12]}"


def pinned(requirements: Path) -> dict[str, str]:
    """name (normalized) -> version, from a requirements file of `name==version` lines."""
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
        if not m:
            raise BuildError(f"{requirements}: {line!r} is not pinned as name==version")
        out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(project: str) -> str:
    return re.sub(r"[-_.]+", "_", project).lower()


def pin_examples() -> list[Path]:
    """Point every example manifest that names the examples image at its current tag."""
    current = ref("examples")
    changed = []
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        text = path.read_text()
        new = re.sub(r"localhost/gpufleet/examples:[0-9a-f]{12}", current, text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


# --- the build (I/O) -------------------------------------------------------------------------


def cache_dir() -> Path:
    if os.environ.get("GPUFLEET_IMAGE_CACHE"):
        return Path(os.environ["GPUFLEET_IMAGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufleet" / "images"


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise BuildError(f"podman {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def inspect(image_ref: str) -> dict | None:
    proc = podman("image", "inspect", image_ref, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def _label(info: dict | None) -> str | None:
    if info is None:
        return None
    return ((info.get("Config") or {}).get("Labels") or {}).get(LABEL)


def say(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    # One build at a time per image store: several checkouts share it on one machine.
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("images: waiting for another image build to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


@dataclass
class Result:
    name: str
    ref: str
    built: bool
    seconds: float
    size: int


class Builder:
    def __init__(self, cache: Path, force: frozenset[str] = frozenset()) -> None:
        self.cache = cache
        self.force = force
        self.results: dict[str, Result] = {}
        self.superseded: list[str] = []

    def ensure(self, name: str) -> Result:
        if name in self.results:
            return self.results[name]
        img = IMAGES[name]
        want, image_ref = recipe_hash(name), ref(name)
        info = inspect(image_ref)
        have = _label(info)
        if have == want and name not in self.force:
            say(f"images: {image_ref} is up to date (recipe {want[:12]})")
            result = Result(name, image_ref, False, 0.0, int(info["Size"]))
        else:
            if img.parent:
                self.ensure(img.parent)
            why = "not built yet" if info is None else "forced" if have == want else "its recipe changed"
            say(f"images: building {image_ref} ({why})")
            t0 = time.monotonic()
            self._build(name, image_ref, want)
            new = inspect(image_ref)
            if new is None:
                raise BuildError(f"{image_ref} is missing after its build")
            self._drop_superseded(img, image_ref, new["Id"], info)
            result = Result(name, image_ref, True, time.monotonic() - t0, int(new["Size"]))
            say(f"images: built {image_ref} in {result.seconds:.1f}s ({result.size / 1e6:.0f} MB)")
        self.results[name] = result
        return result

    def _build(self, name: str, image_ref: str, want: str) -> None:
        ctx = self.cache / "context" / name
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        for arcname, path in recipe_inputs(name):
            if name == "busybox" and arcname == "busybox":
                continue
            dest = ctx / arcname
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        if (ctx / "requirements.txt").exists():
            self._wheels(name, ctx)
        if name == "base":
            self._mmdebstrap(ctx)
        if name == "busybox":
            _busybox_rootfs(ctx / "rootfs.tar", (RECIPES / "busybox" / "www"))
        log = self.cache / "logs" / f"{name}.log"
        cmd = [
            "podman", *PODMAN_GLOBAL, "build", *BUILD_OPTS,
            "--label", f"{LABEL}={want}",
            *(["--label", f"{PARENT_LABEL}={recipe_hash(IMAGES[name].parent)}"] if IMAGES[name].parent else []),
            "--label", f"org.opencontainers.image.title={IMAGES[name].title}",
            "--label", "org.opencontainers.image.source=images/" + name,
            "-t", image_ref, "-f", str(ctx / "Containerfile"), str(ctx),
        ]  # fmt: skip
        self._run(cmd, log, lambda line: line.startswith("STEP "))
        # The context holds a root filesystem or links to wheels: kept only when a build fails.
        shutil.rmtree(ctx, ignore_errors=True)

    def _run(self, cmd: list[str], log: Path, show) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if show(line):
                    say("    " + line.rstrip()[:140])
            rc = proc.wait()
        if rc != 0:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
            raise BuildError(f"{cmd[0]} {cmd[1]} ... exited {rc} (whole log: {log}):\n{tail}")

    def _wheels(self, name: str, ctx: Path) -> None:
        """Download the pinned wheels for the image's Python (cp311, this architecture) into a
        folder kept between runs, drop what is no longer pinned, and link them into the context."""
        requirements = ctx / "requirements.txt"
        pins = pinned(requirements)
        store = self.cache / "wheels" / name
        store.mkdir(parents=True, exist_ok=True)
        machine = platform.machine()
        platforms = [f"manylinux_2_{v}_{machine}" for v in (36, 35, 34, 31, 28, 27, 17, 5)]
        platforms += [f"manylinux2014_{machine}", f"manylinux1_{machine}"]
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311",
            *[a for p in platforms for a in ("--platform", p)],
            "-d", str(store), "-r", str(requirements),
        ]  # fmt: skip
        say(f"    pip download {len(pins)} pinned packages into {store}")
        self._run(cmd, self.cache / "logs" / f"{name}-pip.log", lambda line: line.startswith("Saved "))
        (ctx / "wheels").mkdir()
        for whl in sorted(store.glob("*.whl")):
            project, version = whl.name.split("-")[:2]
            if pins.get(_norm(project)) != version:
                whl.unlink()
                continue
            try:
                os.link(whl, ctx / "wheels" / whl.name)
            except OSError:
                shutil.copy2(whl, ctx / "wheels" / whl.name)

    def _mmdebstrap(self, ctx: Path) -> None:
        if shutil.which("mmdebstrap") is None:
            raise BuildError("mmdebstrap is missing: apt-get install mmdebstrap (scripts/setup.sh does)")
        lines = (ctx / "packages.txt").read_text().splitlines()
        packages = [p for p in (line.split("#", 1)[0].strip() for line in lines) if p]
        mirror = os.environ.get("GPUFLEET_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        security = os.environ.get("GPUFLEET_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
        cmd = [
            "mmdebstrap", *MMDEBSTRAP_OPTS, '--aptopt=Acquire::Retries "3"',
            "--include=" + ",".join(packages),
            SUITE, str(ctx / "rootfs.tar"),
            f"deb {mirror} {SUITE} main",
            f"deb {mirror} {SUITE}-updates main",
            f"deb {security} {SUITE}-security main",
        ]  # fmt: skip
        say(f"    mmdebstrap {SUITE} minbase + {', '.join(packages)} from {mirror}")
        self._run(cmd, self.cache / "logs" / "base-mmdebstrap.log", lambda line: line.startswith("I: "))

    def _drop_superseded(self, img: Image, image_ref: str, new_id: str, old: dict | None) -> None:
        """Remove what the new build replaced, so rebuilds do not pile up unnamed images: the
        image that had this name and, for a hash-tagged image, its other tags built on a parent
        that has been replaced since (other tags on the current parent may be another
        checkout's code, and cost a small layer each). Best effort: an image that a container
        or another image still uses stays; parents are tried again at the end of the run."""
        if old is not None and old["Id"] != new_id:
            self.superseded.append(old["Id"])
        if img.tag is None and img.parent:
            parent = recipe_hash(img.parent)
            listed = podman("images", "--format", "json", "--filter", f"reference={img.repository}", check=False)
            for entry in json.loads(listed.stdout or "[]") if listed.returncode == 0 else []:
                labels = entry.get("Labels") or {}
                if LABEL not in labels or labels.get(PARENT_LABEL) == parent:
                    continue
                for n in entry.get("Names") or []:
                    if n.startswith(img.repository + ":") and n != image_ref:
                        podman("rmi", n, check=False)
        self.remove_superseded()

    def remove_superseded(self) -> None:
        # A replaced parent goes once the replaced children built on it have gone.
        while self.superseded:
            left = [i for i in self.superseded if podman("rmi", i, check=False).returncode != 0 and inspect(i)]
            if len(left) == len(self.superseded):
                break
            self.superseded = left

def _busybox_rootfs(dest: Path, www: Path) -> None:
    """A root filesystem of the host's busybox-static, with a link per applet, written
    deterministically (fixed owners and times) so the same binary gives the same layer."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    }
    for p in sorted(www.rglob("*")):
        if p.is_file():
            files["www/" + p.relative_to(www).as_posix()] = p.read_bytes()

    def info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.size, ti.mtime = kind, mode, size, 0
        return ti

    with tarfile.open(dest, "w") as tar:
        for d, mode in [("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("root", 0o700),
                        ("sys", 0o555), ("tmp", 0o1777), ("www", 0o755)]:  # fmt: skip
            tar.addfile(info(d, tarfile.DIRTYPE, mode))
        data = BUSYBOX.read_bytes()
        tar.addfile(info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for applet in sorted(set(applets) - {"busybox"}):
            link = info(f"bin/{applet}", tarfile.SYMTYPE, 0o777)
            link.linkname = "busybox"
            tar.addfile(link)
        for name, content in sorted(files.items()):
            tar.addfile(info(name, tarfile.REGTYPE, 0o644, len(content)), io.BytesIO(content))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help=f"images to build: {', '.join(IMAGES)} (default: all)")
    p.add_argument("--force", action="store_true", help="rebuild the named images even when up to date")
    p.add_argument("--refs", action="store_true", help="print the image references as JSON and exit")
    p.add_argument("--pin-examples", action="store_true", help="write the examples tag into examples/**/*.yaml")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in IMAGES]
    if unknown:
        p.error(f"unknown image {', '.join(unknown)}; choose from {', '.join(IMAGES)}")
    names = args.names or list(IMAGES)
    try:
        if args.refs:
            print(json.dumps({n: ref(n) for n in IMAGES}, indent=2))
            return 0
        if args.pin_examples:
            for path in pin_examples():
                say(f"images: {path.relative_to(REPO)} now names {ref('examples')}")
            return 0
        if shutil.which("podman") is None:
            raise BuildError("podman is missing: run scripts/setup.sh (apt-get install podman runc)")
        cache = cache_dir()
        t0 = time.monotonic()
        builder = Builder(cache, force=frozenset(names if args.force else ()))
        with build_lock(cache):
            for n in names:
                builder.ensure(n)
        built = [r for r in builder.results.values() if r.built]
        say(f"images: {len(builder.results)} ready, {len(built)} built, in {time.monotonic() - t0:.1f}s")
        for r in builder.results.values():
            what = f"built in {r.seconds:.1f}s" if r.built else "up to date"
            say(f"  {r.ref:<44} {r.size / 1e6:>7.0f} MB  {what}")
        return 0
    except BuildError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
