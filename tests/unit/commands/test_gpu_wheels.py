"""`make gpu-wheels` fetches everything the GPU check needs beyond the GPU image: every dependency of the
packages it ships (read from the installed distributions' metadata, for Python 3.12 on Linux) is shipped too
or comes with the image's own packages."""

import re
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness import REPO_ROOT

SCRIPT = (REPO_ROOT / "tools" / "gpu_wheels.sh").read_text()
# The GPU machine's interpreter and platform, for the requirements' environment markers.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def names(variable: str) -> set:
    return {canonicalize_name(n) for n in re.search(rf'^{variable}="([^"]*)"', SCRIPT, re.M).group(1).split()}


def requirements(name: str) -> set:
    """What `name` needs installed on the target (no extras)."""
    wanted = (Requirement(text) for text in metadata.requires(name) or [])
    return {canonicalize_name(r.name) for r in wanted if r.marker is None or r.marker.evaluate(TARGET)}


def closure(roots: set, strict: bool) -> set:
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(requirements(name) - seen)
        except metadata.PackageNotFoundError:
            assert not strict, f"{name} is not installed here, so its wheel's version is unknown"
    return seen


def test_every_dependency_of_the_shipped_wheels_is_shipped_or_on_the_image():
    shipped, image = names("PACKAGES"), closure(names("IMAGE"), strict=False)
    missing = closure(shipped, strict=True) - shipped - image
    assert not missing, f"add to PACKAGES in tools/gpu_wheels.sh: {sorted(missing)}"
    assert {"deepspeed", "hydra-core", "omegaconf"} <= shipped  # what the image lacks and the check imports


def test_the_sdist_only_packages_are_built_not_downloaded():
    assert names("SDIST_ONLY") == {"deepspeed", "antlr4-python3-runtime"} and names("SDIST_ONLY") <= names("PACKAGES")
