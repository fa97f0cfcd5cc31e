__cc_run() { __cc_restore_flags; eval "$1"; }
# The function that runs a bash session's cells (see bash.sh), alone on the first line of
# a file installed as `bash` in the drivers' directory and sourced from there: bash names
# a cell's errors after this file and counts their lines from the eval's, so they read
# "bash: line N: ..." with N the cell's own line, as `bash -c` gives them.
