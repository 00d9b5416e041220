# Tests that an outside CMake project builds against embcache's install tree and runs.
#
# The tree is installed once per build folder (test `install_tree`, fixture `embcache_installed`);
# each outside project then gets <name>_configure, <name>_build and <name>_run, in that order.
set(EMBCACHE_TEST_PREFIX ${CMAKE_BINARY_DIR}/install-test/prefix)
add_test(NAME install_tree
         COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --prefix ${EMBCACHE_TEST_PREFIX})
set_tests_properties(install_tree PROPERTIES FIXTURES_SETUP embcache_installed LABELS integration)

# embcache_add_outside_project_test(<name> SOURCE_DIR <dir> EXECUTABLE <target> LABEL <label>
#                                   PASS_REGEX <regex> [CONFIGURE_ARGS <arg>...]
#                                   [RUN_ARGS <arg>...])
function(embcache_add_outside_project_test name)
  cmake_parse_arguments(arg "" "SOURCE_DIR;EXECUTABLE;LABEL;PASS_REGEX" "CONFIGURE_ARGS;RUN_ARGS"
                        ${ARGN})
  set(build ${CMAKE_BINARY_DIR}/install-test/${name})
  add_test(NAME ${name}_configure
           COMMAND ${CMAKE_COMMAND} -S ${arg_SOURCE_DIR} -B ${build}
                   -DCMAKE_PREFIX_PATH=${EMBCACHE_TEST_PREFIX} -DCMAKE_BUILD_TYPE=Release
                   -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                   # the same instrumentation as this build (the sanitizer preset needs it)
                   "-DCMAKE_CXX_FLAGS=${CMAKE_CXX_FLAGS}"
                   "-DCMAKE_EXE_LINKER_FLAGS=${CMAKE_EXE_LINKER_FLAGS}" ${arg_CONFIGURE_ARGS})
  add_test(NAME ${name}_build COMMAND ${CMAKE_COMMAND} --build ${build})
  add_test(NAME ${name}_run COMMAND ${build}/${arg_EXECUTABLE} ${arg_RUN_ARGS})
  set_tests_properties(${name}_configure PROPERTIES FIXTURES_REQUIRED embcache_installed
                       FIXTURES_SETUP ${name}_configured LABELS ${arg_LABEL})
  set_tests_properties(${name}_build PROPERTIES FIXTURES_REQUIRED ${name}_configured
                       FIXTURES_SETUP ${name}_built LABELS ${arg_LABEL})
  set_tests_properties(${name}_run PROPERTIES FIXTURES_REQUIRED ${name}_built
                       LABELS ${arg_LABEL} PASS_REGULAR_EXPRESSION "${arg_PASS_REGEX}")
endfunction()
