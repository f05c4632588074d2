# A third party's view: install attnhost (without the examples), build the example plugins out of
# tree against the installed package only — naive_attention on the bare C ABI, striped on
# libattncore — drop one into the installed plugin folder, then list, run and check them with the
# installed binary; and run a shipped preset that names a file, from another folder.
set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --component Unspecified)
if(EXISTS "${prefix}/${PLUGIN_SUBDIR}/libnaive_attention.so")
  message(FATAL_ERROR "the host's install must not contain the example")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/naive_attention -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
file(COPY ${WORK_DIR}/build/libnaive_attention.so DESTINATION ${prefix}/${PLUGIN_SUBDIR})

run(${prefix}/bin/attnhost list plugins -v)
if(NOT out MATCHES "naive_attention 1.0.0" OR NOT out MATCHES "param cpu_accumulate")
  message(FATAL_ERROR "the dropped-in plugin is not listed:\n${out}")
endif()
run(${prefix}/bin/attnhost compare naive_attention --config tiny --seqlen 128 --batch 1 --world-sizes 1,2
    --timing-method simple --device cpu)
if(NOT out MATCHES "naive_attention +[0-9.]+ ms")
  message(FATAL_ERROR "the dropped-in plugin did not run:\n${out}")
endif()
# The README's recipe: a build with no build type is Release by the package's default, and the
# copy named with --plugin is the one that runs, over the installed copy of the same name;
# results.json says which library ran and how it was compiled.
# (Without its CUDA file: what is checked here is the build type and which copy runs.)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/naive_attention -B ${WORK_DIR}/build-default -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DATTNHOST_HAVE_CUDA=OFF)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-default)
set(mine "${WORK_DIR}/build-default/libnaive_attention.so")
execute_process(COMMAND ${prefix}/bin/attnhost compare naive_attention --config tiny --seqlen 128 --batch 1
                        --world-sizes 1 --timing-method simple --device cpu --plugin ${mine}
                        --out ${WORK_DIR}/recipe --format json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err MATCHES "duplicates the one loaded from [^ ]*build-default/libnaive_attention.so \\(--plugin\\), which is kept")
  message(FATAL_ERROR "the recipe's --plugin build was not the one kept (${rc}):\n${out}\n${err}")
endif()
file(READ ${WORK_DIR}/recipe/results.json results)
string(JSON file GET "${results}" environment plugin_files naive_attention file)
string(JSON build GET "${results}" environment plugin_files naive_attention build)
if(NOT file STREQUAL mine OR NOT build STREQUAL "Release, optimized")
  message(FATAL_ERROR "results.json records naive_attention as '${file}', built '${build}'")
endif()
# The second route: a context-parallel schedule in one file on the installed libattncore
# (attnhost::attncore), loaded with --plugin and checked at world sizes 1 to 4.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/striped -B ${WORK_DIR}/striped -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/striped)
run(${prefix}/bin/attnhost verify striped --plugin ${WORK_DIR}/striped/libstriped.so --device cpu
    --world-sizes 1,2,3,4 --quiet)
if(NOT out MATCHES "striped/small +4 +PASSED" OR out MATCHES "FAILED")
  message(FATAL_ERROR "the striped example did not verify:\n${out}")
endif()
# Files the shipped configs name are found from another working directory: the explicit block mask
# of the bs_explicit preset lies beside the installed presets.
file(MAKE_DIRECTORY ${WORK_DIR}/elsewhere)
execute_process(COMMAND ${prefix}/bin/attnhost compare blocksparse --config bs_explicit --world-sizes 1,2
                        --timing-method simple --device cpu
                WORKING_DIRECTORY ${WORK_DIR}/elsewhere RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "blocksparse +[0-9.]+ ms")
  message(FATAL_ERROR "the installed bs_explicit preset did not run from another folder (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${prefix}/bin/attnhost verify blocksparse --quiet
                WORKING_DIRECTORY ${WORK_DIR}/elsewhere RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "blocksparse/bs_explicit +4 +PASSED")
  message(FATAL_ERROR "the installed verify blocksparse failed from another folder (${rc}):\n${out}\n${err}")
endif()
message(STATUS "out-of-tree plugins: built against ${prefix}, listed, run and checked; the installed configs' mask found")
