# Included after llama.cpp's project() by scripts/build_llamacpp.sh (CMAKE_PROJECT_INCLUDE), in
# the unity build and in the file-by-file fallback alike (issue #34 item 6: the build is a sixth of
# what .ci/run computes). Both hooks are deferred to the end of the top-level directory, where the
# targets of the subdirectories are known; a tree without one of them is left as it is.
#
# 1. The unity build (CMAKE_UNITY_BUILD=ON: each target's sources compiled a batch at a time, so
#    the headers every file includes are parsed once per batch): two sources of mtmd's helper
#    refuse to share a translation unit with mtmd's internals (an #error on
#    MTMD_INTERNAL_HEADER), so they are compiled on their own. Without unity the property is inert.
# 2. The serving plumbing at -O0: llama-server's HTTP server (cpp-httplib), its request handling
#    (server-context, llama-server-impl), the multimodal library it links (mtmd) and common (the
#    speculative loop, sampling, argument parsing) compiled without optimisation, appended after
#    Release's -O3 so that it wins. ggml and libllama, where a decoding step computes, stay -O3.
#    Measured on the 2-core machine (2026-12-07, -j2, a vLLM suite run beside it): 363 s of CPU
#    against 495 s for the whole unity build, the optimiser's time in those targets; the llama.cpp
#    suite on golden/tiny-qwen3moe gave the same verdicts (31 passed, 25 skipped, 21 xfailed) in
#    64 s against 61 s with the GGUFs converted, i.e. no cost a run can see on the tiny bundles.
if(CMAKE_VERSION VERSION_LESS 3.19)
    return()  # no cmake_language(DEFER): built as llama.cpp's own files say (file by file, -O3)
endif()
if(NOT DEFINED E3C_LLAMACPP_BUILD_HOOK)
    set(E3C_LLAMACPP_BUILD_HOOK ON)
    function(e3c_llamacpp_build_hook)
        if(TARGET mtmd)
            set_source_files_properties(
                "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp"
                "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
                DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd"
                PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        endif()
        foreach(plumbing server-context llama-server-impl llama-server cpp-httplib mtmd llama-common)
            if(TARGET ${plumbing})
                target_compile_options(${plumbing} PRIVATE -O0)
            endif()
        endforeach()
    endfunction()
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL e3c_llamacpp_build_hook)
endif()
