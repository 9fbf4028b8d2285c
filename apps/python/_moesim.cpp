// The Python module's native half: the library's in-process entry points (apps/moesim/api.hpp),
// each taking YAML text and answering with JSON text, which moesim/__init__.py turns into dicts
// and records. Strings both ways keep this file thin: the documents are the CLI's own.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "apps/moesim/api.hpp"
#include "core/error.hpp"

namespace py = pybind11;
using moesim::app::SimulateRequest;
using moesim::app::TuneRequest;

namespace {

std::string simulate(const std::string& text, const std::string& path,
                     const std::vector<std::string>& sets, const std::string& engine,
                     std::optional<int> iterations, std::optional<std::uint64_t> seed,
                     const std::vector<std::string>& strategies) {
  SimulateRequest r;
  r.text = text;
  r.path = path;
  r.sets = sets;
  r.engine = engine;
  r.iterations = iterations;
  r.seed = seed;
  r.strategies = strategies;
  py::gil_scoped_release unlocked;  // a run takes seconds; other Python threads go on
  return moesim::app::simulate_text(r).dump();
}

std::string sweep(const std::string& text, const std::string& path,
                  const std::vector<std::string>& sets, const std::string& engine, int jobs) {
  py::gil_scoped_release unlocked;
  return moesim::app::sweep_text(text, path, sets, engine, jobs).dump();
}

std::string tune(const std::string& text, const std::string& path,
                 const std::vector<std::string>& sets, double budget_s, const std::string& engine,
                 int top, int jobs, bool keep_layout, bool keep_pipeline, bool keep_memory,
                 bool include_routing) {
  TuneRequest r;
  r.text = text;
  r.path = path;
  r.sets = sets;
  r.budget_s = budget_s;
  r.engine = engine;
  r.top = top;
  r.jobs = jobs;
  r.keep_layout = keep_layout;
  r.keep_pipeline = keep_pipeline;
  r.keep_memory = keep_memory;
  r.include_routing = include_routing;
  py::gil_scoped_release unlocked;
  return moesim::app::tune_text(r).dump();
}

std::string yaml_to_json(const std::string& text, const std::string& path) {
  return moesim::app::yaml_text_to_json(text, path).dump();
}

}  // namespace

PYBIND11_MODULE(_moesim, m) {
  m.doc() = "moesim's simulator, in process (use the moesim package, not this module)";
  // Bad input (the CLI's exit 2) is a ValueError; a broken invariant in moesim a RuntimeError.
  static py::exception<moesim::InputError> input_error(m, "InputError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moesim::InputError& e) {
      PyErr_SetString(input_error.ptr(), e.what());
    }
  });
  m.attr("version") = MOESIM_VERSION;
  m.def("simulate", &simulate, py::arg("text"), py::arg("path"), py::arg("sets"), py::arg("engine"),
        py::arg("iterations"), py::arg("seed"), py::arg("strategies"));
  m.def("sweep", &sweep, py::arg("text"), py::arg("path"), py::arg("sets"), py::arg("engine"),
        py::arg("jobs"));
  m.def("tune", &tune, py::arg("text"), py::arg("path"), py::arg("sets"), py::arg("budget_s"),
        py::arg("engine"), py::arg("top"), py::arg("jobs"), py::arg("keep_layout"),
        py::arg("keep_pipeline"), py::arg("keep_memory"), py::arg("include_routing"));
  m.def("yaml_to_json", &yaml_to_json, py::arg("text"), py::arg("path"));
}
