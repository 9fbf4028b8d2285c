"""moesim from Python: simulate, sweep and tune Mixture-of-Experts scenarios in process.

A scenario is a dict (the YAML file's tree), a path to a scenario file, or the name of a bundled
scenario or model preset ("deepseek-v3", "quickstart"). Results come back as plain dicts; every
call that runs something has ``records``: a list of flat dicts that ``pandas.DataFrame`` takes
as they are::

    import moesim, pandas as pd
    sc = moesim.preset("mixtral-8x7b")
    sc["parallelism"]["zero"] = 1
    run = moesim.simulate(sc, engine="analytical")
    df = pd.DataFrame(run["records"])

Bad input raises ``moesim.InputError`` (a ValueError) with the message the command line prints
(file, line, key, what was expected). The documents are the command line's own: ``simulate``
returns what ``moesim simulate --json`` writes, ``tune`` what ``moesim tune --json`` writes.
"""

import json
import os

from . import _moesim

__all__ = ["InputError", "load", "preset", "presets", "simulate", "sweep", "tune", "version"]

InputError = _moesim.InputError
version = _moesim.version

# Where the bundled scenarios live: MOESIM_SCENARIOS, else the package's copy (setup.py) or, in
# the build tree, the source tree's (CMake writes _paths.py in both).
from ._paths import SCENARIOS_DIR as _BUNDLED


def _scenarios_dir():
    return os.environ.get("MOESIM_SCENARIOS", os.path.abspath(_BUNDLED))


def presets():
    """The names ``preset`` and every call taking a scenario accept: the model presets
    (scenarios/models/) and the bundled scenarios (scenarios/)."""
    root = _scenarios_dir()
    names = []
    for sub in ("models", ""):
        d = os.path.join(root, sub)
        if os.path.isdir(d):
            names += sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml"))
    return names


def _resolve(name):
    """A bundled scenario's path from its name (models first), or None."""
    root = _scenarios_dir()
    for sub in ("models", ""):
        p = os.path.join(root, sub, name + ".yaml")
        if os.path.isfile(p):
            return p
    return None


def _read(scenario, base_dir=None):
    """(text, path) of a scenario given as a dict, a path or a bundled name."""
    if isinstance(scenario, dict):
        # JSON is YAML: the loader reads it with the same rules. Relative paths in the dict
        # (calibration, traces) resolve against base_dir (default: the working directory).
        d = os.path.abspath(base_dir or os.getcwd())
        return json.dumps(scenario), os.path.join(d, "<dict>")
    if not isinstance(scenario, (str, os.PathLike)):
        raise TypeError(
            f"scenario: expected a dict, a path or a bundled name, got {type(scenario).__name__}")
    path = os.fspath(scenario)
    if not os.path.exists(path):
        found = _resolve(path)
        if found is None:
            close = [n for n in presets() if n.startswith(path[:3])]
            raise InputError(
                f"{path}: no such file, and no bundled scenario of that name"
                + (f" (did you mean {', '.join(close)}?)" if close else
                   f"; bundled: {', '.join(presets())}"))
        path = found
    with open(path, encoding="utf-8") as f:
        return f.read(), os.path.abspath(path)


def load(scenario):
    """The scenario as a dict (a path or a bundled name), to edit and pass back."""
    text, path = _read(scenario)
    return json.loads(_moesim.yaml_to_json(text, path))


def preset(name):
    """A bundled model preset or scenario by name, as a dict (``load`` of it)."""
    return load(name)


def _sets(set):
    if set is None:
        return []
    if isinstance(set, dict):
        return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in set.items()]
    return list(set)


def simulate(scenario, *, engine="", iterations=None, seed=None, strategies=None, set=None,
             base_dir=None):
    """Runs the scenario's strategy stacks (or the named ones).

    engine: "analytical", "flow" or "simgrid" ("" = the scenario's). set: {"key.path": value}
    edits, as ``--set``. Returns the ``simulate --json`` document with ``records``.
    """
    text, path = _read(scenario, base_dir)
    return json.loads(_moesim.simulate(text, path, _sets(set), engine, iterations, seed,
                                       list(strategies or [])))


def sweep(spec, *, engine="", jobs=0, set=None, base_dir=None):
    """Runs a sweep (a sweep file's path, or its tree as a dict whose ``base`` is a path relative
    to base_dir). Returns {"name", "engine", "points", "wall_s", "records"}: one record per point
    and strategy, with each axis key as a column."""
    if isinstance(spec, dict):
        d = os.path.abspath(base_dir or os.getcwd())
        text, path = json.dumps(spec), os.path.join(d, "<dict>")
    else:
        path = os.path.abspath(os.fspath(spec))
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return json.loads(_moesim.sweep(text, path, _sets(set), engine, int(jobs)))


def tune(scenario, *, budget=60.0, engine="auto", top=10, jobs=0, keep_layout=False,
         keep_pipeline=False, keep_memory=False, include_routing=False, set=None, base_dir=None):
    """Searches layouts and strategy stacks within ``budget`` seconds (docs/tune.md).

    Returns the ``tune --json`` document: ``ranked`` (best first), ``space``, ``search``,
    ``notes``; ``records`` (one flat dict per ranked candidate); and ``emit``, the best
    candidate's scenario file text (``moesim simulate`` reproduces its time).

    On a serving deployment (a scenario with ``serving:``) it searches the pool shapes for the
    scenario's SLO (docs/serving.md): ``ranked`` holds one flat dict per shape and strategy (also
    ``records``), ``met`` says whether the best meets the SLO, ``emit`` is its scenario or None."""
    text, path = _read(scenario, base_dir)
    doc = json.loads(_moesim.tune(text, path, _sets(set), float(budget), engine, int(top),
                                  int(jobs), bool(keep_layout), bool(keep_pipeline),
                                  bool(keep_memory), bool(include_routing)))
    if "met" in doc:  # a serving deployment's shapes
        doc["records"] = [dict(row, rank=i + 1) for i, row in enumerate(doc["ranked"])]
        return doc
    records = []
    for row in doc.get("ranked", []):
        rec = {"rank": row["rank"]}
        rec.update(row["parallelism"])
        for k in ("batch_per_gpu", "micro_batches", "experts_per_gpu", "recompute", "roles",
                  "changes_routing", "speedup"):
            rec[k] = row.get(k)
        rec["screen_step_time_s"] = row["screen"]["step_time_s"]
        rec["rerun_step_time_s"] = row["rerun"]["step_time_s"] if "rerun" in row else None
        rec["memory_bytes"] = row["screen"]["memory_bytes"]
        rec["decisions"] = row["screen"]["decisions"]
        records.append(rec)
    doc["records"] = records
    return doc
