"""Where the suite's own files are, from a clone and from an installed wheel, and where it may
write.

The repository keeps the task definitions and the recipe files in top-level folders (``tasks/``,
``recipes/``) and the committed reference results in ``results/reference/``. A wheel carries
``tasks/`` and ``recipes/`` inside the package, as ``suite/_shipped/<folder>/`` (setup.py copies
them at build time; nothing is duplicated in the repository); it does not carry the references (117
MB), so an installed suite reads them from ``SUITE_REFERENCE_ROOT`` or ``./results/reference`` and
says where to get them when they are absent.

Nothing is ever written inside an installed package: ``refuse_installed`` turns such a destination
into an error that names the directory to use instead.
"""

from __future__ import annotations

import os
import site
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# The clone (or source tree) holding this package, None for an installed wheel: a source tree has
# its pyproject.toml next to suite/, site-packages never has one.
CHECKOUT = PACKAGE.parent if (PACKAGE.parent / "pyproject.toml").is_file() else None
SHIPPED = ("tasks", "recipes")  # the top-level folders a wheel carries (setup.py)


def shipped_dir(folder: str) -> Path:
    """The suite's own ``tasks/`` or ``recipes/``: the clone's top-level folder, else the wheel's
    copy."""
    if folder not in SHIPPED:
        raise ValueError(f"shipped_dir: {folder!r} is not one of {SHIPPED}")
    for candidate in ([CHECKOUT / folder] if CHECKOUT else []) + [PACKAGE / "_shipped" / folder]:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the suite's {folder}/ folder is missing (looked in "
                            f"{CHECKOUT or PACKAGE}); reinstall the package, or run from a clone "
                            f"of {_repository()}")


def reference_root() -> Path:
    """The committed reference results: ``SUITE_REFERENCE_ROOT`` when set, else the clone's
    ``results/reference``, else ``results/reference`` under the current directory (an installed
    suite)."""
    if os.environ.get("SUITE_REFERENCE_ROOT"):
        return Path(os.environ["SUITE_REFERENCE_ROOT"]).expanduser().resolve()
    if CHECKOUT is not None:
        return CHECKOUT / "results" / "reference"
    return Path.cwd() / "results" / "reference"


def _repository() -> str:
    """The project's source repository as the installed metadata names it (a Project-URL), else a
    description."""
    from importlib import metadata

    try:
        urls = metadata.metadata("lowprec-rl-suite").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    return urls[0].split(",", 1)[-1].strip() if urls else "the suite's source repository"


def where_to_get_references() -> str:
    """One sentence for a command that found no reference: where the committed ones are."""
    return (f"the committed references are in results/reference/ of {_repository()} (a wheel does "
            "not carry them): run from a clone, or set "
            "SUITE_REFERENCE_ROOT=/path/to/clone/results/reference")


def _install_dirs() -> list[Path]:
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    dirs |= set(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(site.getusersitepackages())
    if CHECKOUT is None:
        dirs.add(str(PACKAGE))
    return [Path(d).resolve() for d in dirs if d]


def refuse_installed(path: Path, what: str) -> Path:
    """``path`` (resolved), or ValueError when it lies inside site-packages or the installed
    package."""
    resolved = Path(path).expanduser().resolve()
    for d in _install_dirs():
        if resolved.is_relative_to(d):
            raise ValueError(f"{what}: {resolved} is inside the installed packages ({d}); the "
                             "suite never writes there. Run from a clone, or give a directory of "
                             "your own (for references: SUITE_REFERENCE_ROOT=DIR)")
    return resolved
