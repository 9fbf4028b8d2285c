#include "core/hf_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.hpp"
#include "core/text_file.hpp"

namespace moesim {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::int64_t kIntMax = std::numeric_limits<std::int32_t>::max();
// The scenario loader's bound on model.layers (block patterns are checked block by block).
constexpr std::int64_t kMaxLayers = 1 << 16;

// A supported model_type, the name messages call it by, and the architectures[0] that implies it
// when a config lacks model_type.
struct Family {
  std::string_view model_type;
  std::string_view display;
  std::string_view architecture;
};

constexpr Family kFamilies[] = {
    {"deepseek_v2", "DeepSeek-V2", "DeepseekV2ForCausalLM"},
    {"deepseek_v3", "DeepSeek-V3", "DeepseekV3ForCausalLM"},
    {"mixtral", "Mixtral", "MixtralForCausalLM"},
    {"qwen2_moe", "Qwen2-MoE", "Qwen2MoeForCausalLM"},
    {"qwen3_moe", "Qwen3-MoE", "Qwen3MoeForCausalLM"},
    {"olmoe", "OLMoE", "OlmoeForCausalLM"},
    {"gpt_oss", "gpt-oss", "GptOssForCausalLM"},
    {"llama4", "Llama 4", "Llama4ForConditionalGeneration"},
    {"llama4_text", "Llama 4", "Llama4ForCausalLM"},
};

// Fields with no effect on what moesim costs: tokenizer ids, numerics (eps, rope_theta),
// checkpoint bookkeeping, inference-only settings. They are neither mapped nor reported.
const std::set<std::string_view> kIrrelevant = {
    "_attn_implementation_autoset",
    "_name_or_path",
    "architectures",
    "attention_dropout",
    "attn_scale",
    "attn_temperature_tuning",
    "auto_map",
    "boi_token_index",
    "bos_token_id",
    "cache_implementation",
    "dtype",
    "eoi_token_index",
    "eos_token_id",
    "ep_size",
    "floor_scale",
    "for_llm_compressor",
    "image_token_index",
    "initial_context_length",
    "initializer_range",
    "max_position_embeddings",
    "max_window_layers",
    "model_type",
    "no_rope_layer_interval",
    "no_rope_layers",
    "output_router_logits",
    "pad_token_id",
    "pretraining_tp",
    "rms_norm_eps",
    "rope_theta",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "use_sliding_window",
};

// Fields that change the model in ways moesim does not model, with the reason; reported in
// HfImport::ignored unless the value turns the feature off (null, false, 0, empty).
const std::map<std::string_view, std::string_view> kIgnored = {
    {"attention_bias", "attention projection biases are not counted"},
    {"attention_chunk_size",
     "chunked local attention is not modelled (every block is costed as full causal attention)"},
    {"aux_loss_alpha",
     "load-balancing loss weight (model the balance it reaches with workload.routing)"},
    {"clip_qkv", "QKV clipping (no cost)"},
    {"layer_types",
     "per-layer sliding / full attention is not modelled (every block is costed as full causal "
     "attention)"},
    {"mlp_bias", "FFN biases are not counted"},
    {"n_group", "expert groups of group-limited routing (set workload.routing.node_limit)"},
    {"norm_topk_prob", "renormalised top-k weights (no cost)"},
    {"quantization_config",
     "checkpoint quantization (the run's precision is model.dtype / model.precision)"},
    {"rope_scaling", "RoPE context extension (no cost)"},
    {"routed_scaling_factor", "scale on the routed experts' output (no cost)"},
    {"router_aux_loss_coef",
     "load-balancing loss weight (model the balance it reaches with workload.routing)"},
    {"router_jitter_noise", "router noise in training (expert choice is workload.routing's)"},
    {"scoring_func", "router score function (expert choice is workload.routing's)"},
    {"seq_aux", "sequence-level balancing loss (model the balance with workload.routing)"},
    {"sliding_window",
     "sliding-window attention is not modelled (every block is costed as full causal attention)"},
    {"swiglu_limit", "clamped SwiGLU (the same GEMMs)"},
    {"topk_group", "group-limited routing (set workload.routing.node_limit)"},
    {"topk_method", "router top-k method (expert choice is workload.routing's)"},
    {"use_qk_norm", "QK-norm weights are not counted"},
    {"vision_config", "vision encoder not modelled"},
};

// A JSON value for "found X" messages: one line, at most ~40 characters.
std::string describe(const Json& j) {
  // dump() escapes newlines and control characters, keeping messages on one line; a string is
  // shown in single quotes like the YAML loader's. (fmt rather than operator+: GCC 12's
  // -Wrestrict misfires on "'" + str + "'" at -O3.)
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (j.is_string()) s = fmt::format("'{}'", s.substr(1, s.size() - 2));
  if (s.size() > 40) s = fmt::format("{}...", s.substr(0, 37));
  return s;
}

// Whether a value turns its feature off (null, false, 0, "", [] or {}).
bool inert(const Json& j) {
  if (j.is_null()) return true;
  if (j.is_boolean()) return !j.get<bool>();
  if (j.is_number()) return j.get<double>() == 0.0;
  if (j.is_string() || j.is_array() || j.is_object()) return j.empty();
  return false;
}

// One JSON object of the config (the root, or Llama 4's text_config), read field by field. Every
// field read is remembered, so classify() can sort out the rest.
class Fields {
 public:
  Fields(const Json& obj, std::string file, std::string prefix, std::string_view family)
      : obj_(obj), file_(std::move(file)), prefix_(std::move(prefix)), family_(family) {}

  /// Present and not null.
  bool has(std::string_view key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  void use(std::string_view key) { used_.insert(std::string(key)); }

  [[noreturn]] void fail(std::string_view key, const std::string& message) const {
    throw InputError(SourceLocation{file_, 0, 0}, prefix_ + std::string(key), message);
  }
  [[noreturn]] void missing(std::string_view key, std::string_view what) const {
    throw InputError(
        SourceLocation{file_, 0, 0}, "",
        fmt::format("missing '{}{}' ({} configs have it: {})", prefix_, key, family_, what));
  }

  /// An integer field the mapping needs, in [lo, hi].
  int require_int(std::string_view key, std::int64_t lo, std::string_view what,
                  std::int64_t hi = kIntMax) {
    if (!has(key)) missing(key, what);
    use(key);
    return to_int(key, obj_.at(key), lo, what, hi);
  }
  /// An optional integer field: nullopt when absent or null.
  std::optional<int> int_or_null(std::string_view key, std::int64_t lo, std::string_view what) {
    use(key);
    if (!has(key)) return std::nullopt;
    return to_int(key, obj_.at(key), lo, what);
  }
  bool bool_or(std::string_view key, bool fallback) {
    use(key);
    if (!has(key)) return fallback;
    const Json& j = obj_.at(key);
    if (!j.is_boolean()) fail(key, fmt::format("found {}, expected true or false", describe(j)));
    return j.get<bool>();
  }
  /// A list of integers in [0, hi); absent or null: empty.
  std::vector<int> int_list(std::string_view key, std::int64_t hi, std::string_view what) {
    use(key);
    std::vector<int> out;
    if (!has(key)) return out;
    const Json& j = obj_.at(key);
    if (!j.is_array())
      fail(key, fmt::format("found {}, expected a list of block indices ({})", describe(j), what));
    for (const Json& item : j) {
      const int v = to_int(key, item, 0, what);
      if (v >= hi)
        fail(key,
             fmt::format("found block {}, expected block indices in [0, {}) ({})", v, hi, what));
      out.push_back(v);
    }
    return out;
  }
  std::optional<std::string> string_or_null(std::string_view key) {
    use(key);
    if (!has(key)) return std::nullopt;
    const Json& j = obj_.at(key);
    if (!j.is_string()) fail(key, fmt::format("found {}, expected a string", describe(j)));
    return j.get<std::string>();
  }

  /// Sorts every field not read into `out`: no-cost fields vanish, the ignored ones come with
  /// their reason, the rest are unknown.
  void classify(HfImport& out) const {
    for (const auto& [key, value] : obj_.items()) {
      if (used_.count(key) || kIrrelevant.count(key)) continue;
      const std::string name = prefix_ + key;
      if (auto it = kIgnored.find(key); it != kIgnored.end()) {
        if (!inert(value)) out.ignored.push_back(fmt::format("{}: {}", name, it->second));
        continue;
      }
      out.unknown.push_back(name);
    }
  }

 private:
  int to_int(std::string_view key, const Json& j, std::int64_t lo, std::string_view what,
             std::int64_t hi = kIntMax) const {
    std::optional<std::int64_t> v;
    if (j.is_number_unsigned()) {
      const std::uint64_t u = j.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(kIntMax)) v = static_cast<std::int64_t>(u);
    } else if (j.is_number_integer()) {
      v = j.get<std::int64_t>();
    } else if (j.is_number_float()) {
      // 2048.0 is an integer written by a float-minded exporter; 2048.5 is not.
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= static_cast<double>(kIntMax))
        v = static_cast<std::int64_t>(d);
    }
    if (!v || *v < lo || *v > hi)
      fail(key, fmt::format("found {}, expected an integer in [{}, {}] ({})", describe(j), lo,
                            hi == kIntMax ? "2^31-1" : std::to_string(hi), what));
    return static_cast<int>(*v);
  }

  const Json& obj_;
  std::string file_;
  std::string prefix_;
  std::string_view family_;
  std::set<std::string> used_;
};

// The architecture the mapping fills, emitted as YAML at the end.
struct Arch {
  int layers = 0;
  int first_dense = 0;
  int moe_every = 1;
  int model_dim = 0;
  int expert_hidden = 0;
  int dense_hidden = 0;  // written when some block is dense
  int shared = 0;
  int experts = 0;
  int top_k = 0;
  int vocab = 0;
  bool tie = false;
  int mtp = 0;
  bool mla = false;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // 0: not in the file (moesim's default model_dim / heads)
  int q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_head = 0;

  bool has_dense() const { return first_dense > 0 || moe_every > 1; }
};

// moesim's MoE blocks are l >= K with (l - K + 1) % n == 0 (first_dense_layers K, moe_every n).
// Finds (K, n) giving exactly the blocks `is_moe` names; nullopt when no pair does (or none is).
// Two consecutive MoE blocks fix n; a lone one at s needs s + n >= layers (no second) and
// K = s - n + 1 >= 0.
std::optional<std::pair<int, int>> moe_pattern(int layers, const std::function<bool(int)>& is_moe) {
  std::vector<int> moe;
  for (int l = 0; l < layers && moe.size() < 2; ++l)
    if (is_moe(l)) moe.push_back(l);
  if (moe.empty()) return std::nullopt;
  const int every = moe.size() == 2 ? moe[1] - moe[0] : layers - moe[0];
  const int first = moe[0] - every + 1;
  if (first < 0) return std::nullopt;
  for (int l = 0; l < layers; ++l)
    if ((l >= first && (l - first + 1) % every == 0) != is_moe(l)) return std::nullopt;
  return std::make_pair(first, every);
}

// "blocks 0, 2, 3, ..." (the first few MoE blocks) for pattern errors.
std::string moe_blocks_text(int layers, const std::function<bool(int)>& is_moe) {
  std::vector<std::string> parts;
  int count = 0;
  for (int l = 0; l < layers; ++l) {
    if (!is_moe(l)) continue;
    if (count++ < 6) parts.push_back(std::to_string(l));
  }
  if (count == 0) return "no block";
  std::string s = fmt::format("blocks {}", fmt::join(parts, ", "));
  if (count > 6) s += fmt::format(", ... ({} in all)", count);
  return s;
}

// Sets arch.first_dense / moe_every from the family's MoE-block rule, or fails at `key`.
void set_moe_pattern(Arch& arch, const Fields& f, std::string_view key,
                     const std::function<bool(int)>& is_moe) {
  const auto p = moe_pattern(arch.layers, is_moe);
  if (!p)
    f.fail(key, fmt::format("found MoE FFNs in {} of {}, expected a pattern moesim expresses: "
                            "the first K blocks dense, then every n-th block MoE "
                            "(model.first_dense_layers K, model.moe_every n)",
                            moe_blocks_text(arch.layers, is_moe), arch.layers));
  arch.first_dense = p->first;
  arch.moe_every = p->second;
}

// hidden_act: every family here gates its FFN with SiLU (SwiGLU); another gate function has the
// same weights and GEMMs, so it is reported rather than refused.
void read_activation(Fields& f, HfImport& out, std::string_view prefix = "") {
  if (auto act = f.string_or_null("hidden_act"); act && *act != "silu")
    out.ignored.push_back(
        fmt::format("{}hidden_act: '{}' gates the FFN (modelled as SwiGLU: the "
                    "same weights and GEMMs)",
                    prefix, *act));
}

void read_mha(Fields& f, Arch& a, bool head_dim_field) {
  a.heads = f.require_int("num_attention_heads", 1, "the query head count");
  a.kv_heads = f.require_int("num_key_value_heads", 1, "the key/value head count");
  if (a.heads % a.kv_heads != 0)
    f.fail("num_key_value_heads",
           fmt::format("found {}, expected a divisor of num_attention_heads = {}", a.kv_heads,
                       a.heads));
  if (head_dim_field) a.head_dim = f.int_or_null("head_dim", 1, "the per-head width").value_or(0);
  // Without head_dim the family's code uses hidden_size / heads: it must divide.
  if (a.head_dim == 0 && a.model_dim % a.heads != 0) {
    if (head_dim_field)
      f.missing("head_dim", fmt::format("the per-head width; hidden_size = {} is not a multiple "
                                        "of num_attention_heads = {}",
                                        a.model_dim, a.heads));
    f.fail("num_attention_heads",
           fmt::format("found {}, expected a divisor of hidden_size = {}", a.heads, a.model_dim));
  }
}

void map_deepseek(Fields& f, Arch& a, HfImport& out) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.experts = f.require_int("n_routed_experts", 1, "the routed expert count");
  a.top_k = f.require_int("num_experts_per_tok", 1, "the experts each token is routed to");
  a.expert_hidden = f.require_int("moe_intermediate_size", 1, "the routed expert FFN width");
  a.shared = f.int_or_null("n_shared_experts", 0, "the always-active expert count").value_or(0);
  const int k = f.int_or_null("first_k_dense_replace", 0, "the leading dense blocks").value_or(0);
  const int freq = f.int_or_null("moe_layer_freq", 1, "the MoE block stride").value_or(1);
  if (k >= a.layers)
    f.fail("first_k_dense_replace",
           fmt::format("found {} with num_hidden_layers = {}, expected fewer (no block would be "
                       "MoE)",
                       k, a.layers));
  // DeepSeek's modeling code: block l is MoE when l >= first_k_dense_replace and
  // l % moe_layer_freq == 0.
  set_moe_pattern(a, f, "moe_layer_freq", [&](int l) { return l >= k && l % freq == 0; });
  if (a.has_dense())
    a.dense_hidden = f.require_int("intermediate_size", 1, "the dense blocks' FFN width");
  f.use("intermediate_size");
  a.mla = true;
  a.heads = f.require_int("num_attention_heads", 1, "the query head count");
  // Every MLA head has its own keys and values after the up-projection: kv heads = heads.
  f.use("num_key_value_heads");
  // null: queries projected from the model dimension directly (V2-Lite).
  a.q_lora = f.int_or_null("q_lora_rank", 0, "the query latent rank").value_or(0);
  a.kv_lora = f.require_int("kv_lora_rank", 1, "MLA's key/value latent rank");
  a.nope = f.require_int("qk_nope_head_dim", 0, "the per-head query/key width without RoPE");
  a.rope = f.require_int("qk_rope_head_dim", 0, "the per-head RoPE query/key width");
  a.v_head = f.require_int("v_head_dim", 1, "the per-head value width");
  a.mtp =
      f.int_or_null("num_nextn_predict_layers", 0, "the multi-token-prediction depth").value_or(0);
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  a.tie = f.bool_or("tie_word_embeddings", false);
  read_activation(f, out);
}

void map_mixtral(Fields& f, Arch& a, HfImport& out) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.expert_hidden = f.require_int("intermediate_size", 1, "the expert FFN width");
  a.experts = f.require_int("num_local_experts", 1, "the expert count");
  a.top_k = f.require_int("num_experts_per_tok", 1, "the experts each token is routed to");
  read_mha(f, a, true);
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  a.tie = f.bool_or("tie_word_embeddings", false);
  read_activation(f, out);
}

// Qwen2-MoE and Qwen3-MoE: block l is MoE unless listed in mlp_only_layers, when
// (l + 1) % decoder_sparse_step == 0 (their modeling code).
void map_qwen(Fields& f, Arch& a, HfImport& out, bool qwen2) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.experts = f.require_int("num_experts", 1, "the routed expert count");
  a.top_k = f.require_int("num_experts_per_tok", 1, "the experts each token is routed to");
  a.expert_hidden = f.require_int("moe_intermediate_size", 1, "the routed expert FFN width");
  const int step = f.int_or_null("decoder_sparse_step", 1, "the MoE block stride").value_or(1);
  const std::vector<int> mlp_only =
      f.int_list("mlp_only_layers", a.layers, "the blocks with a dense FFN");
  const std::set<int> dense(mlp_only.begin(), mlp_only.end());
  set_moe_pattern(a, f, mlp_only.empty() ? "decoder_sparse_step" : "mlp_only_layers",
                  [&](int l) { return !dense.count(l) && (l + 1) % step == 0; });
  if (a.has_dense())
    a.dense_hidden = f.require_int("intermediate_size", 1, "the dense blocks' FFN width");
  f.use("intermediate_size");
  if (qwen2) {
    const int hs =
        f.int_or_null("shared_expert_intermediate_size", 0, "the shared expert width").value_or(0);
    if (hs % a.expert_hidden != 0)
      f.fail("shared_expert_intermediate_size",
             fmt::format("found {}, expected a multiple of moe_intermediate_size = {} (moesim's "
                         "shared experts are N experts of the routed width, one FFN of hidden "
                         "N x {})",
                         hs, a.expert_hidden, a.expert_hidden));
    a.shared = hs / a.expert_hidden;
    out.ignored.push_back("q/k/v biases: Qwen2-MoE's attention biases are not counted");
    if (a.shared > 0)
      out.ignored.push_back(
          "shared_expert_gate: the shared expert's sigmoid gate (M weights per block) is not "
          "counted");
  }
  read_mha(f, a, !qwen2);
  // Qwen's sliding_window applies only with use_sliding_window (false in every release).
  if (!f.bool_or("use_sliding_window", false)) f.use("sliding_window");
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  a.tie = f.bool_or("tie_word_embeddings", false);
  read_activation(f, out);
}

void map_olmoe(Fields& f, Arch& a, HfImport& out) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.expert_hidden = f.require_int("intermediate_size", 1, "the expert FFN width");
  a.experts = f.require_int("num_experts", 1, "the expert count");
  a.top_k = f.require_int("num_experts_per_tok", 1, "the experts each token is routed to");
  a.heads = f.require_int("num_attention_heads", 1, "the query head count");
  // OLMoE's config class defaults the key/value heads to the query heads (MHA).
  a.kv_heads =
      f.int_or_null("num_key_value_heads", 1, "the key/value head count").value_or(a.heads);
  if (a.heads % a.kv_heads != 0)
    f.fail("num_key_value_heads",
           fmt::format("found {}, expected a divisor of num_attention_heads = {}", a.kv_heads,
                       a.heads));
  if (a.model_dim % a.heads != 0)
    f.fail("num_attention_heads",
           fmt::format("found {}, expected a divisor of hidden_size = {}", a.heads, a.model_dim));
  out.ignored.push_back("q/k norms: OLMoE's QK-norm weights are not counted");
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  a.tie = f.bool_or("tie_word_embeddings", false);
  read_activation(f, out);
}

void map_gpt_oss(Fields& f, Arch& a, HfImport& out) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.expert_hidden = f.require_int("intermediate_size", 1, "the expert FFN width");
  a.experts = f.require_int("num_local_experts", 1, "the expert count");
  // Both spellings appear in the released files (experts_per_token is the original
  // checkpoint's); they must agree.
  const auto k1 = f.int_or_null("num_experts_per_tok", 1, "the experts each token is routed to");
  const auto k2 = f.int_or_null("experts_per_token", 1, "the experts each token is routed to");
  if (!k1 && !k2) f.missing("num_experts_per_tok", "the experts each token is routed to");
  if (k1 && k2 && *k1 != *k2)
    f.fail(
        "experts_per_token",
        fmt::format("found {} with num_experts_per_tok = {}, expected the same top-k", *k2, *k1));
  a.top_k = k1 ? *k1 : *k2;
  read_mha(f, a, true);
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  a.tie = f.bool_or("tie_word_embeddings", false);
  out.ignored.push_back("attention sinks: gpt-oss's learned per-head sink logits are not modelled");
  out.ignored.push_back("expert biases: gpt-oss's expert and router biases are not counted");
  read_activation(f, out);
}

// Llama 4's text model. Every MoE block also runs one shared expert of the routed width; the
// other blocks are dense FFNs of intermediate_size_mlp.
void map_llama4_text(Fields& f, Arch& a, HfImport& out, std::string_view prefix) {
  a.layers = f.require_int("num_hidden_layers", 1, "the transformer block count", kMaxLayers);
  a.model_dim = f.require_int("hidden_size", 1, "the model dimension");
  a.expert_hidden = f.require_int("intermediate_size", 1, "the expert FFN width");
  a.experts = f.require_int("num_local_experts", 1, "the routed expert count");
  a.top_k = f.require_int("num_experts_per_tok", 1, "the experts each token is routed to");
  a.shared = 1;
  const int step =
      f.int_or_null("interleave_moe_layer_step", 1, "the MoE block stride").value_or(1);
  // moe_layers, when written, overrides the stride (HF: range(step - 1, layers, step)).
  std::vector<int> listed = f.int_list("moe_layers", a.layers, "the blocks with an MoE FFN");
  const bool explicit_list = !listed.empty();
  if (!explicit_list)
    for (int l = step - 1; l < a.layers; l += step) listed.push_back(l);
  const std::set<int> moe(listed.begin(), listed.end());
  set_moe_pattern(a, f, explicit_list ? "moe_layers" : "interleave_moe_layer_step",
                  [&](int l) { return moe.count(l) > 0; });
  if (a.has_dense())
    a.dense_hidden = f.require_int("intermediate_size_mlp", 1, "the dense blocks' FFN width");
  f.use("intermediate_size_mlp");
  read_mha(f, a, true);
  a.vocab = f.require_int("vocab_size", 1, "the vocabulary size");
  read_activation(f, out, prefix);
}

YAML::Node emit(const Arch& a) {
  YAML::Node n(YAML::NodeType::Map);
  n["layers"] = a.layers;
  if (a.first_dense > 0) n["first_dense_layers"] = a.first_dense;
  n["moe_every"] = a.moe_every;
  n["model_dim"] = a.model_dim;
  n["expert_hidden_dim"] = a.expert_hidden;
  if (a.has_dense()) n["dense_hidden_dim"] = a.dense_hidden;
  n["activation"] = "swiglu";
  YAML::Node att(YAML::NodeType::Map);
  if (a.mla) {
    att["kind"] = "mla";
    att["heads"] = a.heads;
    att["q_lora_rank"] = a.q_lora;
    att["kv_lora_rank"] = a.kv_lora;
    att["qk_nope_head_dim"] = a.nope;
    att["qk_rope_head_dim"] = a.rope;
    att["v_head_dim"] = a.v_head;
  } else {
    att["heads"] = a.heads;
    att["kv_heads"] = a.kv_heads;
    if (a.head_dim > 0) att["head_dim"] = a.head_dim;
  }
  n["attention"] = att;
  if (a.shared > 0) n["shared_experts"] = a.shared;
  n["experts"] = a.experts;
  n["top_k"] = a.top_k;
  n["vocab_size"] = a.vocab;
  n["tie_embeddings"] = a.tie;
  if (a.mtp > 0) n["mtp_layers"] = a.mtp;
  return n;
}

// Line and column (1-based) of byte offset `byte` (nlohmann's 1-based count of bytes read).
std::pair<int, int> line_column(std::string_view text, std::size_t byte) {
  int line = 1, column = 1;
  const std::size_t end = std::min(text.size(), byte > 0 ? byte - 1 : 0);
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

const Family* family_of_type(std::string_view type) {
  for (const Family& fam : kFamilies)
    if (fam.model_type == type) return &fam;
  return nullptr;
}

std::string supported_list() {
  std::vector<std::string_view> types;
  for (const Family& fam : kFamilies) types.push_back(fam.model_type);
  return fmt::format("{}", fmt::join(types, ", "));
}

}  // namespace

const std::vector<std::string_view>& hf_model_types() {
  static const std::vector<std::string_view> types = [] {
    std::vector<std::string_view> v;
    for (const Family& fam : kFamilies) v.push_back(fam.model_type);
    return v;
  }();
  return types;
}

HfImport import_hf_config(std::string_view json_text, const std::string& display_name) {
  const std::string& file = display_name;
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line L, column C:
    // what, expected what"; the location goes in front, the rest stays.
    std::string detail = e.what();
    if (auto pos = detail.find(": "); pos != std::string::npos && detail.find("parse error") < pos)
      detail = detail.substr(pos + 2);
    std::replace(detail.begin(), detail.end(), '\n', ' ');
    const auto [line, column] = line_column(json_text, e.byte);
    throw InputError(SourceLocation{file, line, column}, "",
                     fmt::format("malformed JSON: {}", detail));
  } catch (const Json::out_of_range& e) {
    // A number beyond double's range ("number overflow parsing '1e+320'"): located by its text.
    const std::string detail = e.what();
    const auto q0 = detail.find('\''), q1 = detail.rfind('\'');
    const std::string number =
        q0 != std::string::npos && q1 > q0 ? detail.substr(q0 + 1, q1 - q0 - 1) : "";
    const auto at = number.empty() ? std::string_view::npos : json_text.find(number);
    const auto [line, column] = line_column(json_text, at == std::string_view::npos ? 0 : at + 1);
    throw InputError(SourceLocation{file, at == std::string_view::npos ? 0 : line,
                                    at == std::string_view::npos ? 0 : column},
                     "",
                     fmt::format("number {} is out of range (beyond a double's ~1.8e308)",
                                 number.empty() ? std::string("in the file") : number));
  }
  if (!root.is_object())
    throw InputError(SourceLocation{file, 0, 0}, "",
                     fmt::format("found {}, expected a JSON object (a Hugging Face config.json)",
                                 describe(root)));

  // The family: model_type, else what architectures[0] implies.
  const Family* fam = nullptr;
  if (auto it = root.find("model_type"); it != root.end() && !it->is_null()) {
    if (!it->is_string() || !(fam = family_of_type(it->get<std::string>())))
      throw InputError(SourceLocation{file, 0, 0}, "model_type",
                       fmt::format("found {}, expected one of {} (the MoE families moesim "
                                   "imports)",
                                   describe(*it), supported_list()));
  } else if (auto arch = root.find("architectures");
             arch != root.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    for (const Family& f : kFamilies)
      if (f.architecture == (*arch)[0].get<std::string>()) fam = &f;
    if (!fam)
      throw InputError(SourceLocation{file, 0, 0}, "",
                       fmt::format("missing 'model_type', and architectures[0] = {} is none of "
                                   "the families moesim imports ({})",
                                   describe((*arch)[0]), supported_list()));
  } else {
    throw InputError(SourceLocation{file, 0, 0}, "",
                     fmt::format("missing 'model_type' (every Hugging Face config.json has it; "
                                 "moesim imports {})",
                                 supported_list()));
  }

  HfImport out;
  out.family = std::string(fam->model_type);
  Arch arch;
  Fields f(root, file, "", fam->display);
  const std::string_view type = fam->model_type;
  if (type == "deepseek_v2" || type == "deepseek_v3") {
    map_deepseek(f, arch, out);
  } else if (type == "mixtral") {
    map_mixtral(f, arch, out);
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    map_qwen(f, arch, out, type == "qwen2_moe");
  } else if (type == "olmoe") {
    map_olmoe(f, arch, out);
  } else if (type == "gpt_oss") {
    map_gpt_oss(f, arch, out);
  } else if (type == "llama4_text") {
    map_llama4_text(f, arch, out, "");
    arch.tie = f.bool_or("tie_word_embeddings", false);
  } else {  // llama4: the language model is text_config; vision_config is reported ignored
    if (!f.has("text_config")) f.missing("text_config", "the language model's settings");
    const Json& text = root.at("text_config");
    if (!text.is_object())
      f.fail("text_config", fmt::format("found {}, expected a map (the language model's "
                                        "settings)",
                                        describe(text)));
    f.use("text_config");
    Fields t(text, file, "text_config.", fam->display);
    map_llama4_text(t, arch, out, "text_config.");
    // The tie flag sits at the top in the released files; text_config's wins when both are set.
    const bool top = f.bool_or("tie_word_embeddings", false);
    arch.tie = t.bool_or("tie_word_embeddings", top);
    t.classify(out);
  }
  f.classify(out);
  out.model = emit(arch);
  std::sort(out.unknown.begin(), out.unknown.end());
  std::sort(out.ignored.begin(), out.ignored.end());
  return out;
}

HfImport import_hf_config(const std::string& path) {
  return import_hf_config(read_text_file(path, "a Hugging Face config.json", kMaxHfConfigBytes),
                          path);
}

}  // namespace moesim
