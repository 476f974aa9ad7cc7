# Turn INPUT into a C source defining `const char NAME[]` and `NAME_len`.
# Used as: cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR byte_len "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}" "/* generated from ${INPUT} by cmake/embed.cmake */\n#include <stddef.h>\nconst char ${NAME}[] = {${bytes} 0};\nconst size_t ${NAME}_len = ${byte_len};\n")
