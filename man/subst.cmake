cmake_policy(VERSION 3.25)
# cmake -DGEN=dlshared_manopts -DMODE=flags|keys|- -DIN=page.in -DOUT=page
#       -DVERSION=x.y.z -DCONFIG_FILE=/etc/... -P subst.cmake
# Copies IN to OUT, replacing the line "@OPTIONS@" with GEN's output for
# MODE, and @VERSION@ and @CONFIG_FILE@ with their values.
file(READ ${IN} text)
if(NOT MODE STREQUAL "-")
  execute_process(COMMAND ${GEN} ${MODE} OUTPUT_VARIABLE opts
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${GEN} ${MODE} failed: ${rc}")
  endif()
  string(REPLACE "@OPTIONS@\n" "${opts}" text "${text}")
endif()
# "@METRICS@" (dlsharectl(1)): the metric families, from METRICS_GEN.
if(text MATCHES "@METRICS@\n")
  execute_process(COMMAND ${METRICS_GEN} OUTPUT_VARIABLE metrics
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${METRICS_GEN} failed: ${rc}")
  endif()
  string(REPLACE "@METRICS@\n" "${metrics}" text "${text}")
endif()
string(REPLACE "@VERSION@" "${VERSION}" text "${text}")
string(REPLACE "@CONFIG_FILE@" "${CONFIG_FILE}" text "${text}")
file(WRITE ${OUT}.tmp "${text}")
file(RENAME ${OUT}.tmp ${OUT})
