// The tar index on hand-made headers (the forms writers differ in: base-256 sizes, signed
// checksums, PAX and GNU long names, a missing end-of-archive), the WebDataset key split, and
// the shard names an input pattern expands to. End to end over tars made by Python's tarfile:
// tests/python/test_tar_input.py.

#include "pipeline/input/tar_index.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/media_names.hpp"
#include "pipeline/input/tar_index_cache.hpp"
#include "pipeline/input/tar_shards.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using Header = std::array<char, 512>;

// A ustar header for `name` of `size` bytes and `type`, `edit` applied before the checksum.
Header header(const std::string& name, int64_t size, char type = '0',
              const std::function<void(Header&)>& edit = {}) {
  Header h{};
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  h[156] = type;
  std::memcpy(h.data() + 257,
              "ustar\0"
              "00",
              8);
  if (edit) edit(h);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (const char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

void append(std::string& tar, const Header& h) { tar.append(h.data(), h.size()); }

void append_data(std::string& tar, const std::string& data) {
  tar += data;
  tar.append((512 - data.size() % 512) % 512, '\0');
}

std::filesystem::path write(const testing::TempDir& dir, const std::string& bytes,
                            const std::string& name = "t.tar") {
  const auto path = dir.path() / name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string index_error(const std::filesystem::path& path) {
  try {
    index_tar(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(TarIndexTest, MembersHaveTheirByteRangesAndTheEndNeedsNoZeroBlocks) {
  testing::TempDir dir;
  std::string tar;
  append(tar, header("./a.mp4", 5));
  append_data(tar, "hello");
  append(tar, header("sub/", 0, '5'));
  append(tar, header("sub/b.txt", 600));
  append_data(tar, std::string(600, 'x'));
  const TarIndex index = index_tar(write(dir, tar));
  ASSERT_EQ(index.members.size(), 2u);  // the folder is left out
  EXPECT_EQ(index.members[0].name, "a.mp4");
  EXPECT_EQ(index.members[0].offset, 512);
  EXPECT_EQ(index.members[0].size, 5);
  EXPECT_EQ(index.members[1].name, "sub/b.txt");
  EXPECT_EQ(index.members[1].offset, 512 * 4);
  EXPECT_EQ(index.members[1].size, 600);
  EXPECT_TRUE(index.members[1].refusal.empty());
}

TEST(TarIndexTest, ReadsBase256SizesAndSignedChecksums) {
  testing::TempDir dir;
  std::string tar;
  append(tar, header("big.mp4", 0, '0', [](Header& h) {
           std::memset(h.data() + 124, 0, 12);
           h[124] = static_cast<char>(0x80);
           h[135] = 3;  // 3 bytes, in GNU's base-256 form
         }));
  append_data(tar, "abc");
  Header signed_sum = header("\xC3\xA9t\xC3\xA9.mp4", 0);
  // Rewrite the checksum as a signed-char sum, as some old writers did.
  std::memset(signed_sum.data() + 148, ' ', 8);
  int sum = 0;
  for (const char c : signed_sum) sum += static_cast<signed char>(c);
  std::snprintf(signed_sum.data() + 148, 8, "%06o", sum);
  append(tar, signed_sum);
  tar.append(1024, '\0');
  const TarIndex index = index_tar(write(dir, tar));
  ASSERT_EQ(index.members.size(), 2u);
  EXPECT_EQ(index.members[0].size, 3);
  EXPECT_EQ(index.members[1].name, "\xC3\xA9t\xC3\xA9.mp4");
}

TEST(TarIndexTest, LongNamesFromPaxAndGnuRecordsAndUstarPrefixes) {
  testing::TempDir dir;
  const std::string long_name = std::string(150, 'n') + "/key.mp4";
  std::string tar;
  const std::string record = "30 path=" + std::string(17, 'p') + ".mp4\n";
  ASSERT_EQ(record.size(), 30u);
  append(tar, header("PaxHeader", static_cast<int64_t>(record.size()), 'x'));
  append_data(tar, record);
  append(tar, header("short", 1));
  append_data(tar, "1");
  append(tar, header("././@LongLink", static_cast<int64_t>(long_name.size() + 1), 'L'));
  append_data(tar, long_name + '\0');
  append(tar, header("truncated-name", 2));
  append_data(tar, "22");
  append(tar,
         header("k.txt", 1, '0', [](Header& h) { std::memcpy(h.data() + 345, "pre/fix", 7); }));
  append_data(tar, "3");
  tar.append(1024, '\0');
  const TarIndex index = index_tar(write(dir, tar));
  ASSERT_EQ(index.members.size(), 3u);
  EXPECT_EQ(index.members[0].name, std::string(17, 'p') + ".mp4");
  EXPECT_EQ(index.members[1].name, long_name);
  EXPECT_EQ(index.members[2].name, "pre/fix/k.txt");
}

TEST(TarIndexTest, LinksDevicesAndUnsafeNamesAreIndexedWithTheirReason) {
  testing::TempDir dir;
  std::string tar;
  append(tar, header("s.mp4", 0, '2'));
  append(tar, header("h.mp4", 0, '1'));
  append(tar, header("c.mp4", 0, '3'));
  append(tar, header("f.mp4", 0, '6'));
  append(tar, header("../up.mp4", 1));
  append_data(tar, "u");
  append(tar, header("/abs.mp4", 1));
  append_data(tar, "a");
  append(tar, header("a/../../b.mp4", 1));
  append_data(tar, "b");
  const TarIndex index = index_tar(write(dir, tar));
  ASSERT_EQ(index.members.size(), 7u);
  EXPECT_NE(index.members[0].refusal.find("symbolic link"), std::string::npos);
  EXPECT_NE(index.members[1].refusal.find("hard link"), std::string::npos);
  EXPECT_NE(index.members[2].refusal.find("character device"), std::string::npos);
  EXPECT_NE(index.members[3].refusal.find("FIFO"), std::string::npos);
  EXPECT_NE(index.members[4].refusal.find("'..'"), std::string::npos);
  EXPECT_NE(index.members[5].refusal.find("absolute"), std::string::npos);
  EXPECT_NE(index.members[6].refusal.find("'..'"), std::string::npos);
}

TEST(TarIndexTest, DamageIsRefusedNamingTheTarTheOffsetAndTheLastMember) {
  testing::TempDir dir;
  std::string good;
  append(good, header("a.mp4", 5));
  append_data(good, "hello");
  std::string bad_sum = good;
  append(bad_sum, header("b.mp4", 1));
  bad_sum[512 * 2 + 3] ^= 1;
  append_data(bad_sum, "b");
  std::string message = index_error(write(dir, bad_sum));
  EXPECT_NE(message.find("checksum is wrong at byte 1024, after member 'a.mp4'"), std::string::npos)
      << message;

  std::string cut = good;
  append(cut, header("b.mp4", 100000));
  cut += "only a little";
  message = index_error(write(dir, cut));
  EXPECT_NE(message.find("ends inside the data of member 'b.mp4'"), std::string::npos) << message;

  message = index_error(write(dir, good + std::string(100, 'x')));
  EXPECT_NE(message.find("ends inside a header"), std::string::npos) << message;

  std::string orphan = good;
  append(orphan, header("././@LongLink", 4, 'L'));
  append_data(orphan, "abc");
  message = index_error(write(dir, orphan));
  EXPECT_NE(message.find("no member after it"), std::string::npos) << message;

  std::string pax = good;
  append(pax, header("PaxHeader", 12, 'x'));
  append_data(pax, "99 path=x\n\n\n");
  message = index_error(write(dir, pax));
  EXPECT_NE(message.find("malformed PAX"), std::string::npos) << message;

  std::string huge = good;
  append(huge, header("h.mp4", 0, '0', [](Header& h) { std::memcpy(h.data() + 124, "9999", 4); }));
  message = index_error(write(dir, huge));
  EXPECT_NE(message.find("size field is not a number"), std::string::npos) << message;

  EXPECT_NE(index_error(dir.path() / "absent.tar").find("cannot open tar"), std::string::npos);
  EXPECT_NE(index_error(dir.path()).find("not a regular file"), std::string::npos);
}

TEST(TarIndexTest, AZeroBlockEndsTheArchive) {
  testing::TempDir dir;
  std::string tar;
  append(tar, header("a.mp4", 1));
  append_data(tar, "a");
  tar.append(512, '\0');
  tar += std::string(512, 'x');  // what follows the end is not read
  EXPECT_EQ(index_tar(write(dir, tar)).members.size(), 1u);
}

// Note [Tar indexes kept in the output folder]: a kept index's file reads back as the index it
// was made from, and any damage to it reads as no file at all.
TEST(TarIndexCacheTest, AKeptIndexReadsBackAndDamageIsNoIndex) {
  TarIndex index;
  index.tar = "/data/shards/000001.tar";
  index.tar_bytes = 1 << 20;
  index.modified_ns = 1'700'000'000'123'456'789;
  index.inode = 42;
  index.device = 2049;
  index.members = {{"a b.mp4", 512, 100, ""},
                   {"line\nbreak.txt", 1536, 7, ""},
                   {std::string("bad\xff name.mp4"), 2560, 0, "a symbolic link member"}};
  const std::string bytes = encode_tar_index(index);
  const auto back = decode_tar_index(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->tar, index.tar);
  EXPECT_EQ(back->tar_bytes, index.tar_bytes);
  EXPECT_EQ(back->modified_ns, index.modified_ns);
  EXPECT_EQ(back->inode, index.inode);
  EXPECT_EQ(back->device, index.device);
  ASSERT_EQ(back->members.size(), index.members.size());
  for (size_t m = 0; m < index.members.size(); ++m) {
    EXPECT_EQ(back->members[m].name, index.members[m].name);
    EXPECT_EQ(back->members[m].offset, index.members[m].offset);
    EXPECT_EQ(back->members[m].size, index.members[m].size);
    EXPECT_EQ(back->members[m].refusal, index.members[m].refusal);
  }
  for (size_t at = 0; at < bytes.size(); ++at) {  // every byte changed, one at a time
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x20);
    EXPECT_FALSE(decode_tar_index(damaged).has_value()) << "byte " << at;
  }
  for (size_t size = 0; size < bytes.size(); ++size) {  // cut short anywhere
    EXPECT_FALSE(decode_tar_index(std::string_view(bytes).substr(0, size)).has_value()) << size;
  }
  EXPECT_FALSE(decode_tar_index(bytes + "x").has_value());
}

// A kept index is used only for the file it was made from: the same path, size, modification
// time, inode and device; a changed tar, or a damaged file, is scanned again.
TEST(TarIndexCacheTest, AKeptIndexIsUsedOnlyForTheSameFile) {
  testing::TempDir dir;
  std::string bytes;
  append(bytes, header("a.mp4", 5));
  append_data(bytes, "hello");
  const auto tar = write(dir, bytes);
  const auto out = dir / "out";
  std::filesystem::create_directories(out);
  const auto keep = [&](TarIndexCache& cache) {
    for (const auto& [name, file] : cache.take_files()) {
      EXPECT_EQ(name.rfind(".precompute.tar-index.", 0), 0u) << name;
      std::ofstream(out / name, std::ios::binary) << file;
    }
  };
  {
    TarIndexCache cache(out);
    EXPECT_EQ(cache.index(tar).members.size(), 1u);
    EXPECT_EQ(cache.scanned(), 1);
    keep(cache);
  }
  {
    TarIndexCache cache(out);
    const TarIndex kept = cache.index(tar);
    EXPECT_EQ(cache.reused(), 1);
    EXPECT_EQ(cache.scanned(), 0);
    EXPECT_EQ(kept.tar, tar);  // as the input names it
    ASSERT_EQ(kept.members.size(), 1u);
    EXPECT_EQ(kept.members[0].offset, 512);
    EXPECT_TRUE(cache.take_files().empty());
  }
  {
    TarIndexCache readonly(out, /*keep_fresh=*/false);
    std::filesystem::last_write_time(tar, std::filesystem::last_write_time(tar) +
                                              std::chrono::seconds(5));
    EXPECT_EQ(readonly.index(tar).members.size(), 1u);
    EXPECT_EQ(readonly.scanned(), 1);  // another modification time
    EXPECT_TRUE(readonly.take_files().empty());
  }
  {
    TarIndexCache cache(out);
    cache.index(tar);
    EXPECT_EQ(cache.scanned(), 1);
    keep(cache);
    // The file damaged: scanned again.
    const auto file = out / tar_index_file_name(tar);
    std::string text;
    {
      std::ifstream in(file, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    text[text.size() / 2] ^= 1;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
    TarIndexCache again(out);
    again.index(tar);
    EXPECT_EQ(again.scanned(), 1);
    EXPECT_EQ(again.reused(), 0);
  }
  // No folder: every tar is scanned and nothing is kept.
  TarIndexCache none;
  none.index(tar);
  EXPECT_EQ(none.scanned(), 1);
  EXPECT_TRUE(none.take_files().empty());
}

TEST(TarIndexTest, MemberKeySplitsAtTheFirstDotOfTheName) {
  EXPECT_EQ(member_key("a/b.c.mp4").key, "a/b");
  EXPECT_EQ(member_key("a/b.c.mp4").suffix, "c.mp4");
  EXPECT_EQ(member_key("x.y/z.mp4").key, "x.y/z");
  EXPECT_EQ(member_key("plain").key, "plain");
  EXPECT_EQ(member_key("plain").suffix, "");
  EXPECT_EQ(member_key("trailing.").key, "trailing");  // a dot and nothing after it
  EXPECT_EQ(member_key("trailing.").suffix, "");
}

TEST(TarShardsTest, BraceRangesKeepTheWidthAndListsExpandInOrder) {
  const auto names = [](const std::string& pattern) {
    std::vector<std::string> out;
    for (const auto& p : expand_tar_shards(pattern)) out.push_back(p.string());
    return out;
  };
  EXPECT_EQ(names("s/{08..11}.tar"),
            (std::vector<std::string>{"s/08.tar", "s/09.tar", "s/10.tar", "s/11.tar"}));
  EXPECT_EQ(names("{a,b}-{0..1}.tar"),
            (std::vector<std::string>{"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"}));
  const auto error = [&](const std::string& pattern) {
    try {
      names(pattern);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("{5..1}.tar").find("backwards"), std::string::npos);
  EXPECT_NE(error("{a..b}.tar").find("two numbers"), std::string::npos);
  EXPECT_NE(error("{0..1.tar").find("without its '}'"), std::string::npos);
  EXPECT_NE(error("0..1}.tar").find("without its '{'"), std::string::npos);
  EXPECT_NE(error("{x}.tar").find("neither a range"), std::string::npos);
  EXPECT_NE(error("{0..99999999}.tar").find("more than 1000000 "), std::string::npos);
  EXPECT_NE(error("{0..3}{0..999999}.tar").find("more than 1000000 "), std::string::npos);
  EXPECT_NE(error("s/{0..1}.tar.gz").find("gunzip -k"), std::string::npos);
  EXPECT_NE(error("s.tar.zst").find("zstd -d"), std::string::npos);
  EXPECT_NE(error("s/{0..1}.zip").find("does not end in .tar"), std::string::npos);
  EXPECT_NE(error("").find("input.tars is empty"), std::string::npos);
}

TEST(TarShardsTest, AFolderGivesItsTarsInNameOrder) {
  testing::TempDir dir;
  for (const char* name : {"b.tar", "a.TAR", "c.mp4x", "notes.txt"}) {
    std::ofstream(dir.path() / name) << "x";
  }
  const auto tars = expand_tar_shards(dir.path());
  ASSERT_EQ(tars.size(), 2u);
  EXPECT_EQ(tars[0].filename(), "a.TAR");
  EXPECT_EQ(tars[1].filename(), "b.tar");
  EXPECT_TRUE(names_tar_shards(dir.path()));
  std::ofstream(dir.path() / "clip.mp4") << "x";  // media beside the tars: a media folder
  EXPECT_FALSE(names_tar_shards(dir.path()));
  testing::TempDir empty;
  EXPECT_FALSE(names_tar_shards(empty.path()));
  EXPECT_TRUE(names_tar_shards("shards/{0..9}.tar"));
  EXPECT_TRUE(names_tar_shards("x.tar.gz"));
  EXPECT_FALSE(names_tar_shards("m.jsonl"));
  std::ofstream(dir.path() / "{x}.jsonl") << "{}";  // an existing file is what it is
  EXPECT_FALSE(names_tar_shards(dir.path() / "{x}.jsonl"));
  EXPECT_TRUE(names_tar_shards(dir.path() / "{0..1}.jsonl"));
}

}  // namespace
}  // namespace precompute
