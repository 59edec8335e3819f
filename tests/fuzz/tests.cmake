# The fuzz harnesses in the CTest suite (label `fuzz`): fuzz_build compiles them with clang++
# (skipped with the reason where clang or libFuzzer is missing); each fuzz_<harness> then runs a
# fixed number of executions with a fixed seed from the seed corpus in tests/fuzz/corpus.
set(TRIDENT_FUZZ_DIR ${PROJECT_BINARY_DIR}/fuzz)
set(fuzz_links "")
foreach(lib ${TRIDENT_GEMM_LIBS})
  if(TARGET ${lib})
    list(APPEND fuzz_links $<TARGET_LINKER_FILE:${lib}>)
  else()
    list(APPEND fuzz_links ${lib})
  endif()
endforeach()
# trident_core's host kernels call the OpenMP runtime (common/host_parallel.hpp): link it too
# (src/ found OpenMP in its own directory scope)
find_package(OpenMP COMPONENTS CXX QUIET)
if(OpenMP_CXX_FOUND AND NOT TRIDENT_ENABLE_CUDA)
  list(APPEND fuzz_links ${OpenMP_CXX_LIBRARIES})
endif()
add_test(NAME fuzz_build
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/build_fuzzers.sh ${PROJECT_SOURCE_DIR} ${TRIDENT_FUZZ_DIR}
                 $<TARGET_FILE:trident_core> ${fuzz_links})
set_tests_properties(fuzz_build PROPERTIES LABELS "fuzz" TIMEOUT 900 SKIP_RETURN_CODE 77
                                           PROCESSORS 2)
set(corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus)
# fixed-seed regression runs sized so that the whole suite stays under 30 minutes on 2 cores
# (longer fuzzing: run_fuzzer.sh by hand with more runs)
set(fuzz_runs_deck 2500)
set(fuzz_runs_jsonl 2500)
set(fuzz_runs_tokenizers 3000)  # about 3 ms each: GPT-2, WordPiece and three tokenizer.json models per input
set(fuzz_runs_shard 1500)  # about 10 ms each (an HDF5 file per input)
set(fuzz_runs_checkpoint 1000)  # the same
set(fuzz_seeds_deck ${PROJECT_SOURCE_DIR}/inputs ${corpus}/deck)
foreach(h deck jsonl tokenizers shard checkpoint)
  if(NOT fuzz_seeds_${h})
    set(fuzz_seeds_${h} ${corpus}/${h})
  endif()
  add_test(NAME fuzz_${h}
           COMMAND ${CMAKE_COMMAND} -E env TRIDENT_FUZZ_SAMPLE=${TRIDENT_SAMPLE_DIR}
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzzer.sh ${TRIDENT_FUZZ_DIR} fuzz_${h} ${fuzz_runs_${h}}
                   ${fuzz_seeds_${h}})
  set_tests_properties(fuzz_${h} PROPERTIES LABELS "fuzz" TIMEOUT 900 SKIP_RETURN_CODE 77 DEPENDS fuzz_build)
endforeach()
set_tests_properties(fuzz_tokenizers PROPERTIES FIXTURES_REQUIRED sample_data)
