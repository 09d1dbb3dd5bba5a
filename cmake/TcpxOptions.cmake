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
function(tcpx_target_defaults target)
    target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wshadow -Wno-unused-parameter>
        $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<BOOL:${TCPX_P2P_WERROR}>>:-Werror>)
endfunction()
