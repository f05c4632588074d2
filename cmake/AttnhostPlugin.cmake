# attnhost_add_plugin(NAME SOURCES...) builds a plugin as a MODULE library with hidden symbols,
# the CUDA runtime linked statically, and an RPATH relative to its own folder and to the one above
# (where libattncore is), into the build tree's plugin folder; it is installed beside the other
# built-in plugins.
function(attnhost_add_plugin name)
  add_library(${name} MODULE ${ARGN})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "attnhost_${name}"
    LIBRARY_OUTPUT_DIRECTORY "${ATTNHOST_PLUGIN_OUTPUT_DIR}"
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN:$ORIGIN/.."
    CUDA_RUNTIME_LIBRARY Static)
  target_link_libraries(${name} PRIVATE attnhost::plugin_api)
  # Fail at link time, not at load time, and keep static libraries' symbols inside the plugin.
  target_link_options(${name} PRIVATE "LINKER:--no-undefined" "LINKER:--exclude-libs,ALL")
  install(TARGETS ${name} LIBRARY DESTINATION ${ATTNHOST_PLUGIN_SUBDIR})
endfunction()
