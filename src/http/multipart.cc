#include "http/multipart.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace space::http {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A parameter's value in a header like `form-data; name="file"; filename="a.txt"`: quoted
// (backslash escapes a character) or a token. nullopt when the parameter is absent.
std::optional<std::string> headerParam(std::string_view value, std::string_view name) {
  size_t i = value.find(';');
  while (i != std::string_view::npos && i < value.size()) {
    ++i;
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t')) ++i;
    size_t eq = value.find('=', i);
    if (eq == std::string_view::npos) return std::nullopt;
    std::string key = lower(trim(value.substr(i, eq - i)));
    size_t j = eq + 1;
    while (j < value.size() && (value[j] == ' ' || value[j] == '\t')) ++j;
    std::string parsed;
    if (j < value.size() && value[j] == '"') {
      ++j;
      while (j < value.size() && value[j] != '"') {
        if (value[j] == '\\' && j + 1 < value.size()) ++j;
        parsed.push_back(value[j++]);
      }
      if (j < value.size()) ++j;  // the closing quote
      i = value.find(';', j);
    } else {
      size_t end = value.find(';', j);
      parsed = std::string(trim(value.substr(j, end == std::string_view::npos ? std::string_view::npos : end - j)));
      i = end;
    }
    if (key == name) return parsed;
  }
  return std::nullopt;
}

Error malformed(const std::string& what) { return makeError(ErrorCode::kInvalidArgument, "multipart body: " + what); }

}  // namespace

std::optional<std::string> multipartBoundary(std::string_view content_type) {
  size_t semi = content_type.find(';');
  if (lower(trim(content_type.substr(0, semi))) != "multipart/form-data") return std::nullopt;
  auto boundary = headerParam(content_type, "boundary");
  if (!boundary || boundary->empty() || boundary->size() > 70) return std::nullopt;
  for (char ch : *boundary) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) return std::nullopt;
  }
  return boundary;
}

MultipartReader::MultipartReader(std::string boundary, ReadFn read)
    : delimiter_("\r\n--" + boundary), read_(std::move(read)) {
  // The first delimiter may open the body with no CRLF before it: one is assumed.
  buffer_ = "\r\n";
}

Result<bool> MultipartReader::fill() {
  if (eof_) return false;
  if (pos_ > 0 && pos_ >= buffer_.size() / 2) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  char chunk[16 * 1024];
  auto n = read_(chunk, sizeof chunk);
  if (!n.ok()) return n.error();
  if (n.value() == 0) {
    eof_ = true;
    return false;
  }
  buffer_.append(chunk, n.value());
  return true;
}

Status MultipartReader::skipToFirstDelimiter() {
  while (true) {
    size_t at = buffer_.find(delimiter_, pos_);
    if (at != std::string::npos) {
      pos_ = at + delimiter_.size();
      state_ = State::kAfterDelimiter;
      return okStatus();
    }
    if (buffer_.size() - pos_ > kMaxPreamble + delimiter_.size()) return malformed("no boundary in its first 16 KiB");
    auto more = fill();
    if (!more.ok()) return more.error();
    if (!more.value()) return malformed("no boundary");
  }
}

Result<std::optional<MultipartReader::Part>> MultipartReader::readHeaders() {
  // After a delimiter: "--" ends the body; otherwise optional whitespace, CRLF, then headers.
  while (buffer_.size() - pos_ < 2) {
    auto more = fill();
    if (!more.ok()) return more.error();
    if (!more.value()) return malformed("ends after a boundary");
  }
  if (buffer_.compare(pos_, 2, "--") == 0) {
    state_ = State::kDone;
    return std::optional<Part>();
  }
  // The delimiter line ends in optional padding and CRLF; an empty line ends the headers.
  size_t line_end, body_start = std::string::npos, header_end = 0;
  while (true) {
    line_end = buffer_.find("\r\n", pos_);
    if (line_end != std::string::npos) {
      const size_t headers = line_end + 2;
      if (buffer_.compare(headers, 2, "\r\n") == 0) {
        header_end = headers;
        body_start = headers + 2;
      } else if (size_t blank = buffer_.find("\r\n\r\n", headers); blank != std::string::npos) {
        header_end = blank;
        body_start = blank + 4;
      }
      if (body_start != std::string::npos) break;
    }
    if (buffer_.size() - pos_ > kMaxPartHeader) return malformed("a part's headers exceed 16 KiB");
    auto more = fill();
    if (!more.ok()) return more.error();
    if (!more.value()) return malformed("ends inside a part's headers");
  }
  if (trim(std::string_view(buffer_).substr(pos_, line_end - pos_)).size() != 0) {
    return malformed("a boundary line has more after the boundary");
  }
  const size_t end = header_end;
  pos_ = line_end + 2;
  if (++parts_ > kMaxParts) return malformed("more than " + std::to_string(kMaxParts) + " parts");
  std::string_view block(buffer_.data() + pos_, end > pos_ ? end - pos_ : 0);
  Part part;
  bool disposition = false;
  size_t line_start = 0;
  while (line_start <= block.size()) {
    size_t eol = block.find("\r\n", line_start);
    std::string_view line =
        block.substr(line_start, eol == std::string_view::npos ? std::string_view::npos : eol - line_start);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      std::string name = lower(trim(line.substr(0, colon)));
      std::string_view value = trim(line.substr(colon + 1));
      if (name == "content-disposition") {
        if (lower(trim(value.substr(0, value.find(';')))) != "form-data") {
          return malformed("a part's Content-Disposition is not form-data");
        }
        disposition = true;
        part.name = headerParam(value, "name").value_or("");
        part.filename = headerParam(value, "filename");
      } else if (name == "content-type") {
        part.content_type = std::string(value);
      }
    }
    if (eol == std::string_view::npos) break;
    line_start = eol + 2;
  }
  if (!disposition) return malformed("a part has no Content-Disposition");
  pos_ = body_start;
  state_ = State::kPartBody;
  return std::optional<Part>(std::move(part));
}

Result<std::optional<MultipartReader::Part>> MultipartReader::next() {
  char scratch[16 * 1024];
  while (true) {
    switch (state_) {
      case State::kPreamble:
        if (auto st = skipToFirstDelimiter(); !st.ok()) return st.error();
        break;
      case State::kPartBody: {
        auto n = readSome(scratch, sizeof scratch);  // the rest of the current part, dropped
        if (!n.ok()) return n.error();
        break;
      }
      case State::kAfterDelimiter: return readHeaders();
      case State::kPartHeaders: return malformed("internal state");
      case State::kDone: return std::optional<Part>();
    }
  }
}

Result<size_t> MultipartReader::readSome(char* out, size_t max) {
  if (state_ != State::kPartBody || max == 0) return size_t{0};
  while (true) {
    size_t at = buffer_.find(delimiter_, pos_);
    if (at != std::string::npos) {
      if (at == pos_) {
        pos_ += delimiter_.size();
        state_ = State::kAfterDelimiter;
        return size_t{0};
      }
      size_t n = std::min(max, at - pos_);
      std::memcpy(out, buffer_.data() + pos_, n);
      pos_ += n;
      return n;
    }
    // Bytes that cannot be the start of a delimiter may go out now.
    size_t avail = buffer_.size() - pos_;
    if (avail >= delimiter_.size()) {
      size_t n = std::min(max, avail - (delimiter_.size() - 1));
      std::memcpy(out, buffer_.data() + pos_, n);
      pos_ += n;
      return n;
    }
    auto more = fill();
    if (!more.ok()) return more.error();
    if (!more.value()) return malformed("ends inside a part (no closing boundary)");
  }
}

}  // namespace space::http
