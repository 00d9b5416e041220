#!/bin/sh
# mpirun_local.sh MPIEXEC NP PROGRAM [ARGS...]: mpirun of NP ranks on this one machine, in a
# container or not. Shared memory (vader) and self transports only; CMA single copy off, as
# containers forbid ptrace; --oversubscribe for more ranks than cores; --allow-run-as-root when
# run as root (CI). Each job has a session folder of its own: OpenMPI 4 keeps every job's in one
# shared folder per user, which a job that ends removes while a job starting beside it (ctest runs
# tests in parallel) creates its own inside, and that one then fails to launch.
set -eu
mpiexec=$1
np=$2
shift 2
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl=self,vader
export OMPI_MCA_rmaps_base_oversubscribe=1
# Under the sanitize preset: OpenMPI never frees some of its own allocations (operation tables,
# plugins it dlopens), which LeakSanitizer would blame on the test. Leak checking is off for the
# ranks only; AddressSanitizer and UBSan stay on (later ASAN_OPTIONS entries win).
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
root=""
if [ "$(id -u)" = 0 ]; then root="--allow-run-as-root"; fi
session=$(mktemp -d "${TMPDIR:-/tmp}/embcache-mpirun.XXXXXX")
trap 'rm -rf "$session"' EXIT
export OMPI_MCA_orte_tmpdir_base="$session"
rc=0
"$mpiexec" -np "$np" --oversubscribe $root "$@" || rc=$?
exit "$rc"
