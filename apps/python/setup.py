"""pip install --no-build-isolation apps/python: the moesim package.

The native module is built by the project's CMake build (MOESIM_BUILD_DIR, default build/ at the
repository root; configured here if it is not yet), for the Python running this install, and
copied into the package with the bundled scenarios. Nothing is downloaded: setuptools and wheel
come from the system (Debian's python3-setuptools, python3-wheel), hence --no-build-isolation.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("MOESIM_BUILD_DIR", ROOT / "build")).resolve()


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*moesim\s+VERSION\s+([0-9.]+)", text)
    return m.group(1) if m else "0"


class BuildNative(build_py):
    def run(self):
        super().run()
        if not (BUILD / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(BUILD),
                                   "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", str(BUILD), "--target", "_moesim", "-j",
                               str(os.cpu_count() or 2)])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        native = BUILD / "python" / "moesim" / f"_moesim{suffix}"
        if not native.exists():
            built = sorted(p.name for p in (BUILD / "python" / "moesim").glob("_moesim*"))
            raise SystemExit(
                f"setup.py: {native} was not built for this Python ({sys.executable}, "
                f"{suffix}); {BUILD} has {built or 'none'}: reconfigure it with "
                f"-DPython_EXECUTABLE={sys.executable}, or set MOESIM_BUILD_DIR")
        dest = Path(self.build_lib) / "moesim"
        shutil.copy2(native, dest / native.name)
        # The bundled scenarios travel with the package (relative paths inside them still hold).
        shutil.copytree(ROOT / "scenarios", dest / "scenarios", dirs_exist_ok=True)
        (dest / "_paths.py").write_text(
            "import os\n\nSCENARIOS_DIR = os.path.join(os.path.dirname(__file__), 'scenarios')\n")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: the package holds a native module
        return True


setup(
    name="moesim",
    version=project_version(),
    description="Discrete-event cluster simulator for Mixture-of-Experts training and inference",
    packages=["moesim"],
    package_dir={"moesim": "moesim"},
    cmdclass={"build_py": BuildNative},
    distclass=BinaryDistribution,
    python_requires=">=3.9",
    zip_safe=False,
)
