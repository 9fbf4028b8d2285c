# Strict warnings on our own targets only; third-party headers come in as SYSTEM includes.
function(moesim_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wno-error=deprecated-declarations)
endfunction()

# Declare one of our libraries: moesim_library(NAME SOURCES ... DEPS ...)
function(moesim_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  moesim_target_warnings(${name})
endfunction()

# Declare a GoogleTest executable: moesim_test(NAME SOURCES ... DEPS ... [LABELS ...])
function(moesim_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE MOESIM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  moesim_target_warnings(${name})
  # gtest_discover_tests flattens PROPERTIES into one list, so "LABELS unit;cli" would lose "cli";
  # one LABELS pair per label survives (ctest then lists every label of the test).
  set(_props LABELS unit)
  foreach(_label IN LISTS ARG_LABELS)
    list(APPEND _props LABELS ${_label})
  endforeach()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${_props})
endfunction()
