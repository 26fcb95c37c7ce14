// `precompute tokenize`: shows how captions become token ids, the way `precompute run` makes
// them, to debug truncation and vocabulary problems; with --stats, how a whole file of captions
// tokenizes (lengths, truncation) and how fast.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "encoders/bert/model_folder.hpp"
#include "encoders/bert/text_settings.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/error.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

struct TokenizeOptions {
  std::string config, model, vocab, file;
  std::vector<std::string> texts;
  bool cased = false;
  int max_length = 0;
  bool json = false;
  bool stats = false;
  int threads = 0;
};

TextSection text_section(const TokenizeOptions& o) {
  const int sources = !o.config.empty() + !o.model.empty() + !o.vocab.empty();
  PC_CHECK(sources == 1, ConfigError,
           "give exactly one of --config FILE (its text section), --model DIR (a Hugging Face "
           "BERT folder) or --vocab FILE (a WordPiece vocab.txt)");
  TextSection text;
  if (!o.config.empty()) {
    text = load_config(o.config).text;
    PC_CHECK(text.enabled, ConfigError, "config ", o.config, " has no text section");
  } else if (!o.model.empty()) {
    text.encoder.type = EncoderType::kBert;
    text.encoder.path = o.model;
  } else {
    text.vocab = o.vocab;
  }
  if (o.cased) {
    const bool unigram = text.encoder.type == EncoderType::kBert && text.vocab.empty() &&
                         read_model_folder(text.encoder.path).tokenizer_kind ==
                             TokenizerKind::kUnigram;
    PC_CHECK(!unigram, ConfigError, "--cased applies to WordPiece (BERT) vocabularies; ",
             text.encoder.path,
             " has an XLM-RoBERTa tokenizer, which keeps case as its tokenizer.json says: drop "
             "--cased");
    text.lower_case = false;
    text.strip_accents = false;
  }
  if (o.max_length > 0) text.max_length = o.max_length;
  resolve_text_settings(text);
  // `run` refuses such a length in validate(); this command never validates the whole config,
  // and the tokenizer itself would turn every text into [CLS] [SEP].
  const int length = text.max_length.value_or(0);
  const std::string from = !o.config.empty() ? "config " + o.config : "model folder " + o.model;
  PC_CHECK(length >= kMinTokenizerMaxLength && length <= kMaxTokenizerMaxLength, ConfigError,
           "text.tokenizer.max_length ", length, " (from ", from, ") must be an integer from ",
           kMinTokenizerMaxLength, " to ", kMaxTokenizerMaxLength,
           " ([CLS], at least one token and [SEP]); pass --max-length N to override it");
  return text;
}

std::vector<std::string> read_lines(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.good(), InputError, "cannot read ", file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

// `prefix` is text.prefix, which `run` puts before every caption (Note [Caption prefixes] in
// encoders/bert/text_settings.cpp): shown, so that the ids are the ones `run` embeds.
void print_one(const TextTokenizer& tokenizer, const std::string& prefix, const std::string& text,
               bool json) {
  int64_t invalid = 0;
  const auto tokens = tokenizer.encode(prefix + text, &invalid);
  std::vector<std::string> pieces;
  for (auto id : tokens.ids) pieces.push_back(tokenizer.token(id));
  if (json) {
    // Invalid UTF-8 in the text is replaced by U+FFFD in the output, as the tokenizer sees it.
    nlohmann::json j = {{"text", text},
                        {"ids", tokens.ids},
                        {"tokens", pieces},
                        {"num_tokens", tokens.ids.size()},
                        {"truncated", tokens.truncated},
                        {"invalid_utf8_bytes", invalid}};
    if (!prefix.empty()) j["prefix"] = prefix;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  std::cout << fmt::format("{} tokens{}{}{}:\n  ids:    {}\n  tokens: {}\n", tokens.ids.size(),
                           prefix.empty() ? "" : fmt::format(" (text.prefix \"{}\" first)", prefix),
                           tokens.truncated ? ", truncated at max_length" : "",
                           invalid > 0 ? fmt::format(", {} invalid UTF-8 bytes replaced", invalid)
                                       : "",
                           fmt::join(tokens.ids, " "), fmt::join(pieces, " "));
}

// Tokenizes every line on `threads` threads; prints lengths, truncation and throughput.
void print_stats(const TextTokenizer& tokenizer, const std::string& prefix,
                 const std::vector<std::string>& texts, int threads) {
  const auto n = texts.size();
  std::vector<int32_t> lengths(n);
  std::vector<uint8_t> truncated(n);
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (size_t i = static_cast<size_t>(w); i < n; i += static_cast<size_t>(threads)) {
        // Without a prefix the text is read where it is: a copy per text would be timed too.
        const auto t = prefix.empty() ? tokenizer.encode(texts[i])
                                      : tokenizer.encode(prefix + texts[i]);
        lengths[i] = static_cast<int32_t>(t.ids.size());
        truncated[i] = t.truncated;
      }
    });
  }
  for (auto& worker : workers) worker.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  int64_t tokens = 0, cut = 0;
  for (size_t i = 0; i < n; ++i) {
    tokens += lengths[i];
    cut += truncated[i];
  }
  std::vector<int32_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const auto pct = [&](double p) {
    return sorted.empty() ? 0 : sorted[std::min(n - 1, static_cast<size_t>(p * (n - 1) + 0.5))];
  };
  std::cout << fmt::format(
      "{} texts, {} tokens (mean {:.1f}, median {}, p99 {}, max {}), {} truncated ({:.2f}%)\n"
      "tokenized in {:.3f} s on {} threads: {:.0f} texts/s, {:.0f} tokens/s\n",
      n, tokens, n ? static_cast<double>(tokens) / static_cast<double>(n) : 0.0, pct(0.5),
      pct(0.99), sorted.empty() ? 0 : sorted.back(), cut,
      n ? 100.0 * static_cast<double>(cut) / static_cast<double>(n) : 0.0, seconds, threads,
      static_cast<double>(n) / seconds, static_cast<double>(tokens) / seconds);
  if (!prefix.empty()) {
    std::cout << fmt::format("(each text after text.prefix \"{}\", as run embeds it)\n", prefix);
  }
}

int tokenize(const TokenizeOptions& o) {
  const auto text = text_section(o);
  const auto tokenizer_owner = make_text_tokenizer(text);
  const TextTokenizer& tokenizer = *tokenizer_owner;
  std::vector<std::string> texts = o.texts;
  if (!o.file.empty()) {
    auto lines = read_lines(o.file);
    texts.insert(texts.end(), std::make_move_iterator(lines.begin()),
                 std::make_move_iterator(lines.end()));
  }
  if (texts.empty()) {
    for (std::string line; std::getline(std::cin, line);) texts.push_back(line);
  }
  if (o.stats) {
    const int threads = o.threads > 0 ? o.threads
                                      : std::max(1, static_cast<int>(
                                                        std::thread::hardware_concurrency()));
    print_stats(tokenizer, text.prefix, texts, threads);
  } else {
    for (const auto& t : texts) print_one(tokenizer, text.prefix, t, o.json);
  }
  return kExitOk;
}

}  // namespace

CommandFn add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Show the token ids and pieces of texts, as `run` tokenizes them");
  cmd->add_option("texts", o->texts, "Texts to tokenize (else --file, else standard input)");
  cmd->add_option("-c,--config", o->config, "Take the tokenizer of this config's text section");
  cmd->add_option("--model", o->model, "A Hugging Face BERT or XLM-RoBERTa folder");
  cmd->add_option("--vocab", o->vocab, "A WordPiece vocab.txt");
  cmd->add_option("-f,--file", o->file, "Tokenize every line of this file");
  cmd->add_flag("--cased", o->cased, "Keep case and accents (WordPiece vocabularies)");
  cmd->add_option("--max-length", o->max_length,
                  "Tokens per text, [CLS] and [SEP] (or <s> and </s>) included")
      ->check(CLI::Range(kMinTokenizerMaxLength, kMaxTokenizerMaxLength));
  cmd->add_flag("--json", o->json, "One JSON object per text");
  cmd->add_flag("--stats", o->stats, "Only lengths, truncation and throughput of all texts");
  cmd->add_option("--threads", o->threads, "Threads for --stats (0: one per core)")
      ->check(CLI::Range(0, kMaxThreads));
  return [o]() { return tokenize(*o); };
}

}  // namespace precompute
