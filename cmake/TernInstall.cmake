# `cmake --install`: the tern binary, the systemd units and sysusers file, example flagfiles and
# deploy files, the docs, and the libraries a C++ program builds on (wire API, codecs, chunking,
# the gRPC edge, model layouts, the C++ client library) with their headers and a CMake package config, so that an outside
# project can `find_package(tern)` and link `tern::kernels` etc. (docs/deploy.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TERN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tern)
set(TERN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/tern)

install(TARGETS tern RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET tern_delay_line)  # links with delay (deploy/slow-link.sh)
  install(TARGETS tern_delay_line RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Daemons as services. Units go under the prefix (/usr/lib/systemd/system for prefix /usr), their
# ExecStart naming the tern installed with them: the prefix is read when installing, so
# `cmake --install build --prefix P` gives P/bin/tern (DESTDIR, a staging root, is not part of it).
foreach(unit tern-worker tern-server tern-scheduler)
  install(CODE "
    file(READ \"${PROJECT_SOURCE_DIR}/deploy/systemd/${unit}.service\" text)
    string(REPLACE \"ExecStart=/usr/bin/tern \"
           \"ExecStart=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/tern \" text \"\${text}\")
    set(out \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/${unit}.service\")
    message(STATUS \"Installing: \${out}\")
    file(WRITE \"\${out}\" \"\${text}\")")
endforeach()
install(FILES deploy/systemd/tern.sysusers DESTINATION lib/sysusers.d
        RENAME tern.conf)
install(FILES deploy/etc/worker.flags deploy/etc/server.flags deploy/etc/scheduler.flags
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tern/examples)
install(DIRECTORY deploy/ DESTINATION ${CMAKE_INSTALL_DATADIR}/tern/deploy
        PATTERN "*.service" EXCLUDE PATTERN "debian" EXCLUDE)
install(FILES docs/deploy.md docs/architecture.md docs/wire-format.md docs/cpp-client.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

# Libraries and headers. The headers keep the tree's paths ("kernels/registry.h",
# "tern/v1/tensor.pb.h") under include/tern.
set(TERN_EXPORTED_LIBS tern_proto tern_common tern_kernels tern_rpc tern_model tern_federated
    tern_client)
foreach(lib ${TERN_EXPORTED_LIBS})
  target_include_directories(${lib} INTERFACE $<INSTALL_INTERFACE:${TERN_INSTALL_INCLUDEDIR}>)
endforeach()
set_target_properties(tern_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(tern_common PROPERTIES EXPORT_NAME common)
set_target_properties(tern_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(tern_rpc PROPERTIES EXPORT_NAME rpc)
set_target_properties(tern_model PROPERTIES EXPORT_NAME model)
set_target_properties(tern_federated PROPERTIES EXPORT_NAME federated)
set_target_properties(tern_client PROPERTIES EXPORT_NAME client)
install(TARGETS ${TERN_EXPORTED_LIBS} EXPORT ternTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(dir common kernels core/rpc core/model core/federated)
  install(DIRECTORY ${dir}/ DESTINATION ${TERN_INSTALL_INCLUDEDIR}/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "cuda" EXCLUDE)
endforeach()
install(FILES clients/cpp/aggregator_client.h clients/cpp/trainer_link.h
        DESTINATION ${TERN_INSTALL_INCLUDEDIR}/clients/cpp)
# The C API for clients in other languages (the Python package loads it beside `tern`).
install(TARGETS tern_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES clients/c/tern_c.h DESTINATION ${TERN_INSTALL_INCLUDEDIR}/clients/c)
# A worker inside a trainer's process (tern.embedded loads it beside `tern`, as libtern_c.so).
install(TARGETS tern_embedded LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES clients/embedded/tern_embedded.h DESTINATION ${TERN_INSTALL_INCLUDEDIR}/clients/embedded)
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/gen/ DESTINATION ${TERN_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.pb.h" PATTERN "*_mock.grpc.pb.h" EXCLUDE)
install(EXPORT ternTargets NAMESPACE tern:: DESTINATION ${TERN_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/tern-config.cmake.in
                              ${PROJECT_BINARY_DIR}/tern-config.cmake
                              INSTALL_DESTINATION ${TERN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tern-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tern-config.cmake ${PROJECT_BINARY_DIR}/tern-config-version.cmake
        DESTINATION ${TERN_INSTALL_CMAKEDIR})

# A Debian package of the same tree: cpack -G DEB in the build folder.
set(CPACK_PACKAGE_NAME tern)
set(CPACK_PACKAGE_CONTACT "tern developers <tern@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "training over slow networks: gossip workers, aggregator, scheduler")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# The daemons' user, /etc/tern, systemd told about the units (deploy/debian/).
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/prerm ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openssl")  # tern certs
include(CPack)
