#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "common/status_assertions.hpp"
#include "embcache/criteo.hpp"
#include "embcache/keyset.hpp"
#include "embcache/shard.hpp"
#include "test_util.hpp"

namespace embcache {
namespace {

using test::read_bytes;
using test::scratch_dir;
using test::write_bytes;
using test::write_text;

// A well-formed line built from row number i (made-up values, not Criteo data).
std::string make_line(int i) {
  std::string s = std::to_string(i % 3 == 0 ? 1 : 0);
  for (int j = 0; j < 13; ++j) {
    s += '\t';
    if ((i + j) % 5 != 0) s += std::to_string((i * 31 + j * 7) % 200 - 3);
  }
  for (int j = 0; j < 26; ++j) {
    s += '\t';
    if ((i + j) % 11 != 0) s += "v" + std::to_string((i * (j + 1)) % (j + 4)) + "x";
  }
  return s;
}

std::string make_tsv(int first, int n) {
  std::string s;
  for (int i = first; i < first + n; ++i) s += make_line(i) + "\n";
  return s;
}

void write_gz(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb6");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

criteo_sample parse_ok(const std::string& line, const criteo_parse_options& o = {}) {
  criteo_sample s;
  status st = parse_criteo_line(line, o, s);
  EMBCACHE_EXPECT_OK(st);
  return s;
}

std::string parse_error(const std::string& line, const criteo_parse_options& o = {}) {
  criteo_sample s;
  status st = parse_criteo_line(line, o, s);
  EXPECT_EQ(st.code(), status_code::corruption);
  return st.message();
}

// ---- parsing and hashing --------------------------------------------------------------------

TEST(criteo_parse, preprocesses_like_hugectr_samples) {
  std::string line = "1\t0\t-2\t\t9\t1\t2\t3\t4\t5\t6\t7\t8\t+12";
  for (int j = 0; j < 26; ++j) line += j == 4 ? "\t" : "\tab" + std::to_string(j);
  const criteo_sample s = parse_ok(line);
  EXPECT_EQ(s.label, 1.0f);
  EXPECT_EQ(s.dense[0], 0.0f);  // log1p(0)
  EXPECT_EQ(s.dense[1], 0.0f);  // negative clipped to 0
  EXPECT_EQ(s.dense[2], 0.0f);  // missing
  EXPECT_EQ(s.dense[3], static_cast<float>(std::log1p(9.0)));
  EXPECT_EQ(s.dense[12], static_cast<float>(std::log1p(12.0)));
  EXPECT_EQ(s.keys[0], criteo_key(0, "ab0"));
  EXPECT_EQ(s.keys[25], criteo_key(25, "ab25"));
  EXPECT_EQ(s.keys[4], criteo_key(4, ""));  // a missing value has a key of its own

  criteo_parse_options identity;
  identity.transform = dense_transform::identity;
  const criteo_sample t = parse_ok(line + "\r", identity);  // CRLF tolerated
  EXPECT_EQ(t.dense[1], -2.0f);
  EXPECT_EQ(t.dense[2], 0.0f);
  EXPECT_EQ(t.dense[12], 12.0f);
  EXPECT_EQ(t.keys, s.keys);

  criteo_parse_options seeded;
  seeded.hash_seed = 5;
  EXPECT_EQ(parse_ok(line, seeded).keys[0], criteo_key(0, "ab0", 5));
  EXPECT_NE(criteo_key(0, "ab0", 5), criteo_key(0, "ab0", 0));
}

TEST(criteo_parse, empty_view_without_data_is_one_empty_field) {
  // A default string_view has a null data(); under -fsanitize=undefined this pins that the
  // parser never hands it to memchr.
  criteo_sample s;
  const status st = parse_criteo_line(std::string_view(), {}, s);
  EXPECT_EQ(st.code(), status_code::corruption);
  EXPECT_EQ(st.message(), "has 1 fields, expected 40");
}

TEST(criteo_parse, keys_fold_the_slot_in) {
  const std::int64_t a = criteo_key(3, "68fd1e64");
  const std::int64_t b = criteo_key(4, "68fd1e64");
  EXPECT_NE(a, b);
  EXPECT_EQ(criteo_key_tag(a), 3u);
  EXPECT_EQ(criteo_key_tag(b), 4u);
  EXPECT_GT(a, 0);
  EXPECT_EQ(criteo_key_tag(criteo_oov_key(7)), 7u);
  EXPECT_EQ(criteo_oov_key(7), std::int64_t{8} << 56);
  EXPECT_NE(criteo_key(7, ""), criteo_oov_key(7));
  const std::int64_t c = criteo_cross_key(2, a, b);
  EXPECT_EQ(criteo_key_tag(c), 28u);
  EXPECT_NE(c, criteo_cross_key(2, b, a));
  EXPECT_EQ(criteo_cross_pairs[12], (std::pair<std::uint8_t, std::uint8_t>{24, 25}));
}

TEST(criteo_parse, malformed_lines_say_why) {
  const std::string good = make_line(1);
  EXPECT_EQ(parse_error(good.substr(0, good.rfind('\t'))), "has 39 fields, expected 40");
  EXPECT_EQ(parse_error(good + "\tx"), "has 41 fields, expected 40");
  EXPECT_EQ(parse_error(""), "has 1 fields, expected 40");

  std::string bad = "0\t1\t2\tabc" + good.substr(good.find('\t', good.find('\t', 2) + 3));
  // Rebuild precisely: replace field I3 with "abc".
  std::vector<std::string> f;
  std::size_t p = 0;
  while (true) {
    std::size_t t = good.find('\t', p);
    f.push_back(good.substr(p, t == std::string::npos ? std::string::npos : t - p));
    if (t == std::string::npos) break;
    p = t + 1;
  }
  ASSERT_EQ(f.size(), 40u);
  auto join = [](std::vector<std::string> v) {
    std::string s = v[0];
    for (std::size_t i = 1; i < v.size(); ++i) s += "\t" + v[i];
    return s;
  };
  auto with = [&](std::size_t i, const std::string& v) {
    auto g = f;
    g[i] = v;
    return join(g);
  };
  EXPECT_EQ(parse_error(with(3, "abc")), "field I3 (column 4) 'abc' is not an integer");
  EXPECT_EQ(parse_error(with(3, "12x")), "field I3 (column 4) '12x' is not an integer");
  EXPECT_EQ(parse_error(with(3, "1.5")), "field I3 (column 4) '1.5' is not an integer");
  EXPECT_EQ(parse_error(with(3, "-")), "field I3 (column 4) '-' is not an integer");
  EXPECT_EQ(parse_error(with(3, "+")), "field I3 (column 4) '+' is not an integer");
  EXPECT_EQ(parse_error(with(13, "99999999999999999999")),
            "field I13 (column 14) '99999999999999999999' is out of the int64 range");
  EXPECT_EQ(parse_error(with(0, "2")), "field label (column 1) is '2', expected 0 or 1");
  EXPECT_EQ(parse_error(with(0, "")), "field label (column 1) is empty, expected 0 or 1");
  EXPECT_EQ(parse_error(with(20, std::string(65, 'a'))),
            "field C7 (column 21) is 65 bytes long, the limit is 64");
  EXPECT_TRUE(parse_ok(with(20, std::string(64, 'a'))).keys[6] ==
              criteo_key(6, std::string(64, 'a')));
}

// ---- prepare_criteo -------------------------------------------------------------------------

prep_options options(const scratch_dir& dir, std::vector<std::string> inputs) {
  prep_options o;
  o.inputs = std::move(inputs);
  o.output_dir = dir / "out";
  o.rows_per_shard = 16;
  return o;
}

// Every sample of the dataset, in shard order, read back through shard_reader.
std::vector<criteo_sample> read_back(const dataset_summary& d, std::vector<std::int64_t>* crossed) {
  std::vector<std::string> paths;
  for (const auto& f : d.shards) paths.push_back(f.shard);
  shard_reader_options ro;
  ro.batch_size = 5;
  auto r = shard_reader::open(paths, ro);
  EMBCACHE_EXPECT_OK(r);
  std::vector<criteo_sample> out;
  shard_batch b;
  while (r.value()->next(b).ok() && b.size) {
    for (std::size_t k = 0; k < b.size; ++k) {
      criteo_sample s;
      s.label = b.labels[k];
      std::copy_n(&b.dense[k * 13], 13, s.dense.begin());
      std::copy_n(&b.keys[k * 26], 26, s.keys.begin());
      out.push_back(s);
      if (crossed)
        crossed->insert(crossed->end(), &b.crossed[k * b.num_crossed],
                        &b.crossed[k * b.num_crossed] + b.num_crossed);
    }
  }
  return out;
}

void expect_same(const criteo_sample& a, const criteo_sample& b, int row) {
  EXPECT_EQ(a.label, b.label) << "row " << row;
  EXPECT_EQ(a.dense, b.dense) << "row " << row;
  EXPECT_EQ(a.keys, b.keys) << "row " << row;
}

TEST(prep, tsv_to_shards_to_reader_gives_back_the_parsed_input) {
  scratch_dir dir;
  write_text(dir / "a.tsv", make_tsv(0, 30));
  write_text(dir / "b.tsv", make_tsv(30, 20));
  auto r = prepare_criteo(options(dir, {dir / "a.tsv", dir / "b.tsv"}));
  EMBCACHE_ASSERT_OK(r);
  const prep_summary& s = r.value();
  EXPECT_EQ(s.dataset.rows, 50u);
  EXPECT_EQ(s.lines, 50u);
  EXPECT_EQ(s.malformed, 0u);
  EXPECT_EQ(s.dataset.shards.size(), 4u);  // 16 + 16 + 16 + 2
  EXPECT_EQ(s.dataset.shards[3].rows, 2u);
  EXPECT_DOUBLE_EQ(s.dataset.label_mean, 17.0 / 50.0);
  EXPECT_EQ(s.bytes, make_tsv(0, 50).size());

  const auto samples = read_back(s.dataset, nullptr);
  ASSERT_EQ(samples.size(), 50u);
  std::vector<std::set<std::int64_t>> per_slot(26);
  for (int i = 0; i < 50; ++i) {
    const criteo_sample e = parse_ok(make_line(i));
    expect_same(samples[i], e, i);
    for (int j = 0; j < 26; ++j) per_slot[j].insert(e.keys[j]);
  }
  for (int j = 0; j < 26; ++j) EXPECT_EQ(s.dataset.unique_keys[j], per_slot[j].size()) << j;

  // Each keyset equals the unique keys of its shard.
  std::size_t row = 0;
  for (const auto& f : s.dataset.shards) {
    std::set<std::int64_t> keys;
    for (std::uint64_t i = 0; i < f.rows; ++i, ++row) {
      keys.insert(samples[row].keys.begin(), samples[row].keys.end());
    }
    auto k = read_keyset<std::int64_t>(f.keyset);
    EMBCACHE_ASSERT_OK(k);
    EXPECT_EQ(k.value(), std::vector<std::int64_t>(keys.begin(), keys.end())) << f.keyset;
  }
}

TEST(prep, gzip_input_gives_the_same_shards_as_plain_text) {
  scratch_dir dir;
  const std::string text = make_tsv(0, 40);
  write_text(dir / "in.tsv", text);
  write_gz(dir / "in.tsv.gz", text);
  auto plain = prepare_criteo(options(dir, {dir / "in.tsv"}));
  EMBCACHE_ASSERT_OK(plain);
  auto o = options(dir, {dir / "in.tsv.gz"});
  o.output_dir = dir / "gz";
  auto gz = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(gz);
  ASSERT_EQ(gz.value().dataset.shards.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(read_bytes(plain.value().dataset.shards[i].shard),
              read_bytes(gz.value().dataset.shards[i].shard));
    EXPECT_EQ(read_bytes(plain.value().dataset.shards[i].keyset),
              read_bytes(gz.value().dataset.shards[i].keyset));
  }
}

TEST(prep, progress_counts_the_file_bytes_consumed_compressed_for_gzip) {
  scratch_dir dir;
  const std::string text = make_tsv(0, 400);
  write_text(dir / "in.tsv", text);
  write_gz(dir / "in.tsv.gz", text);
  const std::uint64_t plain_size = read_bytes(dir / "in.tsv").size();
  const std::uint64_t gz_size = read_bytes(dir / "in.tsv.gz").size();
  ASSERT_LT(gz_size, plain_size);  // compressed: the two counts differ
  auto o = options(dir, {dir / "in.tsv", dir / "in.tsv.gz"});
  o.rare_threshold = 2;  // two passes, each reported to its end
  std::vector<prep_progress> seen;
  o.on_progress = [&](const prep_progress& p) { seen.push_back(p); };
  EMBCACHE_ASSERT_OK(prepare_criteo(o));
  ASSERT_EQ(seen.size(), 2u);  // a run this short reports only the end of each pass
  for (int pass = 1; pass <= 2; ++pass) {
    const prep_progress& p = seen[std::size_t(pass - 1)];
    EXPECT_EQ(p.pass, pass);
    EXPECT_EQ(p.passes, 2);
    EXPECT_EQ(p.lines, 800u);
    EXPECT_EQ(p.bytes, 2 * plain_size);  // uncompressed
    EXPECT_EQ(p.input_total, plain_size + gz_size);
    EXPECT_EQ(p.input_bytes, plain_size + gz_size);
    EXPECT_EQ(p.file_index, 1u);
  }
}

TEST(prep, malformed_lines_are_counted_and_reported_by_file_and_line) {
  scratch_dir dir;
  std::string text;
  text += make_line(0) + "\n";
  text += "1\t2\t3\n";  // line 2: 3 fields
  text += make_line(1) + "\n";
  text += "\n";  // line 4: empty
  std::string bad = make_line(2);
  bad.replace(bad.find('\t'), 1, "\tzz");  // line 5: I1 = "zz..."
  text += bad + "\n";
  text += make_line(3) + "\r\n";                  // CRLF is fine
  text += "0" + std::string(70000, '\t') + "\n";  // line 7: over-long line
  text += make_line(4);                           // no final newline
  write_text(dir / "m.tsv", text);
  auto o = options(dir, {dir / "m.tsv"});
  o.max_reported = 3;
  auto r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  const prep_summary& s = r.value();
  EXPECT_EQ(s.lines, 8u);
  EXPECT_EQ(s.dataset.rows, 4u);
  EXPECT_EQ(s.malformed, 4u);
  ASSERT_EQ(s.reports.size(), 3u);
  const std::string f = dir / "m.tsv";
  EXPECT_EQ(s.reports[0], f + ":2: has 3 fields, expected 40");
  EXPECT_EQ(s.reports[1], f + ":4: has 1 fields, expected 40");
  EXPECT_EQ(s.reports[2].rfind(f + ":5: field I1 (column 2) 'zz", 0), 0u) << s.reports[2];
  const auto samples = read_back(s.dataset, nullptr);
  ASSERT_EQ(samples.size(), 4u);
  for (int i = 0; i < 4; ++i)
    expect_same(samples[i], parse_ok(make_line(i == 2 ? 3 : i == 3 ? 4 : i)), i);

  o.max_reported = 10;
  o.overwrite = true;
  auto all = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(all);
  ASSERT_EQ(all.value().reports.size(), 4u);
  EXPECT_EQ(all.value().reports[3], f + ":7: line longer than 65536 bytes");
}

TEST(prep, lines_longer_than_the_read_buffer_are_skipped_whole) {
  scratch_dir dir;
  // 3 MiB without a newline spans several read chunks; the reader must resynchronise after it.
  const std::string huge(3 << 20, 'x');
  write_text(dir / "h.tsv", huge + "\n" + make_line(0) + "\n" + huge);
  auto r = prepare_criteo(options(dir, {dir / "h.tsv"}));
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().lines, 3u);
  EXPECT_EQ(r.value().dataset.rows, 1u);
  EXPECT_EQ(r.value().malformed, 2u);
  ASSERT_EQ(r.value().reports.size(), 2u);
  EXPECT_EQ(r.value().reports[0], (dir / "h.tsv") + ":1: line longer than 65536 bytes");
  EXPECT_EQ(r.value().reports[1], (dir / "h.tsv") + ":3: line longer than 65536 bytes");
  const auto samples = read_back(r.value().dataset, nullptr);
  ASSERT_EQ(samples.size(), 1u);
  expect_same(samples[0], parse_ok(make_line(0)), 0);
}

TEST(prep, strict_stops_at_the_first_malformed_line) {
  scratch_dir dir;
  write_text(dir / "m.tsv", make_tsv(0, 3) + "1\t2\n" + make_tsv(3, 3));
  auto o = options(dir, {dir / "m.tsv"});
  o.strict = true;
  auto r = prepare_criteo(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.get_status().code(), status_code::corruption);
  EXPECT_EQ(r.get_status().message(), (dir / "m.tsv") + ":4: has 2 fields, expected 40");
  // Also in the counting pass of the rare filter.
  o.rare_threshold = 2;
  o.output_dir = dir / "out2";
  r = prepare_criteo(o);
  EXPECT_EQ(r.get_status().message(), (dir / "m.tsv") + ":4: has 2 fields, expected 40");
}

TEST(prep, broken_gzip_is_reported_not_fatal) {
  scratch_dir dir;
  const std::string text = make_tsv(0, 3000);
  write_gz(dir / "in.gz", text);
  auto gz = read_bytes(dir / "in.gz");
  ASSERT_GT(gz.size(), 2000u);

  // Truncated stream: the rows before the cut survive, the break is one malformed line.
  std::vector<char> cut(gz.begin(), gz.begin() + gz.size() / 2);
  write_bytes(dir / "cut.gz", cut);
  write_text(dir / "next.tsv", make_tsv(0, 2));
  auto r = prepare_criteo(options(dir, {dir / "cut.gz", dir / "next.tsv"}));
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().malformed, 1u);
  ASSERT_EQ(r.value().reports.size(), 1u);
  const std::string& rep = r.value().reports[0];
  EXPECT_EQ(rep.rfind(dir / "cut.gz", 0), 0u);
  EXPECT_NE(rep.find(": gzip stream broken: unexpected end of file (truncated)"), std::string::npos)
      << rep;
  const std::uint64_t rows = r.value().dataset.rows;
  EXPECT_GT(rows, 2u);
  EXPECT_LT(rows, 3002u);
  // The line number of the report is the line after the last complete one.
  EXPECT_EQ(rep, (dir / "cut.gz") + ":" + std::to_string(rows - 2 + 1) +
                     ": gzip stream broken: unexpected end of file (truncated)");

  // Damaged bytes inside the deflate stream.
  auto bad = gz;
  for (std::size_t i = gz.size() / 3; i < gz.size() / 3 + 64; ++i)
    bad[i] = static_cast<char>(~bad[i]);
  write_bytes(dir / "bad.gz", bad);
  // (next.tsv adds valid rows: a run where the break leaves none at all is an error.)
  auto o = options(dir, {dir / "bad.gz", dir / "next.tsv"});
  o.output_dir = dir / "out2";
  r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_GE(r.value().malformed, 1u);
  EXPECT_LT(r.value().dataset.rows, 3002u);
  ASSERT_FALSE(r.value().reports.empty());
  EXPECT_NE(r.value().reports.back().find("gzip stream broken"), std::string::npos)
      << r.value().reports.back();
}

TEST(prep, missing_input_is_not_found) {
  scratch_dir dir;
  auto r = prepare_criteo(options(dir, {dir / "nope.tsv"}));
  EXPECT_EQ(r.get_status().code(), status_code::not_found);
  EXPECT_NE(r.get_status().message().find(dir / "nope.tsv"), std::string::npos);
}

TEST(prep, rare_values_map_to_one_oov_key_per_slot) {
  scratch_dir dir;
  // Slot C1: "aa" three times, "bb" twice, "cc" once; every other field fixed.
  std::string rest;
  for (int j = 0; j < 13; ++j) rest += "\t1";
  std::string tail;
  for (int j = 1; j < 26; ++j) tail += "\tk";
  std::string text;
  for (const char* v : {"aa", "bb", "aa", "cc", "bb", "aa"}) {
    text += "0" + rest + "\t" + v + tail + "\n";
  }
  write_text(dir / "r.tsv", text);
  auto o = options(dir, {dir / "r.tsv"});
  o.rare_threshold = 3;
  o.cross = true;
  auto r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  EXPECT_EQ(r.value().rare_replaced, 3u);
  EXPECT_EQ(r.value().dataset.unique_keys[0], 2u);  // "aa" and OOV
  EXPECT_EQ(r.value().dataset.unique_keys[1], 1u);
  std::vector<std::int64_t> crossed;
  const auto samples = read_back(r.value().dataset, &crossed);
  ASSERT_EQ(samples.size(), 6u);
  const std::int64_t aa = criteo_key(0, "aa");
  const std::int64_t oov = criteo_oov_key(0);
  const std::vector<std::int64_t> c1 = {aa, oov, aa, oov, oov, aa};
  ASSERT_EQ(crossed.size(), 6u * criteo_cross_count);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(samples[i].keys[0], c1[i]) << i;
    EXPECT_EQ(samples[i].keys[1], criteo_key(1, "k"));
    std::int64_t expect[criteo_cross_count];
    criteo_cross_keys(samples[i].keys.data(), expect);
    EXPECT_TRUE(std::equal(expect, expect + criteo_cross_count, &crossed[i * criteo_cross_count]));
  }
  const auto& f = r.value().dataset.shards.at(0);
  EXPECT_EQ(read_keyset<std::int64_t>(f.crossed_keyset).value().size(), 2u + 12u);
  EXPECT_EQ(r.value().dataset.unique_crossed_keys, 2u + 12u);
}

TEST(prep, raw_keyset_format_holds_the_same_keys) {
  scratch_dir dir;
  write_text(dir / "a.tsv", make_tsv(0, 20));
  auto ours = prepare_criteo(options(dir, {dir / "a.tsv"}));
  EMBCACHE_ASSERT_OK(ours);
  auto o = options(dir, {dir / "a.tsv"});
  o.output_dir = dir / "raw";
  o.keyset = keyset_format::hugectr_raw;
  auto raw = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(raw);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& a = ours.value().dataset.shards[i];
    const auto& b = raw.value().dataset.shards[i];
    const auto ka = read_keyset<std::int64_t>(a.keyset).value();
    EXPECT_EQ(read_keyset<std::int64_t>(b.keyset, keyset_format::hugectr_raw).value(), ka);
    EXPECT_EQ(read_bytes(b.keyset).size(), ka.size() * 8);
  }
  EXPECT_EQ(read_dataset_manifest(o.output_dir).value().keyset, keyset_format::hugectr_raw);
}

// The real Criteo rows described in ../shared/data/criteo/SOURCES.md (never copied here).
TEST(prep, real_criteo_files_have_no_malformed_lines) {
  const std::filesystem::path src = EMBCACHE_CRITEO_DIR;
  const auto head = src / "criteo_sample_hcyand_train_head10k.tsv";
  const auto random = src / "criteo_sample_cafpereira_random4584.tsv";
  if (!std::filesystem::exists(head) || !std::filesystem::exists(random)) {
    GTEST_SKIP() << "no real Criteo rows in " << src;
  }
  scratch_dir dir;
  auto o = options(dir, {head.string(), random.string()});
  o.rows_per_shard = 4096;
  o.cross = true;
  auto r = prepare_criteo(o);
  EMBCACHE_ASSERT_OK(r);
  const prep_summary& s = r.value();
  EXPECT_EQ(s.malformed, 0u) << (s.reports.empty() ? "" : s.reports[0]);
  EXPECT_EQ(s.lines, 14584u);
  EXPECT_EQ(s.dataset.rows, 14584u);
  EXPECT_NEAR(s.dataset.label_mean * 14584.0, 2182.0 + 1231.0, 1e-6);
  EXPECT_EQ(s.dataset.shards.size(), 4u);
  // Keys of every shard stay within their slot's tag.
  auto d = read_shard(s.dataset.shards[0].shard);
  EMBCACHE_ASSERT_OK(d);
  criteo_sample x;
  for (std::uint64_t i = 0; i < d.value().header.rows; ++i) {
    d.value().get(i, x);
    for (std::size_t j = 0; j < criteo_slot_count; ++j) ASSERT_EQ(criteo_key_tag(x.keys[j]), j);
  }
}

}  // namespace
}  // namespace embcache
