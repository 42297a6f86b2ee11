# Shared compile settings and the test helper (leveldb's leveldb_test(), abseil's absl_cc_test).

set(TERN_WARNING_FLAGS -Wall -Wextra -Wnon-virtual-dtor -Wno-unused-parameter)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # Clang checks the ABSL_GUARDED_BY annotations.
  list(APPEND TERN_WARNING_FLAGS -Wthread-safety -Wshadow-uncaptured-local)
else()
  list(APPEND TERN_WARNING_FLAGS -Wshadow=local)
endif()

# Applies warnings and sanitizers to one of tern's own targets (not generated code).
function(tern_target_settings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TERN_WARNING_FLAGS}>)
  if(TERN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

if(TERN_SANITIZE)
  # Applied globally so that every object, generated code included, agrees on the ABI.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${TERN_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${TERN_SANITIZE})
endif()

# tern_cc_test(NAME name SRCS a.cc ... DEPS lib ... [TIMEOUT seconds a test, default 300]
#              [COST n: ctest starts tests of higher cost first; default 0]
#              [WHOLE: one ctest test runs the whole binary, for many tests of milliseconds
#               each, where a process per test costs more than the tests (0.2 s each under
#               ASan); TIMEOUT is then the binary's])
function(tern_cc_test)
  cmake_parse_arguments(T "WHOLE" "NAME;TIMEOUT;COST" "SRCS;DEPS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_COST)
    set(T_COST 0)
  endif()
  if(NOT TERN_BUILD_TESTS)
    return()
  endif()
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  tern_target_settings(${T_NAME})
  if(T_WHOLE)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} COST ${T_COST})
  else()
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60
                         PROPERTIES TIMEOUT ${T_TIMEOUT} COST ${T_COST})
  endif()
endfunction()
