"""The wheel carries the repository's top-level ``tasks/`` and ``recipes/`` folders inside the package, as
``suite/_shipped/<folder>/`` (suite/locations.py finds them there; in a clone or an editable install it reads
the top-level folders themselves). Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("tasks", "recipes")  # suite/locations.py SHIPPED


class BuildPyWithShippedFolders(build_py):
    """build_py, plus a copy of each shipped folder's YAML files into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout's folders
            return
        for folder in SHIPPED:
            for src in sorted(Path(folder).glob("*.yaml")):
                dest = Path(self.build_lib) / "suite" / "_shipped" / src
                self.mkpath(str(dest.parent))
                self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithShippedFolders})
