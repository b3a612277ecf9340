# Included after llama.cpp's project() by scripts/build_llamacpp.sh (CMAKE_PROJECT_INCLUDE), for
# its unity build (CMAKE_UNITY_BUILD=ON: each target's sources compiled a batch at a time, so the
# headers every file includes are parsed once per batch; issue #34 item 6). Two sources of mtmd's
# helper refuse to share a translation unit with mtmd's internals (an #error on
# MTMD_INTERNAL_HEADER): they are compiled on their own. Deferred to the end of the top-level
# directory, where tools/mtmd is known (a tree without mtmd is left as it is).
if(NOT DEFINED E3C_LLAMACPP_UNITY_HOOK)
    set(E3C_LLAMACPP_UNITY_HOOK ON)
    function(e3c_keep_mtmd_helpers_apart)
        if(TARGET mtmd)
            set_source_files_properties(
                "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp"
                "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
                DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd"
                PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        endif()
    endfunction()
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL e3c_keep_mtmd_helpers_apart)
endif()
