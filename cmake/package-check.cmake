# Read by cpack (CPACK_PROJECT_CONFIG_FILE, cmake/package.cmake): a .deb
# installs to /usr, so the build must have been configured for /usr.
if(CPACK_GENERATOR STREQUAL "DEB" AND
   NOT CPACK_DLSHARE_CONFIGURED_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR "dlshare: the .deb needs a build configured with "
    "-DCMAKE_INSTALL_PREFIX=/usr (this one: ${CPACK_DLSHARE_CONFIGURED_PREFIX}); "
    "its unit would start ${CPACK_DLSHARE_CONFIGURED_PREFIX}/bin/dlshared")
endif()
