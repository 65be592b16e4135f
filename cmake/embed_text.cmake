# Writes a C++ source defining `std::string_view space::api::<SYMBOL>()` that returns the text
# of INPUT. Run at build time (cmake -P), so editing the input rebuilds the binary.
file(READ "${INPUT}" content)
string(FIND "${content}" ")SPACE_EMBED\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter")
endif()
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT_NAME} by cmake/embed_text.cmake; do not edit.\n"
  "#include <string_view>\n\nnamespace space::api {\n\nstd::string_view ${SYMBOL}() {\n"
  "  static constexpr std::string_view kText = R\"SPACE_EMBED(${content})SPACE_EMBED\";\n"
  "  return kText;\n}\n\n}  // namespace space::api\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
