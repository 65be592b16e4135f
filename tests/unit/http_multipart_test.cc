#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "http/multipart.h"

namespace space::http {
namespace {

// A body handed out `step` bytes at a time, so every split point of the boundary is crossed.
MultipartReader::ReadFn source(const std::string& body, size_t step) {
  auto pos = std::make_shared<size_t>(0);
  return [body, step, pos](char* out, size_t max) -> Result<size_t> {
    size_t n = std::min({step, max, body.size() - *pos});
    std::memcpy(out, body.data() + *pos, n);
    *pos += n;
    return n;
  };
}

struct ReadPart {
  MultipartReader::Part part;
  std::string content;
};

Result<std::vector<ReadPart>> readAll(const std::string& body, size_t step) {
  MultipartReader reader("XyZ", source(body, step));
  std::vector<ReadPart> parts;
  while (true) {
    auto next = reader.next();
    if (!next.ok()) return next.error();
    if (!next.value()) return parts;
    ReadPart p{*next.value(), ""};
    char buf[7];
    while (true) {
      auto n = reader.readSome(buf, sizeof buf);
      if (!n.ok()) return n.error();
      if (n.value() == 0) break;
      p.content.append(buf, n.value());
    }
    parts.push_back(std::move(p));
  }
}

TEST(Multipart, BoundaryComesFromTheContentType) {
  EXPECT_EQ(multipartBoundary("multipart/form-data; boundary=abc").value(), "abc");
  EXPECT_EQ(multipartBoundary("Multipart/Form-Data; charset=x; boundary=\"a b\"").value(), "a b");
  EXPECT_FALSE(multipartBoundary("application/octet-stream; boundary=abc"));
  EXPECT_FALSE(multipartBoundary("multipart/form-data"));
  EXPECT_FALSE(multipartBoundary("multipart/form-data; boundary=" + std::string(71, 'a')));
}

TEST(Multipart, PartsAndTheirContentArriveWhateverTheSplit) {
  const std::string file = "line one --XyZ is not a delimiter without CRLF before it\r\n\r\n--Xy";
  const std::string body =
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/x/1.txt\"\r\n"
      "Content-Type: text/plain\r\n\r\n" +
      file +
      "\r\n--XyZ\r\ncontent-disposition: form-data; name=file\r\n\r\nsecond"
      "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"empty\"; filename=\"e\"\r\n\r\n"
      "\r\n--XyZ--\r\nepilogue";
  for (size_t step : {1, 2, 3, 5, 8, 64, 100000}) {
    auto parts = readAll(body, step);
    ASSERT_TRUE(parts.ok()) << step << ": " << parts.error().message;
    ASSERT_EQ(parts->size(), 3u) << step;
    EXPECT_EQ((*parts)[0].part.name, "file");
    EXPECT_EQ((*parts)[0].part.filename.value_or(""), "/x/1.txt");
    EXPECT_EQ((*parts)[0].part.content_type, "text/plain");
    EXPECT_EQ((*parts)[0].content, file) << step;
    EXPECT_EQ((*parts)[1].part.name, "file");
    EXPECT_FALSE((*parts)[1].part.filename);
    EXPECT_EQ((*parts)[1].content, "second");
    EXPECT_EQ((*parts)[2].content, "");
  }
}

TEST(Multipart, APreambleIsSkippedAndAnUnreadPartTooByNext) {
  const std::string body =
      "preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nskipped"
      "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\n\r\nkept\r\n--XyZ--";
  MultipartReader reader("XyZ", source(body, 4));
  auto first = reader.next();
  ASSERT_TRUE(first.ok() && first.value());
  EXPECT_EQ((*first.value()).name, "a");
  auto second = reader.next();
  ASSERT_TRUE(second.ok() && second.value());
  EXPECT_EQ((*second.value()).name, "b");
  std::string content;
  char buf[16];
  while (true) {
    auto n = reader.readSome(buf, sizeof buf);
    ASSERT_TRUE(n.ok());
    if (n.value() == 0) break;
    content.append(buf, n.value());
  }
  EXPECT_EQ(content, "kept");
  auto end = reader.next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end.value());
}

TEST(Multipart, MalformedBodiesAreRefusedWithAReason) {
  auto refused = [](const std::string& body) {
    auto parts = readAll(body, 3);
    return parts.ok() ? std::string("accepted") : parts.error().message;
  };
  EXPECT_NE(refused("no boundary at all").find("no boundary"), std::string::npos);
  EXPECT_NE(refused("--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nnever closed").find("closing"),
            std::string::npos);
  EXPECT_NE(refused("--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--").find("Content-Disposition"),
            std::string::npos);
  EXPECT_NE(refused("--XyZ\r\nContent-Disposition: form-data; name=a\r\n" + std::string(20000, 'h')).find("16 KiB"),
            std::string::npos);
  EXPECT_NE(refused(std::string(20000, 'p')).find("16 KiB"), std::string::npos);
  std::string many;
  for (int i = 0; i < 1001; ++i) many += "--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n";
  EXPECT_NE(refused(many + "--XyZ--").find("1000 parts"), std::string::npos);
}

}  // namespace
}  // namespace space::http
