# The bash driver of a codecage session: one persistent shell. The working directory,
# variables, functions and exported environment survive between calls; each call reports
# its exit status ($?) and the working directory.
#
# Requests arrive on fd 3 as a line "execute ID CODE_BYTES STDIN_BYTES" (STDIN_BYTES is -1
# without stdin) followed by the code and the stdin, raw. Answers go back on fd 3 as one
# JSON object per line. The cell's own output goes to fd 1 and 2. The launcher treats
# everything on fd 3 as untrusted.

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

# Runs a cell in this shell (cd and assignments persist). An interrupt returns from it
# with 130, abandoning the rest of the cell, as a terminal's ^C does.
__cc_run() {
    eval "$1"
}
trap 'return 130 2>/dev/null' INT

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
    if [ "$__cc_stdin_len" -ge 0 ] 2>/dev/null; then
        LC_ALL=C IFS= read -r -d '' -N "$__cc_stdin_len" __cc_input <&3
        printf '%s' "$__cc_input" > "$__cc_stdin"
        __cc_run "$__cc_code" < "$__cc_stdin" 3>&-
        __cc_status=$?
        rm -f "$__cc_stdin"
    else
        __cc_run "$__cc_code" < /dev/null 3>&-
        __cc_status=$?
    fi
    __cc_json_string "$PWD"
    printf '{"ev":"done","id":%s,"status":%d,"cwd":%s}\n' \
        "$__cc_id" "$__cc_status" "$__cc_json" >&3
done
