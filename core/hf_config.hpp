// Hugging Face config.json import (docs/model.md, "Importing a Hugging Face config"): reads the
// architecture of a published MoE checkpoint and returns the moesim `model:` keys that describe
// the same model, so a scenario can say `model: {hf_config: path}` instead of copying dimensions.
//
// Families: DeepSeek-V2 / V3 (`deepseek_v2`, `deepseek_v3`), Mixtral (`mixtral`), Qwen2-MoE
// (`qwen2_moe`), Qwen3-MoE (`qwen3_moe`), OLMoE (`olmoe`), gpt-oss (`gpt_oss`) and Llama 4
// (`llama4` with its `text_config`, or a bare `llama4_text`). Only architecture keys come back
// (layers, dimensions, experts, attention, vocabulary, MTP depth); the run's own keys (mode,
// batch_per_gpu, seq_len, micro_batches, capacity_factor, dtype, precision, recompute) stay the
// scenario's. Every field of the file is accounted for: mapped, known to have no cost
// (tokenizer ids, rope_theta, dtype, ...), `ignored` (changes behaviour moesim does not model,
// with the reason), or `unknown`.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moesim {

struct HfImport {
  YAML::Node model;                  // the moesim `model:` keys, a map
  std::vector<std::string> unknown;  // fields neither mapped nor known ("text_config.x"), sorted
  // Fields (and fixed features of the family) that change the model in ways moesim does not
  // model, each "field: reason" (e.g. "topk_group: group-limited routing (set
  // workload.routing.node_limit)"), sorted.
  std::vector<std::string> ignored;
  std::string family;  // the model_type it was read as ("deepseek_v3", "llama4", ...)
};

/// Largest config.json read (published ones are a few KiB; gpt-oss's layer list makes ~2).
inline constexpr std::uintmax_t kMaxHfConfigBytes = std::uintmax_t{16} << 20;

/// Reads and maps `path`. InputError (naming the file, and the field where one is at fault) for
/// an unreadable file, malformed JSON (with line and column), a model_type outside the families
/// above (listing them), a missing or invalid field the mapping needs, and a layout moesim cannot
/// express (a dense / MoE block pattern other than "the first K dense, then every n-th MoE", a
/// shared expert width that is not a multiple of the routed one).
HfImport import_hf_config(const std::string& path);

/// The same from JSON text; `display_name` plays the file's role in messages (tests, stdin).
HfImport import_hf_config(std::string_view json_text, const std::string& display_name);

/// The model_type values import_hf_config reads, in the order messages list them.
const std::vector<std::string_view>& hf_model_types();

}  // namespace moesim
