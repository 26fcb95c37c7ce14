#pragma once
// A Hugging Face BERT model folder as transformers and sentence-transformers save it: config.json,
// the vocabulary (vocab.txt or tokenizer.json), the tokenizer's settings and, for
// sentence-transformers models, modules.json naming the pooling and normalisation that turn token
// vectors into one sentence vector. read_model_folder() reads and checks all of it except the
// weights (SafetensorsWeights reads those), so that a folder precompute cannot run fails at
// start-up with the file and the fix (Note [Where a folder's settings come from] in the .cpp).
//
// Thread-safety: plain data; read_model_folder() shares no state between calls.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "encoders/text/unigram_tokenizer.hpp"
#include "encoders/text/wordpiece_tokenizer.hpp"
#include "pipeline/core/config.hpp"

namespace precompute {

// config.json's fields that BERT inference needs. Defaults are those of transformers'
// BertConfig, for keys a config.json leaves out.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;  // divides hidden_size
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  std::string hidden_act = "gelu";  // gelu, gelu_new, gelu_pytorch_tanh or relu
  // Always "absolute" once read (the only kind supported). transformers 5 no longer has the
  // field; older versions also knew relative_key and relative_key_query.
  std::string position_embedding_type = "absolute";
  std::optional<int64_t> pad_token_id = 0;  // null in config.json: none
  std::string model_type = "bert";        // bert or xlm-roberta
  std::vector<std::string> architectures;  // such as BertModel; may be empty

  // XLM-RoBERTa numbers positions from pad_token_id + 1 and gives a <pad> token in the text the
  // position pad_token_id without counting it (Note [RoBERTa's positions], bert_model.cpp).
  bool roberta_positions() const { return model_type == "xlm-roberta"; }
  // The longest sequence the position table holds.
  int64_t max_sequence_length() const {
    return roberta_positions() ? max_position_embeddings - pad_token_id.value_or(0) - 1
                               : max_position_embeddings;
  }
};

enum class TokenizerKind {
  kWordPiece,  // BERT's: vocab.txt or a WordPiece tokenizer.json
  kUnigram,    // XLM-RoBERTa's: a Unigram tokenizer.json (read by read_unigram_tokenizer)
};

struct ModelFolder {
  // The folder holding config.json, the tokenizer files and the weights: the folder given, or
  // the subfolder where modules.json puts the Transformer module (older sentence-transformers
  // layouts such as 0_BERT/).
  std::filesystem::path dir;
  BertConfig config;
  TokenizerKind tokenizer_kind = TokenizerKind::kWordPiece;
  // WordPiece: token by id, at most config.vocab_size tokens. Empty for a Unigram tokenizer.
  std::vector<std::string> vocab;
  // Unigram: the tokenizer, cutting at tokenizer.max_length (with_max_length() for another).
  std::shared_ptr<const UnigramTokenizer> unigram;
  // As BertTokenizerFast (and sentence-transformers, when it lower-cases itself) would tokenize;
  // max_length never exceeds config.max_sequence_length(). For a Unigram tokenizer only
  // max_length counts.
  TokenizerOptions tokenizer;
  // The sentence-transformers Pooling module's mode; unset when modules.json has none (or there
  // is no modules.json: a plain transformers model, whose pooling the user chooses).
  std::optional<Pooling> pooling;
  bool normalize = false;  // modules.json lists a Normalize module (L2 after pooling)
  // config_sentence_transformers.json's prompt named by its default_prompt_name, which
  // sentence-transformers puts before every text unless told otherwise; empty: none.
  std::string default_prefix;
  // The Pooling module leaves the prompt's tokens out of the mean (include_prompt false), which
  // precompute does not do: a prefix with such a folder is refused.
  bool pooling_excludes_prompt = false;
  // Where tokenizer.max_length came from, for logs, e.g.
  // "sentence_bert_config.json max_seq_length".
  std::string max_length_source;
};

// Reads and checks the model folder `dir`. A folder read before in this process, whose files are
// unchanged (size and modification time), is not read again (Note [Reading a folder once]).
// Throws ModelError naming the file and the fix when the folder is missing files, a file is damaged, or the model or its tokenizer, pooling or modules
// are not ones precompute's native encoder runs (BERT and XLM-RoBERTa; other architectures: use
// a TorchScript export and encoder type torchscript).
ModelFolder read_model_folder(const std::filesystem::path& dir);

}  // namespace precompute
