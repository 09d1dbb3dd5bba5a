# Compiler settings shared by every target of the project.

# Sanitizers apply to everything built here, tests included, so that what is tested is what ran.
if(TCPX_P2P_SANITIZE)
    string(REPLACE "," ";" _tcpx_sanitizers "${TCPX_P2P_SANITIZE}")
    foreach(_s IN LISTS _tcpx_sanitizers)
        if(NOT _s MATCHES "^(address|undefined|thread|leak)$")
            message(FATAL_ERROR "TCPX_P2P_SANITIZE: unknown sanitizer '${_s}'")
        endif()
    endforeach()
    # C and C++ only: nvcc does not take these (device code is not instrumented anyway).
    add_compile_options(
        "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${TCPX_P2P_SANITIZE};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
    add_link_options(-fsanitize=${TCPX_P2P_SANITIZE})
endif()

# tcpx_target_defaults(<target>): warnings (errors with TCPX_P2P_WERROR) for our own code.
# GCC 12 at -O3 (a Release build) warns -Wrestrict inside libstdc++ for `"x" + std::string`
# (GCC bug 105651, fixed in 13): with -Werror, such a build failed in a dozen files. That one
# stays a warning there.
set(TCPX_P2P_GCC12_RESTRICT OFF)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    set(TCPX_P2P_GCC12_RESTRICT ON)
endif()
function(tcpx_target_defaults target)
    target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wshadow -Wno-unused-parameter>
        $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<BOOL:${TCPX_P2P_WERROR}>>:-Werror>
        $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${TCPX_P2P_WERROR}>,$<BOOL:${TCPX_P2P_GCC12_RESTRICT}>>:-Wno-error=restrict>)
endfunction()
