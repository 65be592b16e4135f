#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "http/gunzip.h"

namespace space::http {
namespace {

std::string gzip(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

GunzipReader::ReadFn source(const std::string& body, size_t step) {
  auto pos = std::make_shared<size_t>(0);
  return [body, step, pos](char* out, size_t max) -> Result<size_t> {
    size_t n = std::min({step, max, body.size() - *pos});
    std::memcpy(out, body.data() + *pos, n);
    *pos += n;
    return n;
  };
}

Result<std::string> gunzipAll(const std::string& body, size_t step, size_t out_step) {
  GunzipReader reader(source(body, step));
  std::string out;
  std::string buf(out_step, '\0');
  while (true) {
    auto n = reader.readSome(buf.data(), buf.size());
    if (!n.ok()) return n.error();
    if (n.value() == 0) return out;
    out.append(buf.data(), n.value());
  }
}

TEST(Gunzip, DecompressesWhateverTheReadSizes) {
  std::string data;
  for (int i = 0; i < 20000; ++i) data += "line " + std::to_string(i) + "\n";
  const std::string packed = gzip(data);
  ASSERT_LT(packed.size(), data.size());
  for (auto [in, out] : {std::pair<size_t, size_t>{1, 7}, {13, 1}, {4096, 65536}, {1 << 20, 3}}) {
    auto got = gunzipAll(packed, in, out);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(got.value(), data);
  }
  EXPECT_EQ(gunzipAll(gzip(""), 5, 5).value(), "");
  // Members one after another (what `cat a.gz b.gz` makes) read as one body.
  EXPECT_EQ(gunzipAll(gzip("first ") + gzip("second"), 3, 5).value(), "first second");
}

TEST(Gunzip, BadStreamsAreRefused) {
  const std::string packed = gzip("some content that is long enough to matter");
  EXPECT_FALSE(gunzipAll("plain text, not gzip", 4, 64).ok());
  EXPECT_FALSE(gunzipAll(packed.substr(0, packed.size() - 5), 4, 64).ok());  // truncated
  EXPECT_FALSE(gunzipAll(packed + "trailing", 4, 64).ok());
  std::string flipped = packed;
  flipped[packed.size() - 6] ^= 0x55;  // the CRC no longer matches
  EXPECT_FALSE(gunzipAll(flipped, 4, 64).ok());
  EXPECT_FALSE(gunzipAll("", 4, 64).ok());
}

}  // namespace
}  // namespace space::http
