#include "pipeline/input/manifest.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "pipeline/core/error.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

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
  EXPECT_EQ(*s[0].video, "/data/clips/a.mp4");
  EXPECT_EQ(*s[0].text, "hello");
  EXPECT_FALSE(s[0].audio);
  EXPECT_EQ(s[1].id, "7");
  EXPECT_EQ(s[1].line, 3);
  EXPECT_EQ(*s[1].audio, "/abs/b.wav");
  EXPECT_EQ(s[2].seq, 2);
  ASSERT_TRUE(s[2].text.has_value());  // empty text is kept: it becomes a failure record
  EXPECT_EQ(*s[2].text, "");
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

TEST(ManifestTest, CsvHandlesQuotesDelimitersAndNewlines) {
  const auto s = parse(
      "ID,Video,text,notes\r\n"
      "a,a.mp4,\"a caption, with a comma\",x\r\n"
      "b,,\"two\nlines with \"\"quotes\"\"\",y\r\n"
      "c,c.mp4,,z\r\n",
      ManifestFormat::kCsv);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(*s[0].text, "a caption, with a comma");
  EXPECT_EQ(*s[0].video, "/data/a.mp4");
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

TEST(ManifestTest, ReadManifestFromFile) {
  testing::TempDir dir;
  std::ofstream(dir / "m.jsonl") << "{\"id\": \"a\", \"video\": \"v/a.mp4\"}\n";
  const auto s = read_manifest(dir / "m.jsonl");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(*s[0].video, dir / "v/a.mp4");
  EXPECT_THROW(read_manifest(dir / "none.jsonl"), InputError);
}

}  // namespace
}  // namespace precompute
