// `moesim list [--dir D]`: the bundled scenario library (scenarios/*.yaml, scenarios/models/*.yaml,
// scenarios/sweeps/*.yaml, scenarios/topologies/*.yaml) with each file's `description:`, so users
// find the experiment to start from without opening every file.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "apps/moesim/commands.hpp"
#include "core/error.hpp"
#include "core/hf_config.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {

namespace {

namespace fs = std::filesystem;

struct ListArgs {
  std::string dir;
};

// Words of `text` wrapped at `width` columns, each line indented by `indent` spaces.
std::string wrap(const std::string& text, std::size_t indent, std::size_t width) {
  std::istringstream ss(text);
  std::string word, line, out;
  while (ss >> word) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

void list_folder(const fs::path& dir, const std::string& title) {
  if (!fs::is_directory(dir)) return;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && (e.path().extension() == ".yaml" || e.path().extension() == ".yml"))
      files.push_back(e.path());
  if (files.empty()) return;
  std::sort(files.begin(), files.end());
  fmt::print("{} ({}):\n", title, dir.string());
  for (const auto& f : files) {
    std::string description, error;
    try {
      // The bounded loader: a folder given with --dir may hold anything (an alias bomb too).
      YAML::Node root = load_yaml_file(f.string());
      if (root.IsMap() && root["description"] && root["description"].IsScalar())
        description = root["description"].Scalar();
    } catch (const InputError& e) {
      error = fmt::format("(unreadable: {})", e.what());
    } catch (const YAML::Exception& e) {
      error = fmt::format("(unreadable: {})", e.what());
    }
    fmt::print("  {}\n", f.filename().string());
    std::string text = !error.empty()        ? error
                       : description.empty() ? "(no description)"
                                             : description;
    fmt::print("{}", wrap(text, 6, 100));
  }
  fmt::print("\n");
}

// Hugging Face config.json files: what each reads as (core/hf_config.hpp).
void list_hf_configs(const fs::path& dir) {
  if (!fs::is_directory(dir)) return;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  if (files.empty()) return;
  std::sort(files.begin(), files.end());
  fmt::print("Hugging Face configs, for a scenario's `model: {{hf_config: PATH}}` ({}):\n",
             dir.string());
  for (const auto& f : files) {
    fmt::print("  {}\n", f.filename().string());
    std::string text;
    try {
      const HfImport imp = import_hf_config(f.string());
      const YAML::Node& m = imp.model;
      text = fmt::format("{}: {} blocks, M {}, {} experts of {}, top-{}", imp.family,
                         m["layers"].Scalar(), m["model_dim"].Scalar(), m["experts"].Scalar(),
                         m["expert_hidden_dim"].Scalar(), m["top_k"].Scalar());
    } catch (const InputError& e) {
      text = fmt::format("(unreadable: {})", e.what());
    }
    fmt::print("{}", wrap(text, 6, 100));
  }
  fmt::print("\n");
}

void run_list(const ListArgs& a) {
  fs::path root = a.dir.empty() ? fs::path(MOESIM_SOURCE_DIR) / "scenarios" : fs::path(a.dir);
  if (!fs::is_directory(root))
    throw InputError(fmt::format("--dir {}: not a folder", root.string()));
  list_folder(root, "Scenarios (run with `moesim simulate FILE` or `moesim compare FILE`)");
  list_folder(root / "models",
              "Model presets, published dimensions (run with `moesim simulate FILE`)");
  list_hf_configs(root / "models" / "hf");
  list_folder(root / "sweeps", "Sweeps (run with `moesim sweep FILE`)");
  list_folder(root / "topologies",
              "Topologies (use with `moesim compare SCENARIO --topology FILE`)");
}

}  // namespace

void register_list(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List the bundled scenarios, sweeps and topologies");
  auto a = std::make_shared<ListArgs>();
  cmd->add_option("--dir", a->dir, "Scenario folder (default: the bundled scenarios/)");
  cmd->callback([a] { run_list(*a); });
}

}  // namespace moesim::app
