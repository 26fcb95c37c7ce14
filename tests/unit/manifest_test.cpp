#include "pipeline/input/manifest.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using namespace std::string_literals;

std::vector<SampleSpec> parse(const std::string& text, ManifestFormat format) {
  std::istringstream in(text);
  return parse_manifest(in, format, "/data", "m");
}

std::string error_of(const std::string& text, ManifestFormat format) {
  try {
    parse(text, format);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ManifestTest, JsonlResolvesPathsAndKeepsOrder) {
  const auto s = parse(
      "\xEF\xBB\xBF{\"id\": \"a\", \"video\": \"clips/a.mp4\", \"text\": \"hello\"}\n"
      "\n"
      "{\"id\": 7, \"audio\": \"/abs/b.wav\", \"extra\": 1}\n"
      "{\"id\": \"c\", \"text\": \"\"}\n",
      ManifestFormat::kJsonl);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].id, "a");
  EXPECT_EQ(s[0].seq, 0);
  EXPECT_EQ(s[0].video->file, "/data/clips/a.mp4");
  EXPECT_EQ(*s[0].text, "hello");
  EXPECT_FALSE(s[0].audio);
  EXPECT_EQ(s[1].id, "7");
  EXPECT_EQ(s[1].line, 3);
  EXPECT_EQ(s[1].audio->file, "/abs/b.wav");
  EXPECT_EQ(s[2].seq, 2);
  ASSERT_TRUE(s[2].text.has_value());  // empty text is kept: it becomes a failure record
  EXPECT_EQ(*s[2].text, "");
}

// Note [Kept columns]: output.keep_columns fills each sample's `columns`, in the list's order.
std::vector<SampleSpec> parse_keeping(const std::string& text, ManifestFormat format,
                                      const std::vector<std::string>& keep) {
  std::istringstream in(text);
  return parse_manifest(in, format, "/data", "m", keep);
}

std::string keeping_error(const std::string& text, ManifestFormat format,
                          const std::vector<std::string>& keep) {
  try {
    parse_keeping(text, format, keep);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ManifestTest, JsonlKeepsNamedColumnsAsText) {
  const auto s = parse_keeping(
      "{\"id\": \"a\", \"text\": \"x\", \"label\": \"cat\", \"split\": \"train\"}\n"
      "{\"id\": \"b\", \"text\": \"x\", \"label\": 3, \"split\": null}\n"
      "{\"id\": \"c\", \"text\": \"x\", \"label\": [1, \"two\"], \"Split\": \"no\"}\n"
      "{\"id\": \"d\", \"text\": \"x\", \"label\": {\"k\": true}, \"split\": 2.5}\n"
      "{\"id\": \"e\", \"text\": \"x\", \"label\": \"caf\u00e9 \\u00e9\", \"split\": \"\"}\n",
      ManifestFormat::kJsonl, {"split", "label"});
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0].columns, (std::vector<std::string>{"train", "cat"}));
  EXPECT_EQ(s[1].columns, (std::vector<std::string>{"", "3"}));  // null: ""
  // A line without the key (keys are case-sensitive): ""; other JSON: its text as written.
  EXPECT_EQ(s[2].columns, (std::vector<std::string>{"", "[1, \"two\"]"}));
  EXPECT_EQ(s[3].columns, (std::vector<std::string>{"2.5", "{\"k\": true}"}));
  EXPECT_EQ(s[4].columns, (std::vector<std::string>{"", "caf\u00e9 \u00e9"}));
  // Without kept columns nothing is kept.
  EXPECT_TRUE(parse_keeping("{\"id\": \"a\", \"text\": \"x\", \"label\": \"cat\"}\n",
                            ManifestFormat::kJsonl, {})[0]
                  .columns.empty());
}

// Note [Kept values as written]: a JSON value that is not a string is kept as its bytes in the
// line, not as the parser's number or tree written out again (-0 came back as 0, 1E5 as
// 100000.0, [1, 2] as [1,2]).
TEST(ManifestTest, JsonlKeepsValuesThatAreNotStringsAsTheLineWritesThem) {
  const std::string deep = std::string(500, '[') + "1" + std::string(500, ']');
  // Each value as a line writes it, and as it is kept.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1e+20", "1e+20"},
      {"100.0", "100.0"},
      {"1.1", "1.1"},
      {"-0", "-0"},
      {"1E5", "1E5"},
      {"1e-400", "1e-400"},  // below a double's least: the parser reads 0
      {"123456789012345678901234567890", "123456789012345678901234567890"},
      {"[1, 2]", "[1, 2]"},
      {"[ 1 ,\t2\r, 3 ]", "[ 1 ,\t2\r, 3 ]"},
      {"{\"a\": 1.0}", "{\"a\": 1.0}"},
      {"{}", "{}"},
      {"{ }", "{ }"},
      {"[]", "[]"},
      {R"(["a,]}\"", {"b": "}{"}, [ ], "\\"])", R"(["a,]}\"", {"b": "}{"}, [ ], "\\"])"},
      {R"(["caf\u00e9"])", R"(["caf\u00e9"])"},  // escapes inside an array stay escapes
      {R"(["c\u0000t"])", R"(["c\u0000t"])"},    // so an escaped NUL is six characters
      {deep, deep},
      {"true", "true"},
      {"false", "false"},
      {"null", ""},
      // A JSON string is kept as its text: escapes decoded, as before.
      {R"("caf\u00e9 \ud83d\ude00 \"q\" \\ \/")", "caf\u00e9 \U0001F600 \"q\" \\ /"},
  };
  std::string manifest;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = std::to_string(i);
    // The key among others with blanks around the value, and last with none.
    manifest +=
        "{\"id\": \"m" + id + "\", \"label\" : \t" + cases[i].first + " \t, \"text\": \"x\"}\n";
    manifest += "{\"id\":\"l" + id + "\",\"text\":\"x\",\"label\":" + cases[i].first + "}\n";
  }
  const auto s = parse_keeping(manifest, ManifestFormat::kJsonl, {"label"});
  ASSERT_EQ(s.size(), 2 * cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(s[2 * i].columns, std::vector<std::string>{cases[i].second}) << cases[i].first;
    EXPECT_EQ(s[2 * i + 1].columns, std::vector<std::string>{cases[i].second}) << cases[i].first;
  }
  // A byte order mark opening a line after the first is skipped as on the first.
  const auto bom = parse_keeping(
      "{\"id\": \"a\", \"text\": \"x\"}\n\xEF\xBB\xBF{\"id\": \"b\", \"text\": \"x\", "
      "\"label\": 1.50}\n",
      ManifestFormat::kJsonl, {"label"});
  ASSERT_EQ(bom.size(), 2u);
  EXPECT_EQ(bom[1].columns, std::vector<std::string>{"1.50"});
}

TEST(ManifestTest, ARepeatedKeyInAJsonlLineIsRefusedNamingTheLineAndTheKey) {
  // Readers disagree on which value a repeated key has: nlohmann and Python keep the last, some
  // the first, some refuse. Any key at the top level, kept or not.
  // Each line 2, and the key it repeats.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"id": "a", "text": "x", "label": 1, "label": 2})", "label"},
      {R"({"id": "a", "id": "b", "text": "x"})", "id"},
      {R"({"id": "a", "video": "a.mp4", "video": "b.mp4"})", "video"},
      {R"({"id": "a", "text": "x", "text": "y"})", "text"},
      {R"({"id": "a", "text": "x", "other": 1, "other": 1})", "other"},
      {R"({"id": "a", "text": "x", "x\u00e9": 1, "x\u00e9": 1})", "x\u00e9"},
  };
  for (const auto& keep : {std::vector<std::string>{}, std::vector<std::string>{"label"}}) {
    for (const auto& [line, key] : cases) {
      const auto e = keeping_error("{\"id\": \"g\", \"text\": \"x\", \"label\": 0}\n" + line +
                                       "\n{\"id\": \"z\", \"text\": \"x\"}\n",
                                   ManifestFormat::kJsonl, keep);
      EXPECT_NE(e.find("m line 2: the key '" + key + "' appears twice"), std::string::npos)
          << line << ": " << e;
      EXPECT_NE(e.find("remove one"), std::string::npos) << e;
    }
  }
  // The same key once its escapes are decoded: the message shows how each was written.
  const auto e = error_of(R"({"id": "a", "text": "x", "label": 1, "\u006cabel": 2})"
                          "\n",
                          ManifestFormat::kJsonl);
  EXPECT_NE(e.find("m line 1: the key 'label' appears twice"), std::string::npos) << e;
  EXPECT_NE(e.find(R"(written "label" and "\u006cabel")"), std::string::npos) << e;
}

TEST(ManifestTest, ARepeatedKeyInsideAKeptValueIsKeptAsWritten) {
  // Only the line's own keys are checked: a nested object is stored as its text, both keys in
  // it, for the trainer's JSON reader to judge (Note [Kept values as written]).
  const auto s = parse_keeping(
      R"({"id": "a", "text": "x", "meta": {"k": 1, "k": 2}, "list": [{"k": 1, "k": 2}]})"
      "\n",
      ManifestFormat::kJsonl, {"meta", "list"});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].columns,
            (std::vector<std::string>{R"({"k": 1, "k": 2})", R"([{"k": 1, "k": 2}])"}));
}

TEST(ManifestTest, ANumberBeyondADoubleIsRefusedWithTheWayToKeepIt) {
  // The JSON parser holds numbers as doubles and refuses 1e400: quoting it keeps its text.
  for (const auto& keep : {std::vector<std::string>{}, std::vector<std::string>{"label"}}) {
    const auto e = keeping_error(
        "{\"id\": \"a\", \"text\": \"x\", \"label\": 1}\n"
        "{\"id\": \"b\", \"text\": \"x\", \"label\": -1e400}\n",
        ManifestFormat::kJsonl, keep);
    EXPECT_NE(e.find("m line 2: a number beyond what a double holds"), std::string::npos) << e;
    EXPECT_NE(e.find("'-1e400'"), std::string::npos) << e;
    EXPECT_NE(e.find("write it as a string"), std::string::npos) << e;
  }
}

TEST(ManifestTest, DelimitedKeepsNamedColumnsMatchedAsTheHeaderIs) {
  const auto csv = parse_keeping(
      "id,text,Label,split\n"
      "a,x,cat,train\n"
      "b,x,\"dog, big\",\n",
      ManifestFormat::kCsv, {"label", "split"});
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv[0].columns, (std::vector<std::string>{"cat", "train"}));
  EXPECT_EQ(csv[1].columns, (std::vector<std::string>{"dog, big", ""}));
  const auto tsv = parse_keeping("id\ttext\tlabel\na\tx\tcat\n", ManifestFormat::kTsv,
                                 {"label"});
  EXPECT_EQ(tsv[0].columns, (std::vector<std::string>{"cat"}));
}

TEST(ManifestTest, KeptColumnsTheManifestLacksOrCannotStoreAreRefused) {
  // A name the header lacks, or that no JSONL line has: a typo, named with the manifest.
  const auto csv = keeping_error("id,text,label\na,x,cat\n", ManifestFormat::kCsv,
                                 {"label", "lable"});
  EXPECT_NE(csv.find("m line 1: no column 'lable'"), std::string::npos) << csv;
  EXPECT_NE(csv.find("output.keep_columns"), std::string::npos) << csv;
  const auto jsonl = keeping_error("{\"id\": \"a\", \"text\": \"x\", \"label\": 1}\n",
                                   ManifestFormat::kJsonl, {"Label"});
  EXPECT_NE(jsonl.find("no line has the key 'Label'"), std::string::npos) << jsonl;
  // Values as ids are checked: no NUL, UTF-8 only, naming the line and the column.
  const auto nul = keeping_error(
      "{\"id\": \"a\", \"text\": \"x\", \"label\": \"c\\u0000t\"}\n",
      ManifestFormat::kJsonl, {"label"});
  EXPECT_NE(nul.find("m line 1: the value of kept column 'label'"), std::string::npos) << nul;
  EXPECT_NE(nul.find("NUL"), std::string::npos) << nul;
  const auto latin1 = keeping_error("id,text,label\na,x,ok\nb,x,caf\xE9\n", ManifestFormat::kCsv,
                                    {"label"});
  EXPECT_NE(latin1.find("m line 3: the value of kept column 'label'"), std::string::npos)
      << latin1;
  EXPECT_NE(latin1.find("not valid UTF-8 ('caf\\xE9'"), std::string::npos) << latin1;
  // Bytes that are not UTF-8 in a JSONL value, a string or one inside an array kept as
  // written: JSON itself refuses them.
  EXPECT_NE(keeping_error("{\"id\": \"a\", \"text\": \"x\", \"label\": \"caf\xE9\"}\n",
                          ManifestFormat::kJsonl, {"label"}),
            "");
  EXPECT_NE(keeping_error("{\"id\": \"a\", \"text\": \"x\", \"label\": [\"caf\xE9\"]}\n",
                          ManifestFormat::kJsonl, {"label"})
                .find("m line 1: not valid JSON"),
            std::string::npos);
  // A NUL in a CSV cell.
  EXPECT_NE(keeping_error("id,text,label\na,x,c\0t\n"s, ManifestFormat::kCsv, {"label"})
                .find("NUL"),
            std::string::npos);
}

TEST(ManifestTest, ErrorsNameTheLine) {
  EXPECT_NE(error_of("{\"id\": \"a\", \"text\": \"x\"}\n{not json}\n", ManifestFormat::kJsonl)
                .find("m line 2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"video\": \"a.mp4\"}\n", ManifestFormat::kJsonl).find("line 1"),
            std::string::npos);
  EXPECT_NE(error_of("{\"id\": \"a\"}\n", ManifestFormat::kJsonl).find("none of"),
            std::string::npos);
  EXPECT_NE(error_of("{\"id\": \"a\", \"video\": 3}\n", ManifestFormat::kJsonl)
                .find("'video' must be a string"),
            std::string::npos);
}

TEST(ManifestTest, DuplicateIdsNameBothLines) {
  const auto e = error_of(
      "{\"id\": \"x\", \"text\": \"1\"}\n{\"id\": \"y\", \"text\": \"2\"}\n"
      "{\"id\": \"x\", \"text\": \"3\"}\n",
      ManifestFormat::kJsonl);
  EXPECT_NE(e.find("id 'x' appears on line 1 and on line 3"), std::string::npos) << e;
  const auto c = error_of("id,text\na,1\nb,2\na,3\n", ManifestFormat::kCsv);
  EXPECT_NE(c.find("line 2 and on line 4"), std::string::npos) << c;
}

// Note [Parsing a manifest on every core]: blocks of about 1 MiB of lines parsed on many
// threads, added in order. 150,000 lines span six blocks.
std::string many_lines(int n, const std::map<int, std::string>& replaced = {}) {
  std::string text;
  for (int line = 1; line <= n; ++line) {
    const auto it = replaced.find(line);
    text += it != replaced.end()
                ? it->second
                : "{\"id\": \"s" + std::to_string(line) + "\", \"text\": \"caption " +
                      std::to_string(line) + "\"}";
    text += line % 1000 == 0 ? "\r\n\n" : "\n";  // CRLF and blank lines here and there
  }
  return text;
}

TEST(ManifestTest, AManifestOfManyBlocksKeepsItsOrderAndLineNumbers) {
  const auto samples = parse(many_lines(150'000), ManifestFormat::kJsonl);
  ASSERT_EQ(samples.size(), 150'000u);
  int64_t line = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    ASSERT_EQ(samples[i].seq, static_cast<int64_t>(i));
    ASSERT_EQ(samples[i].id, std::string("s").append(std::to_string(i + 1)));
    ASSERT_EQ(samples[i].text, std::string("caption ").append(std::to_string(i + 1)));
    // Blank lines count: line k of the manifest is after (k - 1) / 1000 blank ones.
    line += 1 + (i > 0 && i % 1000 == 0 ? 1 : 0);
    ASSERT_EQ(samples[i].line, line) << i;
  }
}

TEST(ManifestTest, TheFirstBadLineIsTheOneReportedWhateverTheThreadsMeetFirst) {
  // Bad JSON in the last block; a duplicate id (of sample 5) and a NUL in an id in earlier
  // blocks, which other threads may parse first. Lines: sample k is on line k + (k - 1) / 1000.
  const auto line_of = [](int k) { return k + (k - 1) / 1000; };
  std::map<int, std::string> bad = {
      {140'000, "{not json"},
      {90'000, "{\"id\": \"s5\", \"text\": \"again\"}"},
      {120'000, "{\"id\": \"a\\u0000b\", \"text\": \"x\"}"},
  };
  auto e = error_of(many_lines(150'000, bad), ManifestFormat::kJsonl);
  EXPECT_NE(e.find("id 's5' appears on line 5 and on line " + std::to_string(line_of(90'000))),
            std::string::npos)
      << e;
  bad.erase(90'000);
  e = error_of(many_lines(150'000, bad), ManifestFormat::kJsonl);
  EXPECT_NE(e.find("m line " + std::to_string(line_of(120'000)) + ": the id"), std::string::npos)
      << e;
  bad.erase(120'000);
  bad[60'000] = "{\"id\": \"late\"}";  // no modality: the first block's last bad line
  e = error_of(many_lines(150'000, bad), ManifestFormat::kJsonl);
  EXPECT_NE(e.find("m line " + std::to_string(line_of(60'000)) + ": sample 'late' has none"),
            std::string::npos)
      << e;
}

// A stream that cannot tell its size (a pipe): the reader then guesses no sample count.
class UnseekableBuffer : public std::streambuf {
 public:
  explicit UnseekableBuffer(std::string text) : text_(std::move(text)) {}

 protected:
  int_type underflow() override {
    if (at_ >= text_.size()) return traits_type::eof();
    // Short reads of odd sizes, as a pipe gives them.
    const size_t n = std::min<size_t>(70'001, text_.size() - at_);
    char* p = text_.data() + at_;
    setg(p, p, p + n);
    at_ += n;
    return traits_type::to_int_type(*p);
  }

 private:
  std::string text_;
  size_t at_ = 0;
};

TEST(ManifestTest, LinesLongerThanABlockAndStreamsThatCannotSeekReadAsLineByLine) {
  // A BOM, a caption of 3 MiB (longer than a block of lines), 40,000 more lines, and a last
  // line without its newline.
  const std::string long_caption(3u << 20, 'w');
  std::string text = "\xEF\xBB\xBF{\"id\": \"first\", \"text\": \"a\"}\n";
  text += "{\"id\": \"long\", \"text\": \"" + long_caption + "\"}\r\n";
  for (int i = 3; i <= 40'002; ++i) {
    text += "{\"id\": \"s" + std::to_string(i) + "\", \"text\": \"caption\"}\n";
  }
  text += "{\"id\": \"last\", \"text\": \"end\"}";
  const auto check = [&](const std::vector<SampleSpec>& s) {
    ASSERT_EQ(s.size(), 40'003u);
    EXPECT_EQ(s[0].id, "first");
    EXPECT_EQ(s[1].id, "long");
    EXPECT_EQ(*s[1].text, long_caption);
    EXPECT_EQ(s[1].line, 2);
    EXPECT_EQ(s[2].id, "s3");
    EXPECT_EQ(s[40'001].line, 40'002);
    EXPECT_EQ(s.back().id, "last");
    EXPECT_EQ(s.back().line, 40'003);
    EXPECT_EQ(*s.back().text, "end");
  };
  check(parse(text, ManifestFormat::kJsonl));
  UnseekableBuffer buffer(text);
  std::istream pipe(&buffer);
  check(parse_manifest(pipe, ManifestFormat::kJsonl, "/data", "m"));

  // Without a guessed count the id table grows as it goes, and still finds a late duplicate.
  UnseekableBuffer again(text + "\n{\"id\": \"s777\", \"text\": \"x\"}\n");
  std::istream second(&again);
  try {
    parse_manifest(second, ManifestFormat::kJsonl, "/data", "m");
    ADD_FAILURE() << "the duplicate id was not refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("id 's777' appears on line 777 and on line 40004"),
              std::string::npos)
        << e.what();
  }
}

TEST(ManifestTest, CsvHandlesQuotesDelimitersAndNewlines) {
  const auto s = parse(
      "ID,Video,text,notes\r\n"
      "a,a.mp4,\"a caption, with a comma\",x\r\n"
      "b,,\"two\nlines with \"\"quotes\"\"\",y\r\n"
      "c,c.mp4,,z\r\n",
      ManifestFormat::kCsv);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(*s[0].text, "a caption, with a comma");
  EXPECT_EQ(s[0].video->file, "/data/a.mp4");
  EXPECT_FALSE(s[1].video);
  EXPECT_EQ(*s[1].text, "two\nlines with \"quotes\"");
  EXPECT_EQ(s[2].line, 5);  // the quoted newline spans a physical line
  EXPECT_EQ(*s[2].text, "");
}

TEST(ManifestTest, CsvStructureErrors) {
  EXPECT_NE(error_of("video,text\na.mp4,x\n", ManifestFormat::kCsv).find("no 'id' column"),
            std::string::npos);
  EXPECT_NE(error_of("id,text\na,x,extra\n", ManifestFormat::kCsv).find("line 2: 3 fields"),
            std::string::npos);
  EXPECT_NE(error_of("id,text\na,\"open\n", ManifestFormat::kCsv).find("never closed"),
            std::string::npos);
  EXPECT_NE(error_of("", ManifestFormat::kCsv).find("empty"), std::string::npos);
}

TEST(ManifestTest, TsvAndFormatByExtension) {
  const auto s = parse("id\ttext\nq\thello, world\n", ManifestFormat::kTsv);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(*s[0].text, "hello, world");
  EXPECT_EQ(manifest_format_for("a/b.JSONL"), ManifestFormat::kJsonl);
  EXPECT_EQ(manifest_format_for("b.tsv"), ManifestFormat::kTsv);
  EXPECT_THROW(manifest_format_for("b.xlsx"), InputError);
}

TEST(ManifestTest, FolderModePairsMediaAndCaptions) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "sub");
  for (const char* name : {"b.mp4", "sub/a.webm", "sub/a.wav", "c.wav", "orphan.txt", "x.bin"}) {
    std::ofstream(dir / name) << "x";
  }
  std::ofstream(dir / "b.txt") << "caption of b\n";
  std::ofstream(dir / "sub/a.txt") << "caption of a";
  const auto s = scan_folder(dir.path());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].id, "b");
  EXPECT_EQ(*s[0].text, "caption of b");
  EXPECT_EQ(s[1].id, "c");
  EXPECT_FALSE(s[1].video);
  EXPECT_TRUE(s[1].audio);
  EXPECT_FALSE(s[1].text);
  EXPECT_EQ(s[2].id, "sub/a");
  EXPECT_TRUE(s[2].video && s[2].audio);
  EXPECT_EQ(*s[2].text, "caption of a");

  std::ofstream(dir / "b.mkv") << "x";
  EXPECT_THROW(scan_folder(dir.path()), InputError);
  EXPECT_THROW(scan_folder(dir / "missing"), InputError);
}

TEST(ManifestTest, IdsWithNulAreRefusedNamingTheLine) {
  // A NUL passed every check and then failed the shard write (exit 74) without naming the id.
  const auto j = error_of(
      "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\\u0000c\", \"text\": \"y\"}\n",
      ManifestFormat::kJsonl);
  EXPECT_NE(j.find("m line 2: the id 'b\\x00c' contains a NUL character"), std::string::npos)
      << j;
  const auto c = error_of("id,text\na,x\nb\0c,y\n"s, ManifestFormat::kCsv);
  EXPECT_NE(c.find("m line 3: the id 'b\\x00c' contains a NUL"), std::string::npos) << c;
}

TEST(ManifestTest, ARepeatedKeyIsTheFirstBadLineOnlyWhereItComesFirst) {
  // Sample k is on line k + (k - 1) / 1000 (many_lines' blank lines).
  const auto e = error_of(many_lines(150'000, {{120'000, R"({"id": 3, "text": "", "text": 1})"},
                                               {100'000, R"({"id": 1, "id": 2})"},
                                               {140'000, "{not json"}}),
                          ManifestFormat::kJsonl);
  EXPECT_NE(e.find("m line 100099: the key 'id' appears twice"), std::string::npos) << e;
}

TEST(ManifestTest, MediaPathsWithNulAreRefusedNamingTheLine) {
  // The path used to be cut at the NUL when the file was opened: another file was read.
  const auto v = error_of("{\"id\": \"a\", \"video\": \"a.mp4\\u0000.txt\"}\n",
                          ManifestFormat::kJsonl);
  EXPECT_NE(v.find("m line 1: the 'video' path '/data/a.mp4\\x00.txt' contains a NUL"),
            std::string::npos)
      << v;
  const auto a = error_of("id,audio\nx,ok.wav\ny,b\0.wav\n"s, ManifestFormat::kCsv);
  EXPECT_NE(a.find("m line 3: the 'audio' path"), std::string::npos) << a;
}

TEST(ManifestTest, ARawNulByteInAJsonlLineIsRefusedNotTakenForItsEnd) {
  // nlohmann's parser stops at a raw NUL: without the check, "b" below would vanish.
  for (const auto& line : {"{\"id\": \"a\", \"text\": \"t\"}\0{\"id\": \"b\"}"s,
                           "\0{\"id\": \"a\", \"text\": \"t\"}"s}) {
    const auto e = error_of("{\"id\": \"z\", \"text\": \"t\"}\n" + line + "\n",
                            ManifestFormat::kJsonl);
    EXPECT_NE(e.find("m line 2: a NUL byte at column "), std::string::npos) << e;
  }
}

TEST(ManifestTest, CaptionsWithNulAreKeptForTheTokenizer) {
  // Captions are never strings in a shard: the tokenizer drops NUL like other control characters.
  const auto s = parse("{\"id\": \"a\", \"text\": \"x\\u0000y\"}\n", ManifestFormat::kJsonl);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(*s[0].text, "x\0y"s);
}

TEST(ManifestTest, IdsMustBeValidUtf8) {
  const auto e = error_of("id,text\nok,x\nbad\xffid,y\n", ManifestFormat::kCsv);
  EXPECT_NE(e.find("m line 3: the id 'bad\\xFFid' is not valid UTF-8"), std::string::npos) << e;
  EXPECT_NE(e.find("iconv"), std::string::npos) << e;
  // Overlong forms and UTF-16 surrogates are not UTF-8 either (h5py refuses to decode them).
  EXPECT_NE(error_of("id\ttext\n\xc0\xaf\tx\n", ManifestFormat::kTsv).find("'\\xC0\\xAF'"),
            std::string::npos);
  EXPECT_NE(error_of("id\ttext\n\xed\xa0\x80\tx\n", ManifestFormat::kTsv).find("not valid UTF-8"),
            std::string::npos);
  const auto s = parse("id,text\ncaf\xc3\xa9,x\n\xf0\x9f\x8e\xb8,y\n", ManifestFormat::kCsv);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].id, "\xf0\x9f\x8e\xb8");
}

TEST(ManifestTest, IdsThatDifferOnlyInNormalizationWarnOnce) {
  setup_logging("warn");
  ::testing::internal::CaptureStderr();
  const auto s = parse(
      "{\"id\": \"caf\\u00e9\", \"text\": \"NFC\"}\n"
      "{\"id\": \"other\", \"text\": \"x\"}\n"
      "{\"id\": \"cafe\\u0301\", \"text\": \"NFD\"}\n"
      "{\"id\": \"K\", \"text\": \"latin\"}\n"
      "{\"id\": \"\\u212a\", \"text\": \"kelvin sign\"}\n",
      ManifestFormat::kJsonl);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.size(), 5u);  // kept: they are different ids, only confusable
  EXPECT_NE(log.find("m: ids 'caf\xc3\xa9' (line 1) and 'cafe\xcc\x81' (line 3) differ only in "
                     "Unicode normalization"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("(1 more such pair(s))"), std::string::npos) << log;
  EXPECT_EQ(log.find("differ only", log.find("differ only") + 1), std::string::npos) << log;
}

TEST(ManifestTest, FolderModeRefusesFileNamesThatAreNotUtf8) {
  testing::TempDir dir;
  std::ofstream(dir / "good.mp4") << "x";
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "bad\xffname.mp4") << "x";
  std::string e;
  try {
    scan_folder(dir.path());
  } catch (const InputError& error) {
    e = error.what();
  }
  EXPECT_NE(e.find("the file name 'sub/bad\\xFFname.mp4' is not valid UTF-8"), std::string::npos)
      << e;
  EXPECT_NE(e.find("rename the file"), std::string::npos) << e;
}

TEST(ManifestTest, FolderModeSkipsLinkLoopsAndBrokenLinks) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "sub" / "deeper");
  std::ofstream(dir / "a.mp4") << "x";
  std::ofstream(dir / "sub" / "deeper" / "b.wav") << "x";
  std::filesystem::create_directory_symlink(dir.path(), dir / "sub" / "deeper" / "up");
  std::filesystem::create_directory_symlink("deeper", dir / "sub" / "again");
  std::filesystem::create_symlink("self.mp4", dir / "self.mp4");
  std::filesystem::create_symlink("nowhere.mp4", dir / "dangling.mp4");
  std::filesystem::create_symlink("a.mp4", dir / "link.mp4");  // a link to a file is a file
  setup_logging("warn");
  ::testing::internal::CaptureStderr();
  const auto s = scan_folder(dir.path());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(s.size(), 3u) << log;
  EXPECT_EQ(s[0].id, "a");
  EXPECT_EQ(s[1].id, "link");
  // "again" sorts before "deeper": it is the link kept, and "deeper" the folder skipped.
  EXPECT_EQ(s[2].id, "sub/again/b");
  EXPECT_NE(log.find("skipped '" + (dir / "sub/deeper").string() + "': it leads to a folder "
                     "already scanned"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("skipped '" + (dir / "sub/again/up").string() + "'"), std::string::npos)
      << log;
  EXPECT_NE(log.find("skipped '" + (dir / "self.mp4").string() + "': Too many levels"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("skipped '" + (dir / "dangling.mp4").string() + "': No such file"),
            std::string::npos)
      << log;
}

TEST(ManifestTest, ReadInputRefusesAnEmptyInput) {
  testing::TempDir dir;
  const auto error_for = [&](const std::filesystem::path& manifest,
                             const std::filesystem::path& folder) {
    try {
      read_input(InputSection{manifest, folder, {}});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::ofstream(dir / "empty.jsonl") << "\n  \n";
  EXPECT_NE(error_for(dir / "empty.jsonl", {}).find("empty.jsonl\" holds no samples"),
            std::string::npos);
  std::ofstream(dir / "header.csv") << "id,video,text\n";
  EXPECT_NE(error_for(dir / "header.csv", {}).find("holds no samples"), std::string::npos);
  std::filesystem::create_directories(dir / "media");
  std::ofstream(dir / "media" / "notes.txt") << "a caption without a clip";
  std::ofstream(dir / "media" / "x.bin") << "x";
  const auto f = error_for({}, dir / "media");
  EXPECT_NE(f.find("holds no video or audio file"), std::string::npos) << f;
  EXPECT_NE(f.find(".mp4"), std::string::npos) << f;
}

// Note [The keys of a JSONL manifest]: the keys of every line, decoded, in the order first seen,
// across the blocks the reader parses on several threads.
TEST(ManifestTest, JsonlGivesTheKeysItsLinesHave) {
  std::string text = "{\"id\": \"a\", \"vid\": \"a.mp4\", \"text\": \"x\"}\n\n";
  text += "{\"text\": \"y\", \"id\": \"b\", \"\\u006cabel\": 1}\n";
  for (int i = 0; i < 40000; ++i) {  // past the reader's first block
    text += "{\"id\": \"n" + std::to_string(i) + "\", \"text\": \"words words words\"}\n";
  }
  text += "{\"id\": \"last\", \"text\": \"z\", \"label\": 2, \"late\": null}\n";
  std::istringstream in(text);
  InputColumns columns;
  const auto s = parse_manifest(in, ManifestFormat::kJsonl, "/data", "m", {}, &columns);
  EXPECT_EQ(s.size(), 40003u);
  EXPECT_EQ(columns.layout, InputLayout::kJsonl);
  EXPECT_EQ(columns.name, "m");
  EXPECT_EQ(columns.names, (std::vector<std::string>{"id", "vid", "text", "label", "late"}));
  EXPECT_FALSE(columns.more_names);
}

TEST(ManifestTest, AJsonlLineWithoutInputListsItsKeys) {
  const auto error =
      error_of("{\"id\": \"a\", \"text\": \"x\"}\n"
               "{\"id\": \"b\", \"vid\": \"b.mp4\", \"Text\": \"y\", \"video\": null}\n",
               ManifestFormat::kJsonl);
  EXPECT_NE(error.find("m line 2: sample 'b' has none of 'video', 'audio', 'text'"),
            std::string::npos) << error;
  EXPECT_NE(error.find("the line has the keys 'id', 'vid', 'Text', 'video'"), std::string::npos)
      << error;
}

TEST(ManifestTest, AHeaderWithoutAnInputColumnIsListed) {
  const auto error = error_of("id,vid,caption\na,a.mp4,x\n", ManifestFormat::kCsv);
  EXPECT_NE(error.find("m line 1: no 'video', 'audio' or 'text' column (the header names 'id', "
                       "'vid', 'caption'; matched ignoring case)"),
            std::string::npos) << error;
}

TEST(ManifestTest, JsonlKeysAreCappedWhenKeysAreData) {
  std::string text;
  for (size_t i = 0; i < kMaxColumnNames + 50; ++i) {
    text += "{\"id\": \"n" + std::to_string(i) + "\", \"k" + std::to_string(i) +
            "\": 1, \"text\": \"x\"}\n";
  }
  std::istringstream in(text);
  InputColumns columns;
  parse_manifest(in, ManifestFormat::kJsonl, "/data", "m", {}, &columns);
  EXPECT_EQ(columns.names.size(), kMaxColumnNames);
  EXPECT_EQ(columns.names[1], "k0");
  EXPECT_TRUE(columns.more_names);
}

TEST(ManifestTest, DelimitedGivesItsHeaderAndFolderModeItsFiles) {
  std::istringstream in("\xEF\xBB\xBFid,Video,caption\na,a.mp4,x\n");
  InputColumns columns;
  parse_manifest(in, ManifestFormat::kCsv, "/data", "m", {}, &columns);
  EXPECT_EQ(columns.layout, InputLayout::kDelimited);
  EXPECT_EQ(columns.names, (std::vector<std::string>{"id", "Video", "caption"}));

  testing::TempDir dir;
  for (const char* name : {"a.mp4", "b.mp4", "c.wav", "a.txt", "orphan.txt", "x.bin"}) {
    std::ofstream(dir / name) << "x";
  }
  InputColumns files;
  scan_folder(dir.path(), &files);
  EXPECT_EQ(files.layout, InputLayout::kFolder);
  EXPECT_EQ(files.video_files, 2);
  EXPECT_EQ(files.audio_files, 1);
  EXPECT_EQ(files.caption_files, 2);
  EXPECT_EQ(files.lone_captions, 1);
}

TEST(ManifestTest, ReadManifestFromFile) {
  testing::TempDir dir;
  std::ofstream(dir / "m.jsonl") << "{\"id\": \"a\", \"video\": \"v/a.mp4\"}\n";
  const auto s = read_manifest(dir / "m.jsonl");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].video->file, dir / "v/a.mp4");
  EXPECT_THROW(read_manifest(dir / "none.jsonl"), InputError);
}

}  // namespace
}  // namespace precompute
