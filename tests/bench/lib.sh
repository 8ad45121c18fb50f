# lib.sh - helpers shared by the benchmark scripts (sourced, not run).
#
# BENCH_PYTHON is the interpreter that has Debian's NumPy: /usr/bin/python3 unless set, because a
# python3 earlier on PATH (pyenv, a virtualenv) does not see Debian's python3-numpy.

BENCH_PYTHON=${BENCH_PYTHON:-/usr/bin/python3}
BENCH_BLAS_THREADS=${BENCH_BLAS_THREADS:-1}
export BENCH_PYTHON BENCH_BLAS_THREADS

# bench_need_debs PKG...: installs the Debian packages among PKG that are missing, as root or
# through sudo, the way the Makefile's `deps` target does. Fails when it cannot.
bench_need_debs() {
    local missing="" p sudo=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    echo "bench: installing Debian packages:$missing"
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
}
