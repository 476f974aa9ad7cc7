# Turn files into C sources at build time. Two uses:
#
#   cmake -DINPUT=FILE -DOUTPUT=out.c -DNAME=n -P embed.cmake
#       `const char n[]` (the bytes, then a NUL) and `const size_t n_len`.
#
#   cmake -DDIR=ui -DOUTPUT=out.c -DNAME=n -P embed.cmake
#       every file of DIR (flat: a subfolder is an error; names starting with
#       '.' or ending with '~' are skipped) as one table, sorted by name:
#       `const struct gw_asset n[]` {name, content type, bytes, length, strong
#       ETag from the SHA-256 of the bytes} and `const size_t n_count`
#       (gateway/ui.h). An extension without a known content type is an error.

# The bytes of file as a C initializer list ("0x3c,0x21,...") and their count.
function(embed_bytes file out_bytes out_len)
  file(READ "${file}" hex HEX)
  string(LENGTH "${hex}" hex_len)
  math(EXPR byte_len "${hex_len} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  set(${out_bytes} "${bytes}" PARENT_SCOPE)
  set(${out_len} "${byte_len}" PARENT_SCOPE)
endfunction()

# The Content-Type of a served file, by extension.
function(embed_content_type name out)
  string(REGEX MATCH "[^.]*$" ext "${name}")
  string(TOLOWER "${ext}" ext)
  if(ext STREQUAL "html")
    set(type "text/html; charset=utf-8")
  elseif(ext STREQUAL "css")
    set(type "text/css; charset=utf-8")
  elseif(ext STREQUAL "js")
    set(type "text/javascript; charset=utf-8")
  elseif(ext STREQUAL "svg")
    set(type "image/svg+xml")
  elseif(ext STREQUAL "png")
    set(type "image/png")
  elseif(ext STREQUAL "txt")
    set(type "text/plain; charset=utf-8")
  else()
    message(FATAL_ERROR "embed.cmake: no content type for '${name}': add its extension to embed_content_type")
  endif()
  set(${out} "${type}" PARENT_SCOPE)
endfunction()

if(DEFINED DIR)
  file(GLOB entries RELATIVE "${DIR}" "${DIR}/*")
  list(SORT entries)
  set(arrays "")
  set(rows "")
  set(count 0)
  foreach(name IN LISTS entries)
    if(name MATCHES "^\\." OR name MATCHES "~$")
      continue()
    endif()
    if(IS_DIRECTORY "${DIR}/${name}")
      message(FATAL_ERROR "embed.cmake: ${DIR}/${name} is a folder; ${DIR} must be flat (served as /ui/{asset})")
    endif()
    if(NOT name MATCHES "^[A-Za-z0-9][A-Za-z0-9._-]*$")
      message(FATAL_ERROR "embed.cmake: '${name}': asset names are letters, digits, '.', '_' and '-'")
    endif()
    embed_bytes("${DIR}/${name}" bytes len)
    embed_content_type("${name}" type)
    file(SHA256 "${DIR}/${name}" sha)
    string(SUBSTRING "${sha}" 0 32 tag)
    string(APPEND arrays "static const unsigned char asset_${count}[] = {${bytes} 0};\n")
    string(APPEND rows "    {\"${name}\", \"${type}\", asset_${count}, ${len}, \"\\\"${tag}\\\"\"},\n")
    math(EXPR count "${count} + 1")
  endforeach()
  if(count EQUAL 0)
    message(FATAL_ERROR "embed.cmake: no file in ${DIR}")
  endif()
  file(WRITE "${OUTPUT}" "/* generated from ${DIR} by cmake/embed.cmake */\n#include \"ui.h\"\n\n${arrays}\nconst struct gw_asset ${NAME}[] = {\n${rows}};\nconst size_t ${NAME}_count = ${count};\n")
else()
  embed_bytes("${INPUT}" bytes byte_len)
  file(WRITE "${OUTPUT}" "/* generated from ${INPUT} by cmake/embed.cmake */\n#include <stddef.h>\nconst char ${NAME}[] = {${bytes} 0};\nconst size_t ${NAME}_len = ${byte_len};\n")
endif()
