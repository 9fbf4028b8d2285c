"""The Python package against the command line: the same scenario gives the same figures, results
are records pandas.DataFrame takes, bad input raises InputError with the CLI's message.

Run by ctest (tests/python/CMakeLists.txt) with the interpreter scripts/setup.sh installed the
package into; MOESIM_BINARY names the moesim binary of the same build.
"""

import json
import os
import subprocess
import tempfile
import unittest

import pandas as pd

import moesim

BINARY = os.environ.get("MOESIM_BINARY", "")
SOURCE = os.environ.get("MOESIM_SOURCE_DIR", "")


def cli_json(*args):
    """`moesim ARGS --json F`'s document."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        subprocess.run([BINARY, *args, "--json", out, "-q"], check=True, capture_output=True)
        with open(out) as f:
            return json.load(f)


class Presets(unittest.TestCase):
    def test_names_include_the_model_presets_and_the_quickstart(self):
        names = moesim.presets()
        for n in ("deepseek-v3", "mixtral-8x7b", "qwen3-235b-a22b", "quickstart"):
            self.assertIn(n, names)

    def test_a_preset_is_the_file_as_a_dict(self):
        sc = moesim.preset("mixtral-8x7b")
        self.assertEqual(sc["model"]["experts"], 8)  # numbers are numbers
        self.assertEqual(sc["model"]["top_k"], 2)
        self.assertEqual(sc["cluster"]["gpu"], "h100-sxm")
        self.assertEqual(sc["model"]["capacity_factor"], 0)

    def test_an_unknown_name_is_an_input_error_naming_what_exists(self):
        with self.assertRaises(moesim.InputError) as e:
            moesim.preset("mixtral-9x9b")
        self.assertIn("mixtral-8x7b", str(e.exception))
        self.assertTrue(issubclass(moesim.InputError, ValueError))


class Simulate(unittest.TestCase):
    def test_a_preset_simulates_as_the_cli_does_and_builds_a_dataframe(self):
        run = moesim.simulate("mixtral-8x7b", engine="analytical", strategies=["baseline"])
        df = pd.DataFrame(run["records"])
        self.assertEqual(list(df["strategy"]), ["baseline"])
        for col in ("step_time_s", "a2a_s", "compute_s", "exposed_comm_s", "memory_bytes",
                    "fits_memory", "mfu", "tokens_per_s_per_gpu", "decisions"):
            self.assertIn(col, df.columns)
        self.assertEqual(df["step_time_s"].dtype.kind, "f")
        cli = cli_json("simulate", os.path.join(SOURCE, "scenarios/models/mixtral-8x7b.yaml"),
                       "--engine", "analytical", "--strategy", "baseline")
        self.assertEqual(run["runs"][0]["step_time_s"], cli["runs"][0]["step_time_s"])
        self.assertEqual(df["step_time_s"][0], cli["runs"][0]["step_time_s"])
        # Mixtral at EP 8 x DP 8 needs ~150 GiB with Adam (docs): the record says it does not fit.
        self.assertFalse(df["fits_memory"][0])

    def test_an_edited_dict_is_what_set_gives_on_the_command_line(self):
        sc = moesim.preset("quickstart")
        sc["model"]["seq_len"] = 256
        sc["engine"]["network"] = "analytical"
        run = moesim.simulate(sc)
        cli = cli_json("simulate", os.path.join(SOURCE, "scenarios/quickstart.yaml"),
                       "--set", "model.seq_len=256", "--engine", "analytical")
        self.assertEqual([r["strategy"] for r in run["records"]],
                         [r["strategy"] for r in cli["runs"]])
        for mine, theirs in zip(run["runs"], cli["runs"]):
            self.assertEqual(mine["step_time_s"], theirs["step_time_s"])
        # Speedups against the scenario's baseline, as the table prints them.
        self.assertEqual(run["records"][0]["speedup"], 1.0)

    def test_set_iterations_and_seed(self):
        a = moesim.simulate("quickstart", engine="analytical", iterations=2, seed=7,
                            set={"model.seq_len": 256})
        b = cli_json("simulate", os.path.join(SOURCE, "scenarios/quickstart.yaml"), "--engine",
                     "analytical", "--iterations", "2", "--seed", "7", "--set",
                     "model.seq_len=256")
        self.assertEqual(a["seed"], 7)
        self.assertEqual([r["step_time_s"] for r in a["runs"]],
                         [r["step_time_s"] for r in b["runs"]])

    def test_a_serving_scenario_answers_with_its_serving_figures(self):
        sets = {"serving.requests.count": 300}
        run = moesim.simulate("serving-mixtral-h100", engine="analytical", set=sets)
        cli = cli_json("simulate", os.path.join(SOURCE, "scenarios/serving-mixtral-h100.yaml"),
                       "--engine", "analytical", "--set", "serving.requests.count=300")
        self.assertEqual([r["strategy"] for r in run["serving"]], ["grouped", "deepep"])
        df = pd.DataFrame(run["serving"])
        for col in ("ttft_s", "tpot_s", "output_tokens_per_s_per_node", "kv_utilization", "pools"):
            self.assertIn(col, df.columns)
        self.assertEqual(run["serving"][0]["tpot_s"]["p50"], cli["serving"][0]["tpot_s"]["p50"])
        self.assertEqual(run["serving"][0]["requests"]["count"], 300)

    def test_bad_input_raises_the_clis_message(self):
        sc = moesim.preset("quickstart")
        sc["model"]["top_k"] = "two"
        with self.assertRaises(moesim.InputError) as e:
            moesim.simulate(sc)
        self.assertIn("model.top_k", str(e.exception))
        with self.assertRaises(moesim.InputError) as e:
            moesim.simulate("quickstart", engine="warp")
        self.assertIn("warp", str(e.exception))
        with self.assertRaises(TypeError):
            moesim.simulate(42)


class Sweep(unittest.TestCase):
    def test_a_sweep_dict_gives_one_record_per_point_and_strategy(self):
        spec = {"name": "py", "base": os.path.join(SOURCE, "scenarios/quickstart.yaml"),
                "set": {"engine.network": "analytical", "workload.iterations": 1},
                "axes": {"model.seq_len": [256, 512]}, "strategies": ["baseline", "pipemoe"]}
        res = moesim.sweep(spec, jobs=1)
        df = pd.DataFrame(res["records"])
        self.assertEqual(len(df), 4)
        self.assertEqual(sorted(set(df["model.seq_len"])), [256, 512])  # axis values as numbers
        self.assertEqual(set(df["strategy"]), {"baseline", "pipemoe"})
        # A longer sequence takes longer on every strategy.
        for s in ("baseline", "pipemoe"):
            rows = df[df["strategy"] == s].sort_values("model.seq_len")
            self.assertLess(rows["step_time_s"].iloc[0], rows["step_time_s"].iloc[1])

    def test_a_serving_sweep_gives_the_throughput_latency_curve(self):
        spec = {"name": "rate", "base": os.path.join(SOURCE, "scenarios/serving-mixtral-h100.yaml"),
                "set": {"engine.network": "analytical", "serving.requests.count": 200},
                "axes": {"serving.requests.requests_per_s": [4, 32]}, "strategies": ["grouped"]}
        df = pd.DataFrame(moesim.sweep(spec, jobs=2)["records"]).sort_values(
            "serving.requests.requests_per_s")
        self.assertEqual(len(df), 2)
        for col in ("tpot_p50_s", "ttft_p99_s", "output_tokens_per_s_per_node", "slo_attainment"):
            self.assertIn(col, df.columns)
        # Eight times the rate: more than twice the tokens per node.
        tps = list(df["output_tokens_per_s_per_node"])
        self.assertGreater(tps[1], 2 * tps[0])


class Tune(unittest.TestCase):
    def test_tune_ranks_and_its_emitted_scenario_reproduces_the_time(self):
        res = moesim.tune("quickstart", budget=20, engine="analytical", top=3, keep_layout=True)
        df = pd.DataFrame(res["records"])
        self.assertGreaterEqual(len(df), 1)
        self.assertTrue((df["screen_step_time_s"].diff().dropna() >= 0).all())  # best first
        self.assertIsNotNone(res["emit"])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "best.yaml")
            with open(path, "w") as f:
                f.write(res["emit"])
            run = moesim.simulate(path, engine="analytical", strategies=["tuned"])
        self.assertAlmostEqual(run["records"][0]["step_time_s"], df["screen_step_time_s"][0],
                               delta=1e-9 * df["screen_step_time_s"][0])

    def test_a_serving_deployment_tunes_its_pools_for_its_slo(self):
        sets = {"engine.network": "analytical", "serving.requests.count": 200}
        res = moesim.tune("serving-mixtral-h100", budget=600, jobs=2, set=sets)
        self.assertTrue(res["met"])
        df = pd.DataFrame(res["records"])
        self.assertEqual(len(df), 12)  # 6 shapes run, 2 strategies each (docs/serving.md)
        self.assertTrue(df["meets"].iloc[0])
        self.assertIsNotNone(res["emit"])


if __name__ == "__main__":
    unittest.main()
