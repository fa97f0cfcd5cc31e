# The bash driver of a codecage session: one persistent shell. The working directory,
# variables, functions and exported environment survive between calls; each call reports
# its exit status ($?) and the working directory.
#
# Requests arrive on fd 3 as a line "execute ID CODE_BYTES STDIN_BYTES" (STDIN_BYTES is -1
# without stdin) followed by the code and the stdin, raw. Answers go back on fd 3 as one
# JSON object per line. The cell's own output goes to fd 1 and 2. The launcher treats
# everything on fd 3 as untrusted.
#
# The driver owns the streams of a call: each cell runs with its stdin, stdout and stderr
# redirected onto the driver's own copies of the session's (fd 3 and the copies closed
# for it), so whatever
# it does to them (`exec 1>&-`, `exec >file`) ends with the call, as a redirection on a
# function call does. Should a cell close the driver's copies too, "done" asks the
# launcher for a new shell ("restart").
#
# The shell options a cell sets (`set -e`, `set -u`, `set -x`, `set -v`) are its own and
# the next cells': the driver's loop runs without them. A cell that ends the shell (`exit
# 3`, or a failing command under `set -e`) ends the driver: the launcher reports the
# shell's exit status and starts a new one.

# Sets __cc_json to $1 as a JSON string (no subshell: this runs after every call).
__cc_json_string() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    printf -v __cc_json '"%s"' "$s"
}

# Runs a cell in this shell (cd and assignments persist): __cc_run, from the file `bash`
# beside this one (see bash-cell.sh), which first sets the cells' own options again. An
# interrupt returns from it with 130, abandoning the rest of the cell, as a terminal's ^C
# does.
__cc_restore_flags() {
    case $__cc_flags in *e*) set -e ;; esac
    case $__cc_flags in *u*) set -u ;; esac
    case $__cc_flags in *v*) set -v ;; esac
    case $__cc_flags in *x*) set -x ;; esac
}
__cc_home=$PWD
shopt -u sourcepath
cd "${BASH_SOURCE[0]%/*}" && source bash
shopt -s sourcepath
cd "$__cc_home" || exit 70
unset OLDPWD __cc_home
trap 'return 130 2>/dev/null' INT

# Whether fd $1 is open (a builtin redirection: no fork).
__cc_open() {
    { : >&"$1"; } 2>/dev/null || { : <&"$1"; } 2>/dev/null
}

exec {__cc_out}>&1 {__cc_err}>&2
__cc_flags=
__cc_stdin=/tmp/.codecage-stdin-$$
printf '{"ev":"ready"}\n' >&3
while :; do
    if ! IFS=' ' read -r __cc_op __cc_id __cc_len __cc_stdin_len <&3; then
        # A read broken by a signal is retried; end of file means the launcher is gone.
        [ $? -gt 128 ] && continue
        exit 0
    fi
    [ "$__cc_op" = execute ] || continue
    LC_ALL=C IFS= read -r -d '' -N "$__cc_len" __cc_code <&3
    __cc_input=/dev/null
    if [ "$__cc_stdin_len" -ge 0 ] 2>/dev/null; then
        # head reads exactly that many bytes (NUL bytes too, which a shell variable cannot
        # hold).
        head -c "$__cc_stdin_len" <&3 > "$__cc_stdin"
        __cc_input=$__cc_stdin
    fi
    # Closed for the cell (and its children): the channel and the driver's copies.
    __cc_run "$__cc_code" < "$__cc_input" >&"$__cc_out" 2>&"$__cc_err" 3>&- \
        {__cc_out}>&- {__cc_err}>&-
    __cc_status=$?
    __cc_flags=$-
    set +euvx
    rm -f "$__cc_stdin"
    __cc_restart=false
    __cc_open "$__cc_out" && __cc_open "$__cc_err" || __cc_restart=true
    __cc_json_string "$PWD"
    printf '{"ev":"done","id":%s,"status":%d,"cwd":%s,"restart":%s}\n' \
        "$__cc_id" "$__cc_status" "$__cc_json" "$__cc_restart" >&3
done
